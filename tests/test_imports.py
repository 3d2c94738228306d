"""The import graph: no cycle, no upward import, no private name imported across modules.

Layers, lowest first (a module may import its own package and the layers listed for it):
runlog, loggers <- scheduler <- envs <- sim / engine <- config <- bench / libra.py. So engine never
imports sim or bench, sim never imports engine or bench, and config only reaches into engine
for its torch-free config modules. Every import counts, including those inside functions.
Run `python -m pytest tests/test_imports.py -q` to check; the failure lists each bad edge.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "scheduler", "envs", "sim", "bench", "examples")
ALLOWED = {  # layer -> the other layers it may import
    "runlog": set(),
    "loggers": set(),
    "scheduler": {"runlog"},
    "envs": {"scheduler", "runlog"},
    "sim": {"scheduler", "envs", "runlog"},
    "engine": {"scheduler", "envs", "runlog", "loggers", "config"},
    "config": {"scheduler", "envs", "runlog", "loggers", "engine.rollout_types", "engine.trainer_config"},
}


def modules() -> dict[str, Path]:
    found = {p.stem: p for p in ROOT.glob("*.py")}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = p
    return found


def imports(path: Path, known: set[str]) -> list[tuple[str, list[str]]]:
    """(imported module, names taken from it) for every import of a project module."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module in known:
                out.append((node.module, [a.name for a in node.names]))
            for a in node.names:  # `from pkg import module`
                if f"{node.module}.{a.name}" in known:
                    out.append((f"{node.module}.{a.name}", []))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name in known]
    return out


def graph() -> dict[str, dict[str, list[str]]]:
    mods = modules()
    g = {}
    for name, path in mods.items():
        g[name] = {}
        for target, names in imports(path, set(mods)):
            if target != name:
                g[name].setdefault(target, []).extend(names)
    return g


def layer(module: str) -> str:
    return module.split(".")[0]


def test_the_graph_sees_the_project():
    g = graph()
    assert {"engine.coordinator", "scheduler.stepcore", "sim.cluster", "config", "runlog"} <= set(g)
    assert "scheduler.stepcore" in g["engine.coordinator"]


def test_no_upward_import():
    bad = []
    for src, targets in graph().items():
        allowed = ALLOWED.get(layer(src))
        if allowed is None:  # bench, examples, libra.py, tests sit on top
            continue
        for tgt in targets:
            if layer(tgt) != layer(src) and layer(tgt) not in allowed and tgt not in allowed:
                bad.append(f"{src} -> {tgt}")
    assert bad == []


def test_no_private_name_is_imported_across_modules():
    bad = [f"{src}: from {tgt} import {n}" for src, targets in graph().items() for tgt, names in targets.items()
           for n in names if n.startswith("_") and not n.startswith("__")]
    assert bad == []


def test_no_import_cycle():
    g = graph()
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in g.get(m, {}):
            if state.get(t) == "open":
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = "done"

    for m in sorted(g):
        if m not in state:
            visit(m)
    assert cycles == []
