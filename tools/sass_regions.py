"""Where a kernel's code and its warp stalls are, by source region: an Nsight Compute per-instruction CSV
(`ncu -i rep --page source --csv --print-source sass`, as tools/gpu_profile.sh writes it; .gz read as such)
joined, instruction by instruction, with the source lines of the same kernel's SASS (`nvdisasm -gi` of a cubin
built with -lineinfo, as setup.py builds; the two must be the same compile: the opcodes are checked).

It prints the kernel's code size, how much of it ran at all, the code in the loops (instructions executed more
than --loop-min times, default 12x the smallest non-zero count: more than once by each of a CTA's 12 warps) and
outside them, the "no instruction" stall samples (a warp waiting for its next instruction to be fetched:
instruction cache misses) of each, then per source region (the call chain from the kernel's body, --depth
frames deep) the instructions, those executed, the executed outside the loops, and the all / "no instruction" samples.

    nvcc ... -lineinfo -cubin -o k.cubin cuda/attention/sm90/pair_bf16.cu
    python3 tools/sass_regions.py --cubin k.cubin --kernel Lb1 --csv sm90p_sass.csv.gz [--depth 3] [--top 30]

--kernel: a substring of the kernel's mangled name (the first section whose name holds it); --sass FILE instead
of --cubin reads a saved `nvdisasm -gi -c` listing.
"""
import argparse
import collections
import csv
import gzip
import re
import subprocess

LOC = re.compile(r'"([^"]+)", line (\d+)')
INSN = re.compile(r"\s+/\*[0-9a-f]{4,6}\*/\s+(.*?);")


def opcode(text):
    t = text.split()
    return (t[1] if t[0].startswith("@") else t[0]).split(".")[0]


def read_sass(args):
    if args.sass:
        text = open(args.sass).read()
    else:
        cmd = ["nvdisasm", "-gi", "-c", args.cubin]
        try:
            text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        except FileNotFoundError:
            raise SystemExit("nvdisasm is not on PATH (it comes with the CUDA toolkit); or give --sass")
    lines = text.split("\n")
    starts = [i for i, l in enumerate(lines) if l.startswith("//----") and ".text." in l]
    sec = next((i for i in starts if args.kernel in lines[i]), None)
    if sec is None:
        names = "; ".join(lines[i].split(".text.")[1][:90] for i in starts)
        raise SystemExit(f"no kernel section holds {args.kernel!r}: {names}")
    end = next((i for i in starts if i > sec), len(lines))
    group, chain, out = [], None, []
    for line in lines[sec:end]:
        if line.strip().startswith("//## File"):
            f, n = LOC.findall(line)[0]
            group.append(f"{f.split('/')[-1]}:{n}")
        else:
            m = INSN.match(line)
            if m:
                if group:  # innermost first in the listing: the chain from the kernel's body is reversed
                    chain, group = group[::-1], []
                out.append((opcode(m.group(1)), chain or []))
    return out


def read_csv(path):
    f = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
    rows = list(csv.reader(f))
    at = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    hdr, data = rows[at], [r for r in rows[at + 1:] if len(r) > 2]
    col = {n: i for i, n in enumerate(hdr)}
    num = lambda r, n: float((r[col[n]] or "0").replace(",", "")) if n in col else 0.0  # noqa: E731
    return [(opcode(r[col["Source"]].strip()), num(r, "Instructions Executed"),
             num(r, "Warp Stall Sampling (All Samples)"), num(r, "stall_no_inst")) for r in data]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--cubin")
    src.add_argument("--sass")
    ap.add_argument("--kernel", required=True)
    ap.add_argument("--csv", required=True)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--loop-min", type=float, default=0)
    args = ap.parse_args()
    sass, prof = read_sass(args), read_csv(args.csv)
    if len(sass) != len(prof):
        raise SystemExit(f"{len(sass)} instructions in the SASS, {len(prof)} in the CSV: not the same kernel or build")
    bad = sum(a[0] != b[0] for a, b in zip(sass, prof))
    if bad:
        raise SystemExit(f"{bad} opcodes differ between the SASS and the CSV: not the same compile")
    low = min((p[1] for p in prof if p[1] > 0), default=1.0)
    loop_min = args.loop_min or 12 * low
    tot = collections.Counter()
    reg = collections.defaultdict(collections.Counter)
    for (_, chain), (_, ex, allv, ni) in zip(sass, prof):
        key = " > ".join(chain[: args.depth]) or "?"
        tot["code"] += 1
        r = reg[key]
        r["code"] += 1
        part = "loop" if ex > loop_min else "once"
        for c in (tot, r):  # every sample counts, also one on an instruction counted as never executed
            c["all"] += allv
            c["ni"] += ni
            c["all_" + part] += allv
            c["ni_" + part] += ni
            if ex > 0:
                c["ran"] += 1
                c[part] += 1
    kb = lambda n: f"{16 * n / 1024:.0f} KB"  # noqa: E731
    print(f"code {tot['code']} instructions ({kb(tot['code'])}); ran {tot['ran']} ({kb(tot['ran'])}): "
          f"loops {tot['loop']} ({kb(tot['loop'])}), outside {tot['once']} ({kb(tot['once'])}); "
          f"loop = executed > {loop_min:.0f}")
    pct = lambda a, b: f"{100 * a / b:.1f}%" if b else "-"  # noqa: E731
    print(f"stall samples {tot['all']:.0f}: 'no instruction' {pct(tot['ni'], tot['all'])}; outside the loops "
          f"{pct(tot['all_once'], tot['all'])} of all samples, "
          f"{pct(tot['ni_once'], tot['all_once'])} of them 'no instruction'")
    print(f"{'code':>6} {'ran':>5} {'once':>5} {'samples':>8} {'no_inst':>8}  region")
    for key, r in sorted(reg.items(), key=lambda kv: -kv[1]["ran"])[: args.top]:
        print(f"{r['code']:6d} {r['ran']:5d} {r['once']:5d} {r['all']:8.0f} {r['ni']:8.0f}  {key}")


if __name__ == "__main__":
    main()
