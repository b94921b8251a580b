"""Independent references for the compiled CPU kernels' tests (not a test module).

``canonical_gemm`` spells out cuda/linear.cu's order in plain Python: each fma is done in
exact rational arithmetic and rounded once to f32 (round half to even), the chunk sums,
scale and residual are single numpy f32 operations (each correctly rounded). It shares no
code with the C kernels, so agreement bit for bit means the C code follows the order.

``build_extension`` compiles crucible.backend._cpu from this checkout into a folder (for
checks that must not depend on how the package was installed).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from types import ModuleType

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
KC = 64


def round_f32(q: Fraction) -> np.float32:
    """The f32 nearest to q (ties to even); exact zeros are +0 (as fma gives from +0)."""
    if q == 0:
        return np.float32(0.0)
    sign, a = (-1, -q) if q < 0 else (1, q)
    e = a.numerator.bit_length() - a.denominator.bit_length()  # 2^e <= a < 2^(e+2)
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    while Fraction(2) ** e > a:
        e -= 1
    e = max(e, -126)  # subnormals share the smallest normal exponent's spacing
    m = a * Fraction(2) ** (23 - e)
    n, rem = divmod(m.numerator, m.denominator)
    if 2 * rem > m.denominator or (2 * rem == m.denominator and n % 2):
        n += 1
    return np.float32(sign * float(n) * 2.0 ** (e - 23))


def fma_f32(a: np.float32, b: np.float32, c: np.float32) -> np.float32:
    return round_f32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))


def canonical_gemm(x: np.ndarray, w: np.ndarray, scale: np.ndarray | None = None,
                   residual: np.ndarray | None = None) -> np.ndarray:
    """y[m, n] for x [M, K] f32 and w [N, K] (f32, or int8 codes with scale [N])."""
    m_rows, k = x.shape
    n_cols = w.shape[0]
    y = np.empty((m_rows, n_cols), dtype=np.float32)
    for m in range(m_rows):
        for n in range(n_cols):
            total = None
            for k0 in range(0, k, KC):
                part = np.float32(0.0)
                for kk in range(k0, min(k, k0 + KC)):
                    part = fma_f32(x[m, kk], np.float32(w[n, kk]), part)
                total = part if total is None else np.float32(total + part)
            v = total if scale is None else np.float32(total * scale[n])
            y[m, n] = v if residual is None else np.float32(residual[m, n] + v)
    return y


def build_extension(dest: Path) -> ModuleType | None:
    """Compile the extension from this checkout into ``dest``; None without a compiler."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        return None
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib",
                           str(dest / "lib"), "--build-temp", str(dest / "tmp")],
                          cwd=ROOT, capture_output=True, text=True)
    found = sorted((dest / "lib" / "crucible" / "backend").glob("_cpu*"))
    if done.returncode != 0 or not found:
        return None
    spec = importlib.util.spec_from_file_location("crucible.backend._cpu", found[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
