"""bench/eager_host.py's variants: what each one switches off, and that its undo restores
the kernel modules' launch and the backend's allocations (a later variant must not inherit
an earlier one's patches); the driver variant's routing; and the whole bench on the
stand-in CuPy (it had stopped running there once the sm_90a builds came, unnoticed)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

from eager_host import VARIANTS, patch  # noqa: E402

import crucible.kernels.launch as kl  # noqa: E402
from crucible.kernels import linear_mma, model_ops  # noqa: E402


class Backend:
    """Stands in for CupyBackend: ``new`` hands out a fresh object every call."""

    def new(self, shape: tuple[int, ...]) -> list:
        return [shape]


def test_variants_switch_off_what_they_name_and_undo_restores() -> None:
    assert VARIANTS == ("full", "no-launch", "no-alloc", "neither")
    be, orig = Backend(), kl.launch
    for variant in VARIANTS:
        undo = patch(variant, be)
        no_launch = variant in ("no-launch", "neither")
        no_alloc = variant in ("no-alloc", "neither")
        for mod in (linear_mma, model_ops):
            assert (mod.launch is orig) != no_launch, (variant, mod.__name__)
        if no_launch:
            assert model_ops.launch(None, (1,), (1,), ()) is None
        assert (be.new((2, 3)) is be.new((2, 3))) == no_alloc, variant
        assert be.new((2, 3)) is not be.new((3, 2))
        undo()
        assert linear_mma.launch is orig and model_ops.launch is orig
        assert be.new((2, 3)) is not be.new((2, 3)) and "new" not in be.__dict__


def test_driver_variant_routes_plain_launches_to_the_driver_path(monkeypatch) -> None:
    import launch_host

    seen = []
    monkeypatch.setattr(launch_host, "launch_driver", lambda *a: seen.append(a))
    orig = kl.launch
    undo = patch("driver", Backend())
    try:
        assert model_ops.launch is not orig
        model_ops.launch("fn", (2,), (32,), ("x",), 16, pdl=True)
        assert seen == [("fn", (2,), (32,), ("x",), 16)]
    finally:
        undo()
    assert model_ops.launch is orig and linear_mma.launch is orig


def test_runs_on_the_stand_in_cupy() -> None:
    """The whole bench on bench/fake_cupy.py, in its own process (the stand-in replaces
    ``cupy`` for the process): a kernel module the stand-in misses fails it."""
    import subprocess

    out = subprocess.run([sys.executable, str(BENCH / "eager_host.py"), "--device", "fake",
                          "--rounds", "1", "--cases", "decode 256"], cwd=BENCH,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "decode 256" in out.stdout and "launches" in out.stdout
