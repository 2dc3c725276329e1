"""The loops of a kernel's SASS and their instruction mix, without a GPU: every backward branch whose body holds a
tensor-core (HGMMA) or a copy (LDGSTS / UTMALDG) instruction and no such loop inside it, i.e. the consumer and producer
loops of an attention kernel, not the mbarrier retry loops (nor the out-of-line retry stubs past the kernel's EXIT,
whose jumps back span the loop) and not the item loops around them. Static counts (each instruction once, whatever
branch a pass takes), so two kernels' loops compare by the code they issue per pass, e.g.
ours against a peer's binary:

    nvcc -std=c++17 -O3 -Icsrc -Icuda -DSMLA_WITH_CUDA=1 -DSMLA_HAVE_SM90=1 --expt-relaxed-constexpr \
        -gencode=arch=compute_90a,code=sm_90a -cubin -o k.cubin cuda/attention/sm90/pair_bf16.cu
    cuobjdump -sass k.cubin > ours.sass; cuobjdump -sass peer_exe > peer.sass
    python3 tools/sass_loops.py ours.sass --kernel attn_sm90p_kernelILi0ELb1E [--top 16]
    python3 tools/sass_loops.py peer.sass --kernel sparse_attn_fwd
"""
import argparse
import collections
import re

INSN = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);")
BACK = re.compile(r"BRA 0x([0-9a-f]+)")  # cuobjdump writes branch targets as addresses
WORK = ("HGMMA", "LDGSTS", "UTMALDG")


def opcode(text):
    """The instruction's opcode without its predicate and modifiers."""
    return re.sub(r"^@!?U?P\w+ ", "", text).split()[0].split(".")[0]


def kernel_sass(path, name):
    """(address, text) of the first kernel whose mangled name contains name."""
    out, inside = [], False
    for line in open(path):
        if "Function :" in line:
            if inside:
                break
            inside = name in line
            continue
        m = INSN.match(line)
        if inside and m:
            out.append((int(m.group(1), 16), m.group(2).strip()))
    if not out:
        raise SystemExit(f"no kernel with {name!r} in {path}")
    return out


def loops(ins):
    """(first, last) indices of the innermost loops that do work (WORK opcodes), in address order."""
    at = {a: i for i, (a, _) in enumerate(ins)}
    found = []
    for i, (a, t) in enumerate(ins):
        m = BACK.search(t)
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in at:
            j = at[int(m.group(1), 16)]
            body = [opcode(x) for _, x in ins[j:i + 1]]
            if any(o.startswith(WORK) for o in body) and "EXIT" not in body:  # not a retry stub's jump back
                found.append((j, i))
    return [(j, i) for j, i in found if not any((j, i) != (p, q) and j <= p and q <= i for p, q in found)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sass", help="cuobjdump -sass output")
    ap.add_argument("--kernel", required=True, help="a substring of the kernel's mangled name")
    ap.add_argument("--top", type=int, default=16, help="opcodes listed per loop")
    args = ap.parse_args()
    ins = kernel_sass(args.sass, args.kernel)
    print(f"{len(ins)} instructions in the kernel")
    for j, i in loops(ins):
        c = collections.Counter(opcode(t) for _, t in ins[j:i + 1])
        mix = ", ".join(f"{k} {v}" for k, v in c.most_common(args.top))
        print(f"loop {ins[j][0]:#07x}-{ins[i][0]:#07x}: {i - j + 1} instructions; {mix}")


if __name__ == "__main__":
    main()
