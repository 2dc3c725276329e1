"""Summarise an Nsight Compute per-instruction CSV (`ncu -i rep --page source --csv --print-source sass`,
as tools/gpu_profile.sh writes it; a .gz is read as such): warp-stall reasons over the whole kernel,
the instructions with the most stall samples and their two main reasons, then the samples spent waiting
on each mbarrier (the branch after a SYNCS.PHASECHK try-wait, grouped by the barrier's shared-memory
address: which full / empty barrier the warps wait on) and per instruction class. With --rank TEXT, the
instructions are ranked instead by the first per-instruction metric column whose name contains every
word of TEXT (case aside; e.g. "wavefronts shared", where the report has such a column: names vary with
the Nsight Compute version), after a list of the columns whose names contain its first word, which shows
what the report has.

    python tools/ncu_hot.py decode_sass.csv[.gz] [N] [--rank TEXT]
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


def main():
    args = sys.argv[1:]
    by = None
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
    samples = col["Warp Stall Sampling (All Samples)"]
    reasons = [n for n in hdr if n.startswith("stall_") and "Not Issued" not in n]
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
