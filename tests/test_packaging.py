"""The CUDA sources must be found from a checkout and from an installed package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_cuda_sources_found_in_checkout() -> None:
    from crucible.kernels.source import cuda_source_dir

    found = cuda_source_dir()
    assert found == ROOT / "cuda"
    assert (found / "attention.cu").is_file()


def test_cuda_sources_ship_in_built_package(tmp_path: Path) -> None:
    """setup.py's build_py copies cuda/ into crucible/_cuda, where an installed copy looks."""
    lib = tmp_path / "lib"
    subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(lib)],
                   cwd=ROOT, check=True, capture_output=True)
    shipped = sorted(p.name for p in (lib / "crucible" / "_cuda").iterdir())
    assert shipped == sorted(p.name for p in (ROOT / "cuda").iterdir()
                             if p.suffix in (".cu", ".cuh"))
    probe = ("from crucible.kernels.source import cuda_source_dir as d; "
             "print(d())")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, check=True,
                         capture_output=True, text=True, env={"PYTHONPATH": str(lib)}).stdout
    assert Path(out.strip()) == lib / "crucible" / "_cuda"


def test_console_script_and_module_entry_agree() -> None:
    out = subprocess.run([sys.executable, "-m", "crucible", "--help"], capture_output=True,
                         text=True, cwd=ROOT)
    assert out.returncode == 0 and "generate" in out.stdout and "serve" in out.stdout
