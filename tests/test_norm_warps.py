"""RMSNorm's kernel choice on CUDA, checked on the host (kernels/model_ops.rmsnorm_launch):
a warp a row (rmsnorm_warps) where the row fits its register row and the switch is on, a
block a row (rmsnorm_rows) otherwise; the grid and arguments each kernel reads; the switch's
way from the environment to the backend options. The bits are tests/test_gpu_rmsnorm_warps.py's."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from crucible.engine.settings import ConfigError, Settings
from crucible.kernels import model_ops


class Rows:
    def __init__(self, t: int, d: int) -> None:
        self.shape = (t, d)


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    calls: list[tuple] = []
    monkeypatch.setattr(model_ops, "kernel", lambda name: name)
    monkeypatch.setattr(model_ops, "launch",
                        lambda k, grid, block, args, pdl=False: calls.append(
                            (k, grid, block, args, pdl)))
    return calls


@pytest.mark.parametrize("t,d", [(1, 576), (8, 576), (9, 576), (1000, 64),
                                 (3, 32 * model_ops.WARP_ROW_MAX)])
def test_rows_that_fit_take_a_warp_each(launched: list[tuple], t: int, d: int) -> None:
    x: Any = Rows(t, d)
    model_ops.rmsnorm_launch(x, "w", "y", 1e-5, pdl=True)
    (k, grid, block, args, pdl), = launched
    assert (k, grid, block, pdl) == ("rmsnorm_warps", (-(-t // 8),), (256,), True)
    assert args[:3] == (x, "w", "y") and (int(args[3]), int(args[4])) == (t, d)
    assert args[5] == np.float32(1e-5) and isinstance(args[5], np.float32)


@pytest.mark.parametrize("t,d,warps", [(9, 32 * model_ops.WARP_ROW_MAX + 1, True),
                                       (9, 2048, True), (9, 576, False)])
def test_wide_rows_or_the_switch_off_take_a_block_each(launched: list[tuple], t: int, d: int,
                                                       warps: bool) -> None:
    x: Any = Rows(t, d)
    model_ops.rmsnorm_launch(x, "w", "y", 1e-5, warps=warps)
    (k, grid, block, args, pdl), = launched
    assert (k, grid, block, pdl) == ("rmsnorm_rows", (t,), (256,), False)
    assert args[:3] == (x, "w", "y") and int(args[3]) == d and len(args) == 5


def test_no_rows_no_launch(launched: list[tuple]) -> None:
    model_ops.rmsnorm_launch(Rows(0, 576), "w", "y", 1e-5)
    model_ops.rmsnorm_launch(Rows(0, 4096), "w", "y", 1e-5)
    assert launched == []


def test_the_switch_reaches_the_backend_options() -> None:
    assert Settings().backend_options().norm_warps
    off = Settings.from_env({"CRUCIBLE_NORM_WARPS": "0"})
    assert not off.norm_warps and not off.backend_options().norm_warps
    with pytest.raises(ConfigError, match="CRUCIBLE_NORM_WARPS"):
        Settings.from_env({"CRUCIBLE_NORM_WARPS": "yes"})
    with pytest.raises(ConfigError, match="norm_warps"):
        Settings(norm_warps=1)  # type: ignore[arg-type]
