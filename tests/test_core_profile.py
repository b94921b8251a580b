"""``CRUCIBLE_CORE_PROFILE`` (Settings.core_profile; crucible/engine/core_process.py
``_Profile``): the engine process's loop under cProfile, its stats written while it runs
and at its end."""

from __future__ import annotations

import pstats
from pathlib import Path

from crucible.engine import core_process
from crucible.engine.settings import Settings


def busy_work() -> int:
    return sum(i * i for i in range(20_000))


def test_the_setting_comes_from_the_environment() -> None:
    assert Settings.from_env({}).core_profile is None and Settings().core_profile is None
    got = Settings.from_env({"CRUCIBLE_CORE_PROFILE": "runs/core.prof"}).core_profile
    assert got == Path("runs/core.prof")
    assert Settings.from_env({"CRUCIBLE_CORE_PROFILE": " "}).core_profile is None


def test_stats_are_written_while_it_runs_and_at_the_end(tmp_path) -> None:
    path = tmp_path / "core.prof"
    prof = core_process._Profile(str(path))
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


def test_an_unwritable_path_is_named_and_the_loop_goes_on(tmp_path, capsys) -> None:
    bad = tmp_path / "missing-dir" / "core.prof"
    prof = core_process._Profile(str(bad))
    prof.dump()  # no exception
    prof.prof.disable()
    assert f"cannot write {bad}" in capsys.readouterr().err
