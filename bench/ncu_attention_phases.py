"""Cut Nsight Compute's per-line source counters of attn_exact_pf into the kernel's phases.

    python3 bench/ncu_attention_phases.py OUT/ncu-attn-pf-SHAPE-cuda-sass.csv

The CSV is bench/ncu_attention.sh's ``--page source --print-source cuda,sass`` export: one
block per source file ("File Path"), a summary row per source line (instructions executed,
shared-memory wavefronts, stall samples by reason). Lines are classified by file and line
number against the sources as of commit 36e0d23 (cuda/attention.cu's cru_attn_exact,
attention_prefetch.cuh, attention_pv.cuh, common.cuh); a later edit of those files must
update REGIONS. Prints each phase's share of instructions, wavefronts and stall samples,
and the stall reasons over the whole kernel. Shares are of the per-line sums, which count
an inlined instruction under each source line it belongs to: on the chat cohort launch they
sum to 161.9 M instructions against the kernel's 149.4 M (8% more).
"""

from __future__ import annotations

import collections
import csv
import sys

STAGING, QK, SOFTMAX, PV, OTHER = ("K/V staging", "QK dots", "softmax", "PV chains", "other")
# (file name prefix, first line, last line, phase); the first match wins, the rest is OTHER.
# The main file is the temporary .cu CuPy compiled (attention.cu's text, its line numbers).
REGIONS = (
    ("attention_prefetch", 1, 999, STAGING),
    ("attention_pv", 1, 999, PV),
    ("common", 105, 116, STAGING),      # cru_pool_row
    ("common", 27, 27, QK),             # cru_leaf
    ("common", 30, 30, QK),             # cru_add (the dot tree; the softmax's few too)
    ("common", 190, 240, QK),           # cru_tree_dots, cru_qk_tile
    ("common", 41, 41, PV),             # cru_pv
    ("common", 1, 60, SOFTMAX),         # exp, warp max/sum trees
    (".cu", 115, 126, STAGING),         # pass 1's loop: loads, stores, barriers
    (".cu", 131, 152, SOFTMAX),
    (".cu", 157, 166, STAGING),         # pass 2's loop head: loads, stores, barriers
    (".cu", 167, 999, PV),              # PV tile calls, the output stores
)
COUNTS = ("Warp Stall Sampling (All Samples)", "Instructions Executed", "L1 Wavefronts Shared")


def phase(name: str, line: int) -> str:
    for prefix, lo, hi, ph in REGIONS:
        if (name.startswith(prefix) or (prefix == ".cu" and name.endswith(".cu"))) and lo <= line <= hi:
            return ph
    return OTHER


def tally(path: str) -> dict[str, collections.Counter]:
    agg: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    name, col = "", {}
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row or row[0] == "Function Name":
                continue
            if row[0] == "File Path":
                name = row[1].rsplit("/", 1)[-1]
            elif row[0] == "Line No":  # the columns counted: the totals, stalls by reason
                col = {k: i for i, k in enumerate(row) if k in COUNTS
                       or (k.startswith("stall_") and "Not Issued" not in k)}
            elif row[0].isdigit():
                ph = agg[phase(name, int(row[0]))]
                for k, i in col.items():
                    v = row[i].replace(",", "")
                    ph[k] += float(v) if v not in ("", "-") else 0.0
    return agg


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    agg = tally(argv[0])
    tot: collections.Counter = collections.Counter()
    for c in agg.values():
        tot.update(c)
    samples, instr, wf = COUNTS
    print(f"{'phase':14} {'instructions':>12} {'smem wavefronts':>16} {'stall samples':>14}"
          f" {'(at a barrier)':>15}")
    for ph, c in sorted(agg.items(), key=lambda kv: -kv[1][samples]):
        print(f"{ph:14} {100 * c[instr] / tot[instr]:11.1f}% {100 * c[wf] / tot[wf]:15.1f}%"
              f" {100 * c[samples] / tot[samples]:13.1f}%"
              f" {100 * c['stall_barrier'] / tot[samples]:14.1f}%")
    reasons = sorted((k for k in tot if k.startswith("stall_")), key=lambda k: -tot[k])
    print("stall reasons:", ", ".join(f"{k[6:]} {100 * tot[k] / tot[samples]:.1f}%"
                                      for k in reasons if tot[k] >= 0.01 * tot[samples]))
    print(f"totals: {tot[instr] / 1e6:.1f} M warp instructions, {tot[wf] / 1e6:.1f} M shared"
          f" wavefronts, {tot[samples]:.0f} stall samples")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
