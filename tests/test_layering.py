"""Data flows one way: server/cli/api -> engine -> model runner -> backend -> kernels.

Lower layers must not import higher ones (``crucible.engine.batch``, the shared per-step
description, is the one engine module every layer may read).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "crucible"
FORBIDDEN = {
    "backend": ("crucible.engine.", "crucible.server", "crucible.api", "crucible.cli"),
    "kernels": ("crucible.engine.", "crucible.server", "crucible.api", "crucible.cli",
                "crucible.model"),
    "model": ("crucible.engine.", "crucible.server", "crucible.api", "crucible.cli"),
    "engine": ("crucible.server", "crucible.api", "crucible.cli"),
    "server": ("crucible.cli",),
}
ALLOWED = ("crucible.engine.batch",)


def imports_of(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def test_lower_layers_do_not_import_higher_ones() -> None:
    bad = []
    checked = 0
    for layer, forbidden in FORBIDDEN.items():
        for path in sorted((ROOT / layer).glob("*.py")):
            checked += 1
            for name in imports_of(path):
                if name in ALLOWED:
                    continue
                if any(name == f.rstrip(".") or name.startswith(f) for f in forbidden):
                    bad.append(f"{path.relative_to(ROOT.parent)} imports {name}")
    assert checked > 20
    assert not bad, "\n".join(bad)


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """Negative control: an upward import is reported."""
    f = tmp_path / "x.py"
    f.write_text("from crucible.server.app import make_app\nimport crucible.engine.batch\n")
    assert imports_of(f) == ["crucible.server.app", "crucible.engine.batch"]
