"""scheduler/, steps/, envs/ and sim/ stay importable without torch, transformers, accelerate or multiprocessing;
the config layer, `python libra.py --help` and `--sim` run without importing them either.

Modules are discovered with pkgutil, so files others add later are checked too.
"""

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("scheduler", "steps", "envs", "sim")
HEAVY = ("torch", "transformers", "accelerate")


def _modules() -> list[str]:
    names = []
    for pkg in PACKAGES:
        if (ROOT / pkg / "__init__.py").exists():
            names.append(pkg)
            names += [m.name for m in pkgutil.walk_packages([str(ROOT / pkg)], prefix=pkg + ".")]
    return names


def test_discovers_the_scheduler_modules():
    mods = _modules()
    for name in ("scheduler.cmlfq", "scheduler.routers", "scheduler.planner", "scheduler.costmodel", "scheduler.systems"):
        assert name in mods


def test_fresh_interpreter_imports_no_heavy_module():
    code = (
        "import importlib, json, sys\n"
        f"for m in {_modules()!r}: importlib.import_module(m)\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def _direct_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_no_module_imports_multiprocessing_or_heavy_libs_directly():
    bad = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            hits = _direct_imports(path) & {"multiprocessing", *HEAVY}
            if hits:
                bad[str(path.relative_to(ROOT))] = sorted(hits)
    assert bad == {}


def _heavy_after(code: str) -> list[str]:
    probe = code + f"\nimport json, sys\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_config_layer_imports_no_heavy_module():
    assert _heavy_after("import config, runlog\nconfig.parse_args(['--bench', 'math', '--trainer.lr', '1e-4'])") == []


def test_libra_help_imports_no_heavy_module():
    code = ("import contextlib, io, libra\nbuf = io.StringIO()\n"
            "with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit): libra.main(['--help'])\n"
            "assert '--buckets.max-tokens' in buf.getvalue()")
    assert _heavy_after(code) == []


def test_libra_sim_imports_no_heavy_module(tmp_path):
    code = (f"import libra\nrc = libra.main(['--bench', 'math', '--sim', '--out', {str(tmp_path / 'sim')!r}])\n"
            "assert rc == 0, rc")
    assert _heavy_after(code) == []
    assert (tmp_path / "sim" / "summary.json").is_file()
