"""Summarise an Nsight Compute per-instruction CSV (`ncu -i rep --page source --csv --print-source sass`,
as tools/gpu_profile.sh writes it; a .gz is read as such): warp-stall reasons over the whole kernel,
the instructions with the most stall samples and their two main reasons, then the samples spent waiting
on each mbarrier (the branch after a SYNCS.PHASECHK try-wait, grouped by the barrier's shared-memory
address: which full / empty barrier the warps wait on) and per instruction class. With --rank TEXT, the
instructions are ranked instead by the first per-instruction metric column whose name contains every
word of TEXT (case aside; e.g. "wavefronts shared", where the report has such a column: names vary with
the Nsight Compute version), after a list of the columns whose names contain its first word, which shows
what the report has. With --wide, the samples of the wide kernel's score warpgroup (sm90/consumer.cuh,
ScoreWarpgroup::run) split by the stage of its tile loop, found by landmark instructions (its wait for K,
the S wgmma and their wait, the publication's BAR.ARV, its P V and their wait): per stage the samples, their
main stall reasons and the instructions, then the stage "softmax + publish"'s hottest instructions.

    python tools/ncu_hot.py decode_sass.csv[.gz] [N] [--rank TEXT | --wide]
"""
import collections
import csv
import gzip
import re
import sys


def rank(hdr, data, col, text, top):
    words = text.lower().split()
    print("columns with", repr(words[0]) + ":", "; ".join(n for n in hdr if words[0] in n.lower()))
    name = next((n for n in hdr if all(w in n.lower() for w in words)), None)
    if name is None:
        print(f"no column contains {text!r}")
        return
    val = lambda r: float((r[col[name]] or "0").replace(",", ""))  # noqa: E731
    total = sum(val(r) for r in data) or 1.0
    print(f"{name}: {total:.0f} in all")
    for i, r in sorted(enumerate(data), key=lambda x: -val(x[1]))[:top]:
        print(f"{i:5d} {100 * val(r) / total:5.1f}%  {val(r):>12.0f}  exec {r[col['Instructions Executed']]:>10}  "
              f"{r[col['Source']].strip()[:70]}")


def stall_columns(hdr):
    """The report's per-reason stall sample columns (all samples, not the not-issued ones)."""
    return [n for n in hdr if n.startswith("stall_") and "Not Issued" not in n]


def wide(hdr, data, col, top):
    """The wide kernel's score warpgroup: stall samples per stage of its tile loop (see the docstring)."""
    src = [r[col["Source"]].strip() for r in data]
    reasons = stall_columns(hdr)
    num = lambda i, c: int(data[i][col[c]] or 0)  # noqa: E731
    samples = "Warp Stall Sampling (All Samples)"
    total = sum(num(i, samples) for i in range(len(data))) or 1
    after = lambda i, text: next(j for j in range(i, len(src)) if text in src[j])  # noqa: E731
    s0 = after(0, "HGMMA.64x64x16")
    tw = max(i for i in range(s0) if "TRYWAIT" in src[i])  # the wait for K before the loop's first S
    head = max(i for i in range(tw) if re.search(r"\bBRA\b|BAR\.|SYNCS", src[i])) + 1  # after the instruction before
    s_wait = after(max(i for i, t in enumerate(src) if "HGMMA.64x64x16" in t), "WARPGROUP.DEPBAR")
    pub = after(s_wait, "BAR.ARV")
    pv_wait = after(after(pub, "HGMMA.64x128x16"), "WARPGROUP.DEPBAR")
    back = after(pv_wait, "BRA")
    stages = [("wait for K", head, s0), ("S issue + wait", s0, s_wait + 1), ("softmax + publish", s_wait + 1, pub + 1),
              ("its P V issue + wait", pub + 1, pv_wait + 1), ("release + loop", pv_wait + 1, back + 1)]
    print(f"{total} stall samples in the kernel; the score warpgroup's tile loop, instructions {head}..{back}:")
    for name, a, b in stages:
        n = sum(num(i, samples) for i in range(a, b))
        why = collections.Counter({r[6:]: sum(num(i, r) for i in range(a, b)) for r in reasons}).most_common(3)
        print(f"  {name:<22} {100 * n / total:5.1f}%  {b - a:4d} instructions  " + ", ".join(f"{k} {v}" for k, v in why))
    a, b = stages[2][1], stages[2][2]
    print("softmax + publish, hottest:")
    for i in sorted(range(a, b), key=lambda i: -num(i, samples))[:top]:
        why = sorted(((num(i, r), r[6:]) for r in reasons), reverse=True)[0]
        print(f"  {i - a:4d} {num(i, samples):7d}  {src[i][:58]:<58} {why[1]}:{why[0]}")


def main():
    args = sys.argv[1:]
    by = None
    wide_loop = "--wide" in args
    if wide_loop:
        args.remove("--wide")
    if "--rank" in args:
        k = args.index("--rank")
        by = args[k + 1]
        del args[k:k + 2]
    path, top = args[0], int(args[1]) if len(args) > 1 else 30
    with (gzip.open(path, "rt", newline="") if path.endswith(".gz") else open(path, newline="")) as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    hdr, data = rows[head], rows[head + 1:]
    col = {n: i for i, n in enumerate(hdr)}
    if by:
        rank(hdr, data, col, by, top)
        return
    if wide_loop:
        wide(hdr, data, col, top)
        return
    samples = col["Warp Stall Sampling (All Samples)"]
    reasons = stall_columns(hdr)
    num = lambda r, c: int(r[col[c]] or 0) if isinstance(c, str) else int(r[c] or 0)  # noqa: E731
    total = sum(num(r, samples) for r in data) or 1
    print(f"{total} stall samples over {len(data)} instructions")
    for name, v in sorted(((n, sum(num(r, n) for r in data)) for n in reasons), key=lambda x: -x[1])[:10]:
        print(f"  {name[6:]:<20} {100 * v / total:5.1f}%")
    for i, r in sorted(enumerate(data), key=lambda x: -num(x[1], samples))[:top]:
        why = sorted(((num(r, n), n[6:]) for n in reasons), reverse=True)[:2]
        print(f"{i:5d} {100 * num(r, samples) / total:5.1f}%  exec {r[col['Instructions Executed']]:>10}  "
              f"{r[col['Source']].strip()[:58]:<58} {why[0][1]}:{why[0][0]} {why[1][1]}:{why[1][0]}")
    waits, kinds, prev = collections.Counter(), collections.Counter(), ""
    for r in data:
        src = r[col["Source"]].strip()
        op = re.sub(r"^@!?U?P\w+\s+", "", src).split()[0] if src else ""
        if op == "BRA" and "TRYWAIT" in prev:
            m = re.search(r"\[([^\]]+)\]", prev)
            waits[m.group(1) if m else "?"] += num(r, samples)
        kinds[op.split(".")[0]] += num(r, samples)
        if src:
            prev = src
    print("mbarrier waits (samples on the branch after the try-wait, by barrier address):")
    for k, v in waits.most_common(12):
        print(f"  {k:<24} {100 * v / total:5.1f}%")
    print("by instruction class:", ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in kinds.most_common(14)))


if __name__ == "__main__":
    main()
