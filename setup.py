"""Build steps beyond pyproject's metadata.

- Ship the top-level cuda/ sources inside the wheel as crucible/_cuda.
- Compile crucible.backend._cpu, the batch-invariant CPU kernels. It is optional: without a
  C compiler (or Python headers) the install still succeeds and the numpy backend falls
  back to its BLAS tile path (slower, and different CPU bits; docs/numerics.md).
"""

from pathlib import Path
import shutil

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

CSRC = "crucible/backend/csrc"


class BuildPyWithCuda(build_py):
    def run(self) -> None:
        super().run()
        src = Path(__file__).resolve().parent / "cuda"
        dst = Path(self.build_lib) / "crucible" / "_cuda"
        dst.mkdir(parents=True, exist_ok=True)
        for f in sorted(src.glob("*.cu")) + sorted(src.glob("*.cuh")):
            shutil.copy2(f, dst / f.name)


# -ffp-contract=off: the compiler must not fuse a multiply and an add on its own (the
# AVX2 functions could, and the scalar ones on an FMA target); every fma is written out.
# No -ffast-math and no -march: the AVX2 kernels are chosen at run time.
cpu_kernels = Extension(
    "crucible.backend._cpu",
    sources=[f"{CSRC}/{name}.c" for name in
             ("module", "pool", "gemm", "gemm_avx2", "attention", "attention_avx2", "rows",
              "rows_avx2")],
    depends=[f"{CSRC}/cpu.h", f"{CSRC}/exp_avx2.h"],
    extra_compile_args=["-O2", "-std=gnu11", "-ffp-contract=off", "-fno-fast-math",
                        "-pthread"],
    extra_link_args=["-pthread"],
    libraries=["m"],
    optional=True,
)

setup(cmdclass={"build_py": BuildPyWithCuda}, ext_modules=[cpu_kernels])
