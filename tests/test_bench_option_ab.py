"""bench/option_ab.py, the A/B that attention_fork.py and decode_order.py share, on the host
with timed replays faked: the settings alternate by round, each replay sees its own
setting, the ratio is on over off, the backend's options come back afterwards, and logits
that differ between the settings stop the bench."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import option_ab  # noqa: E402

from crucible.backend.options import BackendOptions  # noqa: E402


def fake_runner(monkeypatch: pytest.MonkeyPatch, differ: bool = False) -> tuple:
    be = SimpleNamespace(options=BackendOptions(longest_first=True))
    seen: list[bool] = []

    def timed(step, replays, count):  # on: 2 ms, off: 4 ms; logits by setting if `differ`
        on = be.options.longest_first
        seen.append(on)
        return (2.0 if on else 4.0), np.full(3, float(on and differ), np.float32)

    monkeypatch.setattr(option_ab, "timed_replays", timed)
    return SimpleNamespace(backend=be, forward_device=lambda b: b), seen


def test_settings_alternate_and_the_ratio_is_on_over_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    runner, seen = fake_runner(monkeypatch)
    before = []
    runner.backend.options = BackendOptions(longest_first=False)  # not the bench's to keep
    s = option_ab.option_ab(runner, {"c": (1, lambda: 0)}, "longest_first",
                            ("listed", "longest"), 3, 5, before=lambda: before.append(1))
    assert seen == [False, True, True, False, False, True]
    assert len(before) == 6
    assert s["c"]["longest_over_listed"] == {"median": 0.5, "min": 0.5, "max": 0.5}
    assert s["c"]["listed_ms"]["median"] == 4.0 and s["c"]["longest_ms"]["median"] == 2.0
    assert runner.backend.options == BackendOptions(longest_first=False)


def test_logits_that_differ_stop_the_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    runner, _ = fake_runner(monkeypatch, differ=True)
    with pytest.raises(SystemExit, match="logits under listed and longest differ"):
        option_ab.option_ab(runner, {"c": (1, lambda: 0)}, "longest_first",
                            ("listed", "longest"), 1, 5)
    assert runner.backend.options == BackendOptions(longest_first=True)  # restored
