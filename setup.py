"""Ship the top-level cuda/ sources inside the wheel as crucible/_cuda (metadata: pyproject)."""

from pathlib import Path
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithCuda(build_py):
    def run(self) -> None:
        super().run()
        src = Path(__file__).resolve().parent / "cuda"
        dst = Path(self.build_lib) / "crucible" / "_cuda"
        dst.mkdir(parents=True, exist_ok=True)
        for f in sorted(src.glob("*.cu")) + sorted(src.glob("*.cuh")):
            shutil.copy2(f, dst / f.name)


setup(cmdclass={"build_py": BuildPyWithCuda})
