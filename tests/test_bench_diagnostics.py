"""The diagnostic benches of 2026-12-05: bench/ncu_step_table.py (Nsight Compute's CSV of
a decode step, kernel by kernel) and bench/chat_timeline.py (a cached chat turn's steps and
arrivals). Both feed the docs' figures, so their arithmetic and their logs are checked."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import ncu_step_table  # noqa: E402

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
          '"Block Size","Grid Size","Device","CC","Section Name","Metric Name",'
          '"Metric Unit","Metric Value"\n')


def row(i: int, kernel: str, unit: str, value: str, metric: str = "gpu__time_duration.sum"
        ) -> str:
    return (f'"{i}","1","python3","h","{kernel}(float*, int)","1","7","(128, 1, 1)",'
            f'"(120, 1, 1)","0","9.0","Command line profiler metrics","{metric}","{unit}",'
            f'"{value}"\n')


def test_the_table_keeps_the_last_step_and_converts_units(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    # Two steps of three launches; the first step is slower (compiles) and must not count.
    lines = ["==PROF== Connected to process 1\n", HEADER]
    times = [("gemm", "usecond", "9.0"), ("attn", "nsecond", "20,000"), ("gemm", "usecond", "8.0"),
             ("gemm", "usecond", "4.0"), ("attn", "nsecond", "12,000"), ("gemm", "usecond", "5.0")]
    for i, (k, unit, v) in enumerate(times):
        lines.append(row(i, k, unit, v))
        lines.append(row(i, k, "register/thread", "96", "launch__registers_per_thread"))
    csv = tmp_path / "n.csv"
    csv.write_text("".join(lines))
    out = tmp_path / "n.json"
    assert ncu_step_table.main([str(csv), "--steps", "2", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["launches_per_step"] == 3 and got["step_us_serialised"] == 21.0
    table = {k["kernel"]: k for k in got["kernels"]}
    assert table["attn"]["us_total"] == 12.0 and table["attn"]["launches"] == 1
    assert table["gemm"]["us_total"] == 9.0 and table["gemm"]["us_each"] == 4.5
    assert got["kernels"][0]["kernel"] == "attn"  # largest first
    assert sum(k["share"] for k in got["kernels"]) == pytest.approx(1.0, abs=1e-3)
    assert "21.0 us in 3 launches" in capsys.readouterr().out


def test_the_chat_timeline_logs_a_turn(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import chat_timeline

    out = tmp_path / "t.json"
    assert chat_timeline.main(["--users", "4", "--turns", "2", "--reply-tokens", "3",
                               "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert len(got["ttft_ms_last_turn"]) == 4 and min(got["ttft_ms_last_turn"]) > 0
    kinds = [e["ev"] for e in got["log"]]
    assert kinds.count("add") == 4 * 2  # the timed part only: each user's two turns
    assert kinds.count("arrive") == 4 * 2  # the same requests, on the event loop first
    arrivals = [e["t0"] for e in got["log"] if e["ev"] == "arrive"]
    intakes = [e["t0"] for e in got["log"] if e["ev"] == "add"]
    assert all(a <= t for a, t in zip(sorted(arrivals), sorted(intakes)))
    assert any(e.get("name") == "_push_all" for e in got["log"])
    launches = [e for e in got["log"] if e["ev"] == "launch"]
    # Every prompt row is computed once: the cache serves the rest (the shared system
    # prompt and each first turn, for the second turns).
    assert sum(e["prefill_rows"] for e in launches) > 0
    assert all(e["t1"] >= e["t0"] for e in got["log"])
    assert "turn 1: ttft p50" in capsys.readouterr().out


def test_the_timeline_leaves_the_engine_as_it_was() -> None:
    import chat_timeline

    from crucible.engine.async_engine import AsyncLLMEngine
    from crucible.engine.engine import LLMEngine

    def methods() -> tuple:
        return (LLMEngine.step, LLMEngine._launch, LLMEngine.add_request, AsyncLLMEngine.add,
                AsyncLLMEngine._push_all, AsyncLLMEngine._await_replies)

    before = methods()
    undo = chat_timeline.instrument()
    assert all(now is not then for now, then in zip(methods(), before))
    undo()
    assert methods() == before


def test_the_attention_phases_sum_each_files_lines(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    # bench/ncu_attention_phases.py: per-line rows (a number first) of two files are cut into
    # phases by file and line; SASS rows under them (empty line number) are not counted again.
    import ncu_attention_phases as ph

    cols = ('"Line No","Source","Address","Source","Warp Stall Sampling (All Samples)",'
            '"Instructions Executed","L1 Wavefronts Shared","stall_barrier","stall_short_sb",'
            '"stall_barrier (Not Issued)"\n')

    def line(no: str, samples: int, instr: int, wf: int, bar: int, ssb: int) -> str:
        return f'"{no}","x","-","-","{samples}","{instr:,}","{wf}","{bar}","{ssb}","99"\n'

    text = ('"File Path","/tmp/a/0123.cubin.cu"\n"Function Name","attn_exact_pf(...)"\n' + cols
            + line("120", 30, 100, 0, 25, 0)           # pass 1's loop head: staging
            + '"","","0x10","  BAR.SYNC","30","100","0","25","0","9"\n'
            + line("140", 10, 50, 10, 0, 5)            # the softmax
            + '"File Path","/src/cuda/common.cuh"\n"Function Name","f"\n' + cols
            + line("27", 40, 600, 0, 0, 35)            # cru_leaf: QK
            + line("201", 20, 50, 60, 0, 10)           # cru_tree_dots' loads: QK
            + line("41", 0, 200, 30, 0, 0))            # cru_pv: PV
    csv = tmp_path / "c.csv"
    csv.write_text(text)
    agg = ph.tally(str(csv))
    assert agg[ph.QK]["Instructions Executed"] == 650 and agg[ph.QK]["stall_short_sb"] == 45
    assert agg[ph.STAGING]["Warp Stall Sampling (All Samples)"] == 30
    assert agg[ph.STAGING]["stall_barrier"] == 25 and agg[ph.PV]["L1 Wavefronts Shared"] == 30
    assert "stall_barrier (Not Issued)" not in agg[ph.STAGING]
    assert ph.main([str(csv)]) == 0
    out = capsys.readouterr().out
    assert "QK dots" in out and "barrier 25.0%" in out and "short_sb 50.0%" in out


def test_the_nsys_table_charges_each_kernel_what_it_moves_the_end(tmp_path: Path) -> None:
    # bench/nsys_step_table.py: replays run from one embedding launch to the next; a kernel
    # that overlaps the one before it (PDL) is charged only for how far it moves the end.
    import nsys_step_table as nt

    seq = [("embed_rows(float*)", 2000, 1), ("void linear_mma_rows<2>(const float *)", 6000, 60),
           ("attn_decode<3>(float*)", 10000, 3), ("linear_mma_rows<2>(float*)", 5000, 36)]
    lines, t = ['"Start (ns)","Duration (ns)","GrdX","GrdY","GrdZ","Name"\n'], 0
    for _ in range(4):
        for name, dur, gx in seq:
            lines.append(f'{t},{dur},{gx},4,1,"{name}"\n')
            t += dur - 1000  # each kernel starts 1 us before the previous one ends
        t += 5000
    csv = tmp_path / "g.csv"
    csv.write_text("".join(lines))
    got = nt.table(nt.replays(nt.kernels(str(csv)), "embed")[-2:])
    assert got["replays"] == 2 and got["launches_per_step"] == 4 and got["span_us"] == 20.0
    by = {(k["kernel"], k["grid"][0]): k["us_per_step"] for k in got["kernels"]}
    assert by[("attn_decode<3>", 3)] == 9.0 and by[("embed_rows", 1)] == 2.0
    assert by[("linear_mma_rows<2>", 60)] == 5.0 and by[("linear_mma_rows<2>", 36)] == 4.0
    assert sum(by.values()) == got["span_us"]
