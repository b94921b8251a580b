"""Imports go one way only, and no module imports itself back through others.

Layers from the top (a module may import its own layer and the ones below it, never one
above; ``crucible.checks`` sits over the product and nothing in the product imports it):

    cli -> checks -> server -> api -> engine -> model -> backend -> kernels -> step -> base

``step`` holds the per-step records (the packed batch, the sampling rows): the engine builds
them, the model and the backends read them, so they sit under every layer that reads them
and import nothing of Crucible but ``errors``. Every import counts, including ones inside
functions and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "crucible"
LAYERS = ("cli", "checks", "server", "api", "engine", "model", "backend", "kernels", "step",
          "base")
# Module (or package) -> layer; the longest matching prefix wins.
PLACES = {
    "crucible": "api",  # the package itself: ``from crucible import LLM``
    "crucible.__main__": "cli", "crucible.cli": "cli", "crucible.cli_args": "cli",
    "crucible.cli_generate": "cli", "crucible.cli_serve": "cli", "crucible.chat": "cli",
    "crucible.checks": "checks", "crucible.server": "server", "crucible.api": "api",
    "crucible.engine": "engine", "crucible.model": "model", "crucible.backend": "backend",
    "crucible.kernels": "kernels", "crucible.step": "step", "crucible.errors": "base",
    "crucible.arg_types": "base",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    best = max((p for p in PLACES if module == p or module.startswith(p + ".")), key=len)
    return PLACES[best]


def imports_of(path: Path, modules: set[str]) -> list[str]:
    """Every crucible module the file imports: ``from a.b import c`` names ``a.b.c`` when
    that is a module, else ``a.b``."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                me = module_name(path)
                pkg = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join(pkg + ([node.module] if node.module else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                names.append(sub if sub in modules else base)
    return [n for n in names if n == "crucible" or n.startswith("crucible.")]


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    return {m: set(imports_of(p, set(files))) - {m} for m, p in files.items()}


def upward(g: dict[str, set[str]]) -> list[str]:
    rank = {name: i for i, name in enumerate(LAYERS)}
    return [f"{m} ({layer_of(m)}) imports {n} ({layer_of(n)})"
            for m in sorted(g) for n in sorted(g[m]) if rank[layer_of(n)] < rank[layer_of(m)]]


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in g:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_layer() -> None:
    g = graph()
    assert len(g) > 100
    for m in g:
        assert layer_of(m) in LAYERS, m


def test_no_module_imports_a_higher_layer() -> None:
    bad = upward(graph())
    assert not bad, "\n".join(bad)


def test_no_import_circles() -> None:
    found = cycles(graph())
    assert not found, "\n".join(" <-> ".join(c) for c in found)


def test_the_checker_sees_violations(tmp_path: Path) -> None:
    """Negative controls: an upward import and a two-module circle are both reported."""
    g = {"crucible.backend.x": {"crucible.engine.runner", "crucible.step.batch"},
         "crucible.engine.runner": set(), "crucible.step.batch": set()}
    assert upward(g) == ["crucible.backend.x (backend) imports crucible.engine.runner (engine)"]
    assert cycles({"crucible.a": {"crucible.b"}, "crucible.b": {"crucible.a"},
                   "crucible.c": {"crucible.a"}}) == [["crucible.a", "crucible.b"]]
    f = tmp_path / "x.py"
    f.write_text("from crucible.server.app import make_app\ndef f():\n    import crucible.step.batch\n")
    assert imports_of(f, set()) == ["crucible.server.app", "crucible.step.batch"]
