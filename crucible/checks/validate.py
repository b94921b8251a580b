"""``llm-engine gpu-validate``: every exactness check in one run, with a summary table.

It runs, in this order, each in-process with its own exit status:

  gpu-engine-check             CuPy kernels vs the numpy oracle and vs themselves (GPU only)
  gpu-prefill-attention-check  every attention variant vs the reference (GPU only; small fuzz)
  gpu-packed-prefill-check     packed generation == one at a time (reduced: --steps 8 --fuzz 6)
  gpu-batch                    a needle alone == inside batches of 1..64
  gpu-paged                    shuffled/interleaved pages == contiguous pages
  gpu-graph-check              CUDA-graph decode == eager decode
  gpu-decode-prefill           decode step t == prefill of prompt + generated[:t]
  gpu-sampling                 device sampler == host sampler (GPU only; --quick with --quick)

The summary lists name, PASS/FAIL/SKIP and seconds; the exit status is 1 if any check failed
or raised (a crash is a failure, not a skip). GPU-only checks are skipped, and say so, when
the device resolves to the CPU. ``--full`` uses each command's own defaults; ``--quick`` is the
smallest meaningful run (the CPU test uses it to exercise this harness in seconds).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from typing import Callable

Check = tuple[str, Callable[[list[str]], int], list[str], bool]  # name, main, argv, GPU only


def plan(args: argparse.Namespace) -> list[Check]:
    from crucible.checks import batch_check, engine_check, graph_check, packed_check, sampling_check

    dev = ["--device", args.device]
    common = dev + ["--weights", args.weights] + (["--model", args.model] if args.model else [])
    if args.full:
        packed, attn, small = [], ["--fuzz", "32"], []
    elif args.quick:
        packed, attn = ["--steps", "2", "--fuzz", "0"], ["--fuzz", "2"]
        small = ["--steps", "2", "--max-prompt", "40"]
    else:
        packed, attn, small = ["--steps", "8", "--fuzz", "6"], ["--fuzz", "4"], []
    q = args.quick  # quick: fewer sizes, still across one bucket edge each
    return [
        ("gpu-engine-check", engine_check.main,
         ["--seed", str(args.seed)] + (["--model", args.model] if args.model else []), True),
        ("gpu-prefill-attention-check", _attention_main, attn, True),
        ("gpu-packed-prefill-check", packed_check.main, common + packed, False),
        ("gpu-batch", batch_check.batch_main,
         common + small + (["--sizes", "1", "16", "17"] if q else []), False),
        ("gpu-paged", batch_check.paged_main,
         common + small + (["--requests", "6"] if q else []), False),
        ("gpu-graph-check", graph_check.graph_main,
         common + small + (["--sizes", "1", "3", "2"] if q else []), False),
        ("gpu-decode-prefill", graph_check.decode_prefill_main,
         common + small + (["--lengths", "1", "16", "33"] if q else []), False),
        ("gpu-sampling", sampling_check.main,
         ["--seed", str(args.seed)] + (["--quick"] if q else []), True),
    ]


def _attention_main(argv: list[str]) -> int:
    # Imported late: the attention check pulls in the CUDA toolchain helpers.
    from crucible.checks.attention_check import main

    return main(argv)


def run_all(checks: list[Check], on_gpu: bool) -> list[tuple[str, str, float]]:
    rows = []
    for name, entry, argv, gpu_only in checks:
        if gpu_only and not on_gpu:
            print(f"\n== {name}: skipped (needs CuPy and a CUDA GPU)", flush=True)
            rows.append((name, "SKIP", 0.0))
            continue
        print(f"\n== {name} {' '.join(argv)}", flush=True)
        t0 = time.time()
        try:
            rc = int(entry(argv) or 0)
        except Exception:  # a crashing check must show up as a failure, with its traceback
            traceback.print_exc()
            rc = -1
        except SystemExit as exc:  # argparse errors exit; count them, do not stop the suite
            rc = exc.code if isinstance(exc.code, int) else 2
        status = "PASS" if rc == 0 else ("ERROR" if rc == -1 else f"FAIL (exit {rc})")
        rows.append((name, status, time.time() - t0))
    return rows


def main(argv: list[str]) -> int:
    from crucible.backend.select import resolve_device

    p = argparse.ArgumentParser(prog="llm-engine gpu-validate")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--model", default=None, help="passed to every check that takes a model")
    p.add_argument("--weights", choices=("int8", "f32"), default="int8")
    p.add_argument("--seed", type=int, default=0, help="seed for gpu-engine-check")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--full", action="store_true", help="each command's full defaults")
    size.add_argument("--quick", action="store_true", help="smallest run (harness check)")
    args = p.parse_args(argv)
    on_gpu = resolve_device(args.device) == "cuda"
    t0 = time.time()
    rows = run_all(plan(args), on_gpu)
    width = max(len(r[0]) for r in rows)
    print(f"\ngpu-validate summary (device {'cuda' if on_gpu else 'cpu'}, weights "
          f"{args.weights}, {'full' if args.full else 'quick' if args.quick else 'reduced'}):")
    print(f"  {'check':<{width}}  {'result':<14} {'seconds':>8}")
    for name, status, secs in rows:
        print(f"  {name:<{width}}  {status:<14} {secs:>8.1f}")
    bad = [r for r in rows if r[1] not in ("PASS", "SKIP")]
    skipped = sum(r[1] == "SKIP" for r in rows)
    print(f"gpu-validate: {len(rows) - len(bad) - skipped} passed, {len(bad)} failed, "
          f"{skipped} skipped ({time.time() - t0:.1f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
