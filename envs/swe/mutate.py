"""Bug tasks for the `swe` benchmark: AST mutations of the bundled projects, verified by their tests.

Algorithm:
  1. Parse every non-`__init__` module of a project (`envs/swe/projects/<name>/<name>/*.py`) with
     `ast` and enumerate candidate mutations in AST walk order: operator swaps (`+`/`-`, `*`/`/`,
     ...), comparison flips (`<`/`<=`, `==`/`!=`, ...), `and`/`or` swaps, off-by-one and wrong
     integer constants, swapped call arguments, removed `if` branches.
  2. Each mutation is a text edit (start, end, replacement) of the original source at the node's
     own position, so the rest of the file keeps its formatting and the fix is a small, local
     `replace`. (Not `ast.unparse` of the whole module: that would reformat every line.)
  3. Shuffle a project's candidates with `random.Random(f"{seed}:{project}")`, then verify them in
     that order: copy the project to a temp dir, write the mutant, run its pytest suite. Keep a
     candidate only if pytest exits 1 (>= 1 failing test) within the timeout, and if a unique
     window of the mutant (one line, or a few lines for deletions) maps back to the original by
     one exact-string replace. Stop at `num_per_project` kept tasks.
  4. Write the index as sorted-key JSON with the source hash of every project, so one seed always
     gives the same bytes, and a stale index (a project edited later) is detected.

Invariants (tests/envs/swe/test_envs_swe_mutate.py): enumeration is deterministic; applying a task's edit
to the original and then its (patch_old -> patch_new) replace restores the original exactly;
regenerating a project for the committed seed reproduces its tasks in the committed index.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

PROJECTS_DIR = Path(__file__).resolve().parent / "projects"
TASKS_DIR = Path(__file__).resolve().parent / "tasks"
INDEX_VERSION = 1

_BINOP_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
                ast.FloorDiv: ast.Div, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult}
_CMP_SWAPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
              ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
            ast.Pow: "**", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==",
            ast.NotEq: "!=", ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not",
            ast.And: "and", ast.Or: "or"}


@dataclass(frozen=True, kw_only=True)
class GenerateConfig:
    seed: int = 0  # shuffles each project's candidates; same seed -> same index bytes
    num_per_project: int = 40  # verified tasks kept per project
    test_timeout_s: float = 10.0  # a mutant whose suite runs longer (a loop that never ends) is dropped
    num_workers: int = 2  # pytest runs in flight during verification

    def __post_init__(self):
        if self.num_per_project < 1:
            raise ValueError(f"num_per_project={self.num_per_project} must be >= 1; ask for at least one task per project")
        if self.test_timeout_s <= 0:
            raise ValueError(f"test_timeout_s={self.test_timeout_s} must be > 0; a suite needs ~0.3 s, use e.g. 20")
        if self.num_workers < 1:
            raise ValueError(f"num_workers={self.num_workers} must be >= 1; use 1 for a serial run")


@dataclass(frozen=True, kw_only=True)
class Mutation:
    project: str  # project dir name under projects/
    file: str  # module path relative to the project root, e.g. "calc/lexer.py"
    kind: str  # operator_swap | comparison_flip | boolean_swap | off_by_one | wrong_constant | swapped_args | removed_branch
    start: int  # char offset of the edit in the original source
    end: int  # char offset (exclusive)
    replacement: str  # text that replaces source[start:end] in the mutant
    line: int  # 1-based line of the edit in the original
    function: str  # enclosing "Class.method" or function name, "" at module level

    def apply(self, source: str) -> str:
        return source[: self.start] + self.replacement + source[self.end :]


def project_names() -> list[str]:
    return sorted(p.name for p in PROJECTS_DIR.iterdir() if (p / p.name / "__init__.py").is_file())


def module_files(project: str) -> list[str]:
    pkg = PROJECTS_DIR / project / project
    return sorted(f"{project}/{p.name}" for p in pkg.glob("*.py") if p.name != "__init__.py")


def project_hash(project: str) -> str:
    """sha256 over every file of the project (names and bytes), to detect a stale index."""
    digest = hashlib.sha256()
    root = PROJECTS_DIR / project
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _offsets(source: str) -> list[int]:
    starts, pos = [], 0
    for line in source.splitlines(keepends=True):
        starts.append(pos)
        pos += len(line)
    starts.append(pos)
    return starts


class _Collector(ast.NodeVisitor):
    def __init__(self, project: str, file: str, source: str):
        assert source.isascii(), f"{file}: non-ASCII source breaks ast column offsets"
        self.project, self.file, self.source = project, file, source
        self.line_starts = _offsets(source)
        self.scope: list[str] = []
        self.out: list[Mutation] = []

    def pos(self, lineno: int, col: int) -> int:
        return self.line_starts[lineno - 1] + col

    def add(self, kind: str, start: int, end: int, replacement: str, line: int) -> None:
        if self.source[start:end] != replacement:
            self.out.append(Mutation(project=self.project, file=self.file, kind=kind, start=start, end=end,
                                     replacement=replacement, line=line, function=".".join(self.scope)))

    def visit_FunctionDef(self, node):
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_ClassDef(self, node):
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_Raise(self, node):
        return  # error messages and exception types are not the behaviour under test

    def visit_JoinedStr(self, node):
        return  # f-string internals: formatting only, and their positions are unreliable before 3.12

    def _swap_gap(self, kind, left, right, old_op, new_op, line):
        """Replace the operator symbol in the text between two operand nodes."""
        start = self.pos(left.end_lineno, left.end_col_offset)
        end = self.pos(right.lineno, right.col_offset)
        gap = self.source[start:end]
        if gap.strip(" ()") == _SYMBOLS[old_op]:
            self.add(kind, start, end, gap.replace(_SYMBOLS[old_op], _SYMBOLS[new_op]), line)

    def visit_BinOp(self, node):
        new = _BINOP_SWAPS.get(type(node.op))
        if new is not None:
            self._swap_gap("operator_swap", node.left, node.right, type(node.op), new, node.lineno)
        self.generic_visit(node)

    def visit_Compare(self, node):
        operands = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            new = _CMP_SWAPS.get(type(op))
            if new is not None:
                self._swap_gap("comparison_flip", operands[i], operands[i + 1], type(op), new, node.lineno)
        self.generic_visit(node)

    def visit_BoolOp(self, node):
        new = ast.Or if isinstance(node.op, ast.And) else ast.And
        for left, right in zip(node.values, node.values[1:]):
            self._swap_gap("boolean_swap", left, right, type(node.op), new, node.lineno)
        self.generic_visit(node)

    def visit_Constant(self, node):
        value = node.value
        if type(value) is not int or node.lineno != node.end_lineno:
            return
        start, end = self.pos(node.lineno, node.col_offset), self.pos(node.end_lineno, node.end_col_offset)
        if self.source[start:end] != repr(value):
            return  # written as hex, with underscores, ...
        self.add("off_by_one", start, end, repr(value + 1), node.lineno)
        if value > 0:
            self.add("off_by_one", start, end, repr(value - 1), node.lineno)
        if value > 2:
            self.add("wrong_constant", start, end, repr(value * 2), node.lineno)

    def visit_Call(self, node):
        args = node.args
        for a, b in zip(args, args[1:]):
            if isinstance(a, ast.Starred) or isinstance(b, ast.Starred) or a.lineno != b.end_lineno:
                continue
            sa, ea = self.pos(a.lineno, a.col_offset), self.pos(a.end_lineno, a.end_col_offset)
            sb, eb = self.pos(b.lineno, b.col_offset), self.pos(b.end_lineno, b.end_col_offset)
            text_a, text_b = self.source[sa:ea], self.source[sb:eb]
            if text_a != text_b:
                self.add("swapped_args", sa, eb, text_b + self.source[ea:sb] + text_a, node.lineno)
        self.generic_visit(node)

    def _visit_body(self, body):
        for stmt in body:
            if isinstance(stmt, ast.If) and not stmt.orelse:
                self._remove_if(stmt, only=len(body) == 1)

    def _remove_if(self, node, only):
        line_text = self.source[self.line_starts[node.lineno - 1] : self.line_starts[node.lineno]]
        indent = line_text[: len(line_text) - len(line_text.lstrip())]
        if not line_text.lstrip().startswith("if ") or len(indent) != node.col_offset:
            return
        start, end = self.line_starts[node.lineno - 1], self.line_starts[node.end_lineno]
        self.add("removed_branch", start, end, f"{indent}pass\n" if only else "", node.lineno)

    def generic_visit(self, node):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                self._visit_body(block)
        super().generic_visit(node)


def enumerate_mutations(project: str) -> list[Mutation]:
    """Every candidate mutation of a project, in a fixed order (file, then AST walk)."""
    out = []
    for file in module_files(project):
        source = (PROJECTS_DIR / project / file).read_text()
        collector = _Collector(project, file, source)
        collector.visit(ast.parse(source))
        # a nested visit may add the same edit twice (e.g. via two parents): keep the first
        seen, unique = set(), []
        for m in sorted(collector.out, key=lambda m: (m.start, m.end, m.kind, m.replacement)):
            if (m.start, m.end, m.replacement) not in seen:
                seen.add((m.start, m.end, m.replacement))
                unique.append(m)
        out.extend(unique)
    return out


def fix_window(original: str, mutant: str, max_lines: int = 6) -> tuple[str, str] | None:
    """(old, new): a unique text in the mutant whose replacement by `new` restores the original."""
    a, b = original.split("\n"), mutant.split("\n")
    prefix = 0
    while prefix < min(len(a), len(b)) and a[prefix] == b[prefix]:
        prefix += 1
    suffix = 0
    while suffix < min(len(a), len(b)) - prefix and a[-1 - suffix] == b[-1 - suffix]:
        suffix += 1
    lo, hi_a, hi_b = prefix, len(a) - suffix, len(b) - suffix
    if hi_b - lo == 1 and hi_a - lo == 1:
        # one changed line: leave the indentation out so the model need not reproduce it
        old, new = b[lo].lstrip(), a[lo].lstrip()
        if mutant.count(old) == 1 and mutant.replace(old, new) == original:
            return old, new
    for _ in range(max_lines):
        old, new = "\n".join(b[lo:hi_b]), "\n".join(a[lo:hi_a])
        if old.strip() and mutant.count(old) == 1 and mutant.replace(old, new) == original:
            return old, new
        lo, hi_a, hi_b = max(0, lo - 1), min(len(a), hi_a + 1), min(len(b), hi_b + 1)
    return None


PYTEST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}  # autoload off: 1.3 s -> 0.25 s a run


def pytest_argv(*selectors: str) -> list[str]:
    """The argv every suite runs with (together with PYTEST_ENV): quiet, failures listed, no cache."""
    return [sys.executable, "-m", "pytest", "-q", "-rf", "--tb=short", "-p", "no:cacheprovider", *(selectors or ("tests",))]


def failed_tests(output: str) -> list[str]:
    """Test ids from pytest's `-rf` summary lines (`FAILED tests/x.py::test_y - ...`)."""
    out = []
    for line in output.splitlines():
        if line.startswith("FAILED "):
            out.append(line[len("FAILED ") :].split(" - ")[0].strip())
    return out


def _verify(mutation: Mutation, timeout_s: float) -> list[str] | None:
    """Failing test ids of the mutant, or None if it passes, errors out of pytest or times out."""
    with tempfile.TemporaryDirectory(prefix="libra-swe-gen-") as tmp:
        root = Path(tmp) / mutation.project
        shutil.copytree(PROJECTS_DIR / mutation.project, root, ignore=shutil.ignore_patterns("__pycache__"))
        path = root / mutation.file
        path.write_text(mutation.apply(path.read_text()))
        try:
            proc = subprocess.run(pytest_argv(), cwd=root, capture_output=True, text=True, timeout=timeout_s,
                                  env={**os.environ, **PYTEST_ENV})
        except subprocess.TimeoutExpired:
            return None
    failing = failed_tests(proc.stdout)
    return failing if proc.returncode == 1 and failing else None


def _test_docs(project: str) -> dict[str, str]:
    """{test id: first docstring line} for every test function of the project."""
    docs = {}
    for path in sorted((PROJECTS_DIR / project / "tests").glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                doc = (ast.get_docstring(node) or node.name.replace("_", " ")).strip().splitlines()[0]
                docs[f"tests/{path.name}::{node.name}"] = doc
    return docs


def _task_record(m: Mutation, failing: list[str], docs: dict[str, str]) -> dict | None:
    original = (PROJECTS_DIR / m.project / m.file).read_text()
    window = fix_window(original, m.apply(original))
    if window is None:
        return None
    digest = hashlib.sha256(f"{m.file}:{m.start}:{m.end}:{m.replacement}".encode()).hexdigest()[:10]
    return {"task_id": f"swe-{m.project}-{digest}", "mutation": asdict(m), "patch_old": window[0],
            "patch_new": window[1], "failing_tests": failing,
            "failing_docs": [docs.get(t, t) for t in failing]}


def generate_project(project: str, cfg: GenerateConfig, progress=None) -> list[dict]:
    """Verified task records of one project, in the seed's shuffled order."""
    candidates = enumerate_mutations(project)
    random.Random(f"{cfg.seed}:{project}").shuffle(candidates)
    docs, kept = _test_docs(project), []
    with ThreadPoolExecutor(cfg.num_workers) as pool:
        for i in range(0, len(candidates), cfg.num_workers):
            batch = candidates[i : i + cfg.num_workers]
            for m, failing in zip(batch, pool.map(lambda m: _verify(m, cfg.test_timeout_s), batch)):
                record = _task_record(m, failing, docs) if failing else None
                if record is not None and len(kept) < cfg.num_per_project:
                    kept.append(record)
            if progress is not None:
                progress(project, min(i + cfg.num_workers, len(candidates)), len(candidates), len(kept))
            if len(kept) >= cfg.num_per_project:
                break
    return kept


def generate_index(cfg: GenerateConfig, projects: list[str] | None = None, progress=None) -> dict:
    projects = project_names() if projects is None else projects
    tasks = []
    for project in projects:
        tasks.extend(generate_project(project, cfg, progress))
    return {"version": INDEX_VERSION, "seed": cfg.seed, "num_per_project": cfg.num_per_project,
            "projects": {p: project_hash(p) for p in projects}, "tasks": tasks}


def dump_index(index: dict) -> str:
    return json.dumps(index, sort_keys=True, indent=1) + "\n"


def index_path(seed: int) -> Path:
    return TASKS_DIR / f"index_seed{seed}.json"


def load_index(seed: int) -> dict:
    path = index_path(seed)
    if not path.is_file():
        raise ValueError(f"no swe task index for seed={seed} at {path}; build it with `python -m envs.swe.env --generate --seed {seed}`")
    index = json.loads(path.read_text())
    stale = [p for p, h in index["projects"].items() if project_hash(p) != h]
    if stale:
        raise ValueError(f"swe task index {path} is stale for projects {stale} (their files changed); "
                         f"rebuild it with `python -m envs.swe.env --generate --seed {seed}`")
    return index


def write_index(index: dict) -> Path:
    TASKS_DIR.mkdir(exist_ok=True)
    path = index_path(index["seed"])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(dump_index(index))
    os.replace(tmp, path)
    return path
