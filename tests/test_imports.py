"""The import graph: no cycle, no upward import, no private name imported across modules.

Every package states its boundary in its `__init__` docstring as a `May import:` line (the
packages it may import besides itself; a package listed means its own modules, not its
sub-packages), and this test reads those lines, so the docstring and the check cannot drift.
The top-level modules' rules are the TOP table below. The layers, lowest first: runlog, loggers
<- scheduler <- steps, envs <- sim / engine <- config <- bench / examples / libra.py / tests. Every
import counts, including those inside functions. Nor may engine/ run bench/ by name (a
`python -m bench.X` string), which the graph would not see. Run
`python -m pytest tests/test_imports.py -q`; a failure lists each bad edge.
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "scheduler", "steps", "envs", "sim", "bench", "examples")
TOP = {  # top-level module -> what it may import (bench, examples, libra.py and tests sit on top: anything)
    "runlog": set(),
    "loggers": set(),
    "config": {"scheduler", "envs", "runlog", "loggers", "engine.rollout.api", "engine.trainer.config"},
}
MAY_IMPORT = re.compile(r"^May import:(.*?)(?:^Must not import:|^\s*$|\Z)", re.M | re.S)


def libra_packages() -> list[str]:
    """Every importable package of the project (bench data such as envs/swe/projects/ is not one)."""
    out = []
    for init in sorted(ROOT.glob("*/**/__init__.py")):
        parts = init.parent.relative_to(ROOT).parts
        if parts[0] in PACKAGES and all((ROOT.joinpath(*parts[:n]) / "__init__.py").exists() for n in range(1, len(parts))):
            out.append(".".join(parts))
    return out


def boundaries() -> dict[str, set[str]]:
    """Package -> what its `__init__` docstring says it may import (packages and single modules)."""
    out = dict(TOP)
    for pkg in libra_packages():
        init = ROOT.joinpath(*pkg.split(".")) / "__init__.py"
        m = MAY_IMPORT.search(ast.get_docstring(ast.parse(init.read_text())) or "")
        if m:
            out[pkg] = {w for w in re.split(r"[\s,]+", m.group(1)) if w}
    return out


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


def owner(module: str, packages) -> str:
    """The deepest package with a stated boundary that holds `module` (or the module itself)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in packages:
            return ".".join(parts[:n])
    return parts[0]


def test_the_graph_sees_the_project():
    g = graph()
    assert {"engine.runtime.coordinator", "steps.core", "sim.cluster", "config", "runlog"} <= set(g)
    assert "steps.core" in g["engine.runtime.coordinator"]


def test_every_package_states_its_boundary():
    stated = boundaries()
    missing = [p for p in libra_packages() if p.split(".")[0] not in ("bench", "examples") and p not in stated]
    assert missing == []
    assert stated["engine.rollout"] >= {"engine"} and not stated["engine.rollout"] & {"engine.trainer", "engine.runtime"}
    assert not stated["engine.trainer"] & {"engine.rollout", "engine.runtime"}


def test_no_import_crosses_a_stated_boundary():
    stated = boundaries()
    bad = []
    for src, targets in graph().items():
        home = owner(src, stated)
        allowed = stated.get(home)
        if allowed is None:  # bench, examples, libra.py, tests sit on top
            continue
        for tgt in targets:
            there = owner(tgt, stated)
            if there != home and there not in allowed and tgt not in allowed:
                bad.append(f"{src} -> {tgt} ({home} may import only {sorted(allowed)})")
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


BENCH_NAME = re.compile(r"(?<![\w.])bench[./]\w")  # bench.profile, bench/profile.py


def strings_that_run(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every string constant but the docstrings, and of every `"-m", "bench..."` pair."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    out = [(n.lineno, n.value) for n in ast.walk(tree)
           if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]
    for seq in ast.walk(tree):
        if not isinstance(seq, (ast.List, ast.Tuple, ast.Call)):
            continue
        items = [e.value if isinstance(e, ast.Constant) else None for e in (seq.args if isinstance(seq, ast.Call) else seq.elts)]
        out += [(seq.lineno, f"-m {b}") for a, b in zip(items, items[1:]) if a == "-m" and str(b).startswith("bench")]
    return out


def test_the_engine_never_runs_a_benchmark():
    """No string under engine/ (docstrings aside) names a bench module or file: a `python -m bench.X`
    shell-out, an import by name, or a message telling the user to run one would make the runtime
    depend on bench/ where the import graph above cannot see it (the machine profile a run
    measures is engine/runtime/profile.py's)."""
    bad = []
    for path in sorted((ROOT / "engine").rglob("*.py")):
        for line, text in strings_that_run(ast.parse(path.read_text(), filename=str(path))):
            if BENCH_NAME.search(text) or text.startswith("-m bench"):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {text!r}")
    assert bad == []


def test_no_test_module_imports_another():
    """What tests share lives in a helper module (tests/*_helpers.py, scripted_model.py) or conftest.py: a test
    that imports another test module runs only when pytest happened to put that module's folder on sys.path."""
    tests = {p.stem for p in (ROOT / "tests").rglob("test_*.py")}
    bad = [f"{p.relative_to(ROOT)} imports {m}" for p in (ROOT / "tests").rglob("*.py")
           for m, _ in imports(p, tests) if m in tests]
    assert bad == []


def test_every_test_a_module_docstring_cites_exists():
    """A module's docstring names the tests that check its invariants; after a move they must still resolve."""
    bad = []
    for name, path in modules().items():
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        for cited in re.findall(r"\btests/[\w/*]+(?:\.py|/)", doc):
            if not list(ROOT.glob(cited.rstrip("/"))):
                bad.append(f"{name}: {cited}")
    assert bad == []
