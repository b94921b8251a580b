"""``CRUCIBLE_CORE_PROFILE`` (crucible/engine/core_process.py ``_Profile``): the engine
process's loop under cProfile, its stats written while it runs and at its end."""

from __future__ import annotations

import pstats

from crucible.engine import core_process


def busy_work() -> int:
    return sum(i * i for i in range(20_000))


def test_off_unless_the_variable_names_a_path(monkeypatch) -> None:
    monkeypatch.delenv("CRUCIBLE_CORE_PROFILE", raising=False)
    assert core_process._Profile.from_env() is None
    monkeypatch.setenv("CRUCIBLE_CORE_PROFILE", "")
    assert core_process._Profile.from_env() is None


def test_stats_are_written_while_it_runs_and_at_the_end(monkeypatch, tmp_path) -> None:
    path = tmp_path / "core.prof"
    monkeypatch.setenv("CRUCIBLE_CORE_PROFILE", str(path))
    prof = core_process._Profile.from_env()
    busy_work()
    prof.tick()  # too early: nothing written yet
    assert not path.exists()
    prof.next = 0.0  # the period is over
    prof.tick()
    first = {f[2] for f in pstats.Stats(str(path)).stats}
    assert "busy_work" in first
    prof.dump()
    prof.prof.disable()
    assert "tick" in {f[2] for f in pstats.Stats(str(path)).stats}


def test_an_unwritable_path_is_named_and_the_loop_goes_on(monkeypatch, tmp_path, capsys) -> None:
    bad = tmp_path / "missing-dir" / "core.prof"
    monkeypatch.setenv("CRUCIBLE_CORE_PROFILE", str(bad))
    prof = core_process._Profile.from_env()
    prof.dump()  # no exception
    prof.prof.disable()
    assert f"cannot write {bad}" in capsys.readouterr().err
