"""bench/route_forms.py's routes: each takes the forms and the SwiGLU epilogue's rows it
names while its graph is captured, and gives back the shipped ones after (a later route
must not inherit an earlier one's patches)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

from route_forms import ROUTES, routed  # noqa: E402

import crucible.kernels.linear_mma as lm  # noqa: E402
import crucible.kernels.linear_wgmma as lw  # noqa: E402

GATE_UP = SimpleNamespace(shape=(3072, 576), wg=object(), dtype_name="int8")


def test_swiglu_routes_take_the_epilogue_nowhere_and_everywhere_then_restore() -> None:
    shipped_skip, shipped_pick = lw.SWIGLU_SKIP_ROWS, lm.pick_form
    assert lw.swiglu_route(256, GATE_UP) is None  # shipped: left out at 256 rows
    with routed("swiglu-all"):
        assert lw.swiglu_route(256, GATE_UP) == (64, 3)
        assert lm.pick_form is not shipped_pick  # the rows forms' routing is patched too
    with routed("swiglu-off"):
        assert all(lw.swiglu_route(m, GATE_UP) is None for m in (128, 256, 512, 1024, 4096))
    with routed("shipped"):
        assert lw.SWIGLU_SKIP_ROWS == shipped_skip
    assert lw.SWIGLU_SKIP_ROWS == shipped_skip and lm.pick_form is shipped_pick


def test_a_route_of_forms_answers_its_form_for_its_weight_kind_only() -> None:
    head = lm.pick_form(64, 49152, 576)
    with routed("nt4"):
        assert lm.pick_form(64, 960, 576) == ROUTES["nt4"]["qkv"]
        assert lm.pick_form(64, 49152, 576) == head  # the LM head is no route's kind
    with routed("down16"):
        assert lm.pick_form(64, 576, 1536) == (2, 16)
        assert lm.pick_form(64, 576, 576) != (2, 16)  # o keeps the shipped form
