"""Hidden tests as probes: the graded process only reports values; the host decides what passes.

A pytest run of the hidden tests in the graded process can be forged from inside it (the package
runs in the same interpreter as the runner, so any record it writes, signed or not, proves only
that the process wrote it). So the hidden tests never run as tests there. Instead:

1. `load_suite` parses each hidden test file once (host side) and turns every `assert` into a
   *site* `_o(k, lambda: ACTUAL)`: the graded process evaluates only the actual side and
   reports its value (or the exception it raised). Everything a pass depends on stays here:
     - `assert ACTUAL == EXPECTED` (also `math.isclose`, `pytest.approx`, `is None`): the
       expected side is dropped from the probe; it is a literal kept here, or the value the
       reference run computed (below). A forger would have to know that value: it has to compute it.
     - every other assert (`!=`, `<`, `in`, `is`, `isinstance`, `or`, ...): a truth site
       `_o(k, lambda: bool(X))`, the leading `not`s stripped (kept here), and per grading
       a random half shown as `not X` instead: a constant `True` is right only by chance.
     - `with pytest.raises(E, match=...)`: a site over the block's body, shaped as a value site;
       E and the pattern stay here.
   Top-level `and`s are split into one site each; docstrings and names do not reach the probe.
2. The reference run (`reference_form`, once per suite) runs the same probes on the reference
   package (pristine project, or the external row's repo with its oracle patch) and also
   evaluates each site's expected side in a forked child, so that its side effects do not leak.
   For a fixed reference every site must hold there: else the test cannot be probed faithfully
   and grading refuses (ToolInfraError) instead of grading wrong.
3. Per grading, `envs/swe/probe_check.py` renders a fresh probe of the suite (names, site ids,
   negations, canaries) and decides each test from what the runner reports.

Supported test code: module-level `test_*` functions and `Test*` classes without `__init__`,
the `tmp_path` fixture, `pytest.raises` (with, or call form), `pytest.approx`, `math.isclose`.
Anything else of pytest (fixtures, parametrize, skip, marks) is refused when the suite loads
(`ProbeUnsupported`, with the file, line and construct), never graded loosely.

Invariants (tests/envs/swe/test_swe_probe.py): every project's pristine package passes its own probes and
every task's mutant fails exactly the tests pytest says it fails; the probe source holds no
expected value; unsupported pytest constructs are refused with the file and line.
"""

from __future__ import annotations

import ast
import copy
import sys
from dataclasses import dataclass, field
from pathlib import Path

SITE_FN = "_o"  # the runner's observation function, injected into every probe module
REF = object()  # an expected operand that only the reference run knows
APPROX_DEFAULT = (1e-6, 1e-12)  # pytest.approx's rel, abs
ISCLOSE_DEFAULT = (1e-9, 0.0)  # math.isclose's rel_tol, abs_tol


_TYPE_PARAMS = {"type_params": []} if sys.version_info >= (3, 12) else {}


class ProbeUnsupported(ValueError):
    """A hidden test uses a construct the probe grader cannot run faithfully; says which and where."""


@dataclass(frozen=True)
class Site:
    index: int  # position in the suite's site table
    kind: str  # "eq" | "truth" | "raises"
    line: int
    expect: object = None  # eq: the literal expected value, or REF
    tol: tuple[float, float, bool] | None = None  # eq: (rel, abs, symmetric) of math.isclose (True) / pytest.approx
    negate: bool = False  # truth: the assert wants X false
    exc: tuple[str, ...] = ()  # raises: accepted class names (last dotted part)
    match: str | None = None  # raises: regex the message must contain


@dataclass
class ProbeModule:
    path: str  # "tests/test_calc.py", relative to the grading dir
    tree: ast.Module  # the sandbox form, site ids as their table index
    tests: list[str]  # "test_x" or "TestC::test_x", in file order
    eq_tree: ast.Module | None = None  # the equality form: computed-expected eq sites as bool(actual == expected)


@dataclass
class Suite:
    modules: list[ProbeModule]
    sites: list[Site]
    reference_sources: dict[str, str]  # path -> reference form
    tests: list[str] = field(default_factory=list)  # ids "tests/test_calc.py::test_x"
    reference: dict | None = None  # test id -> Trace of the reference run (runner records)
    eq_sites: frozenset[int] = frozenset()  # eq sites whose expected side is computed (no tolerance)
    eq_tests: tuple[str, ...] = ()  # tests whose computed expected values hold the package's objects

    def set_reference(self, reference: dict) -> None:
        """Keep the reference run, and mark the tests that also need the equality run: where the
        package's own `__eq__` decides a comparison (its objects on the expected side), which the
        structural comparison of the probe run does not exercise (a flipped `__eq__` is a bug too)."""
        self.reference = reference
        self.eq_tests = tuple(t for t in self.tests if any(
            any(_holds_objects(o) for o in reference[t]["others"].get(k, [])) for k in self.eq_sites))


# ---- the transform ------------------------------------------------------------------------------


def _is_literal(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)
        return True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


class _Aliases:
    """How the module spells pytest and math (import pytest / from pytest import raises as r ...)."""

    def __init__(self, tree: ast.Module):
        self.modules: dict[str, str] = {}  # local name -> "pytest" | "math"
        self.names: dict[str, str] = {}  # local name -> "pytest.raises" | "pytest.approx" | "math.isclose"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in ("pytest", "math"):
                        self.modules[a.asname or a.name] = a.name
            elif isinstance(node, ast.ImportFrom) and node.module in ("pytest", "math"):
                for a in node.names:
                    self.names[a.asname or a.name] = f"{node.module}.{a.name}"

    def qualname(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.names.get(node.id) or (self.modules.get(node.id))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in self.modules:
            return f"{self.modules[node.value.id]}.{node.attr}"
        return None


def _exc_names(node: ast.AST, where: str) -> tuple[str, ...]:
    items = node.elts if isinstance(node, ast.Tuple) else [node]
    names = []
    for item in items:
        if isinstance(item, ast.Name):
            names.append(item.id)
        elif isinstance(item, ast.Attribute):
            names.append(item.attr)
        else:
            raise ProbeUnsupported(f"{where}: pytest.raises needs exception classes by name, got {ast.unparse(item)!r}")
    return tuple(names)


def _site_call(index: int, thunk: ast.expr, *others: ast.expr) -> ast.Call:
    return ast.Call(func=ast.Name(SITE_FN, ast.Load()), args=[ast.Constant(index), thunk, *others], keywords=[])


def _lambda(body: ast.expr) -> ast.Lambda:
    return ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None,
                                         defaults=[]), body=body)


class _Transformer(ast.NodeTransformer):
    """The sandbox form of one module: asserts and raises blocks become sites; pytest/math imports of
    what the sites replace are dropped; anything else of pytest is refused."""

    def __init__(self, path: str, sites: list[Site], aliases: _Aliases):
        self.path, self.sites, self.aliases = path, sites, aliases
        self.others: dict[int, ast.expr] = {}  # site index -> the expected operand the reference evaluates

    def where(self, node: ast.AST) -> str:
        return f"{self.path}:{getattr(node, 'lineno', '?')}"

    def add(self, node: ast.AST, kind: str, **kw) -> int:
        site = Site(index=len(self.sites), kind=kind, line=getattr(node, "lineno", 0), **kw)
        self.sites.append(site)
        return site.index

    # -- statements ---------------------------------------------------------------------------------
    def visit_Assert(self, node: ast.Assert):
        test = node.test  # an expression holds no statements: nothing inside it to transform first
        parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
        return [ast.copy_location(ast.Expr(self.site_for(p, node)), node) for p in parts]

    def site_for(self, expr: ast.expr, node: ast.AST) -> ast.Call:
        negate = False
        while isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
            expr, negate = expr.operand, not negate
        if not negate:
            eq = self.eq_site(expr, node)
            if eq is not None:
                return eq
        if isinstance(expr, ast.Compare) and len(expr.ops) == 1 and isinstance(expr.ops[0], (ast.NotEq, ast.NotIn, ast.IsNot)):
            # normalised to the positive operator: the probe shows `a == b`, never which one the test asserts
            positive = {ast.NotEq: ast.Eq, ast.NotIn: ast.In, ast.IsNot: ast.Is}[type(expr.ops[0])]()
            expr, negate = ast.Compare(left=expr.left, ops=[positive], comparators=expr.comparators), not negate
        k = self.add(node, "truth", negate=negate)
        return _site_call(k, _lambda(ast.Call(func=ast.Name("bool", ast.Load()), args=[expr], keywords=[])))

    def eq_site(self, expr: ast.expr, node: ast.AST) -> ast.Call | None:
        """`actual == expected` (or isclose/approx/is None) as a value site; None if it is not one."""
        tol = None
        if isinstance(expr, ast.Call) and self.aliases.qualname(expr.func) == "math.isclose" and len(expr.args) == 2:
            operands = list(expr.args)
            kw = {k.arg: k.value for k in expr.keywords}
            if set(kw) - {"rel_tol", "abs_tol"} or not all(_is_literal(v) for v in kw.values()):
                return None
            tol = (ast.literal_eval(kw["rel_tol"]) if "rel_tol" in kw else ISCLOSE_DEFAULT[0],
                   ast.literal_eval(kw["abs_tol"]) if "abs_tol" in kw else ISCLOSE_DEFAULT[1], True)
        elif isinstance(expr, ast.Compare) and len(expr.ops) == 1 and isinstance(expr.ops[0], ast.Eq):
            operands = [expr.left, expr.comparators[0]]
        elif (isinstance(expr, ast.Compare) and len(expr.ops) == 1 and isinstance(expr.ops[0], ast.Is)
              and isinstance(expr.comparators[0], ast.Constant) and expr.comparators[0].value is None):
            operands = [expr.left, expr.comparators[0]]
        else:
            return None
        for i, op in enumerate(operands):  # `x == pytest.approx(y, rel=, abs=)`: the approx side is expected
            if isinstance(op, ast.Call) and self.aliases.qualname(op.func) == "pytest.approx":
                if len(op.args) != 1 or set(k.arg for k in op.keywords) - {"rel", "abs"} or not all(
                        _is_literal(k.value) for k in op.keywords):
                    raise ProbeUnsupported(f"{self.where(node)}: pytest.approx needs one value and literal rel/abs")
                kw = {k.arg: ast.literal_eval(k.value) for k in op.keywords}
                tol = (kw.get("rel", APPROX_DEFAULT[0]), kw.get("abs", APPROX_DEFAULT[1]), False)
                operands[i] = op.args[0]
                actual, expected = operands[1 - i], operands[i]
                break
        else:
            actual, expected = self.pick_actual(operands)
        if actual is None:
            return None  # two literals: a constant assert, checked as a truth site
        if _is_literal(expected):
            k = self.add(node, "eq", expect=ast.literal_eval(expected), tol=tol)
        else:
            k = self.add(node, "eq", expect=REF, tol=tol)
            self.others[k] = expected
        return _site_call(k, _lambda(actual))

    @staticmethod
    def pick_actual(operands: list[ast.expr]) -> tuple[ast.expr | None, ast.expr | None]:
        """The side the package computes: not a literal, a computed expression before a bare name."""
        a, b = operands
        rank = [0 if _is_literal(x) else 1 if isinstance(x, ast.Name) else 2 for x in operands]
        if rank == [0, 0]:
            return None, None
        return (a, b) if rank[0] >= rank[1] else (b, a)

    def visit_With(self, node: ast.With):
        node = self.generic_visit(node)
        raises = [i for i, item in enumerate(node.items) if isinstance(item.context_expr, ast.Call)
                  and self.aliases.qualname(item.context_expr.func) == "pytest.raises"]
        if not raises:
            return node
        if len(node.items) != 1:
            raise ProbeUnsupported(f"{self.where(node)}: pytest.raises must be the only item of its `with`")
        call, target = node.items[0].context_expr, node.items[0].optional_vars
        k = self.raises_site(call, node)
        if len(node.body) == 1 and isinstance(node.body[0], ast.Expr):
            thunk: ast.expr = _lambda(node.body[0].value)
            pre: list[ast.stmt] = []
        else:  # a block: a local function, called by the site (names it binds stay local to it)
            name = f"_block_{k}"
            pre = [ast.FunctionDef(name=name, args=_lambda(ast.Constant(None)).args, body=node.body, decorator_list=[],
                                   returns=None, **_TYPE_PARAMS)]
            thunk = ast.Name(name, ast.Load())
        site = _site_call(k, thunk)
        stmt = ast.Assign(targets=[target], value=site) if target is not None else ast.Expr(site)
        return [ast.copy_location(s, node) for s in [*pre, stmt]]

    def raises_site(self, call: ast.Call, node: ast.AST) -> int:
        if not call.args:
            raise ProbeUnsupported(f"{self.where(node)}: pytest.raises without an exception class")
        kw = {k.arg: k.value for k in call.keywords}
        if set(kw) - {"match"} or ("match" in kw and not _is_literal(kw["match"])):
            raise ProbeUnsupported(f"{self.where(node)}: pytest.raises takes only a literal match= here")
        return self.add(node, "raises", exc=_exc_names(call.args[0], self.where(node)),
                        match=ast.literal_eval(kw["match"]) if "match" in kw else None)

    def visit_Expr(self, node: ast.Expr):
        value = node.value
        if isinstance(value, ast.Call) and self.aliases.qualname(value.func) == "pytest.raises" and len(value.args) >= 2:
            # call form: pytest.raises(E, fn, *args)
            k = self.raises_site(ast.Call(func=value.func, args=value.args[:1], keywords=value.keywords), node)
            thunk = _lambda(ast.Call(func=value.args[1], args=value.args[2:], keywords=[]))
            return ast.copy_location(ast.Expr(_site_call(k, thunk)), node)
        return self.generic_visit(node)

    def visit_Import(self, node: ast.Import):
        node.names = [a for a in node.names if a.name != "pytest"]
        return node if node.names else None

    def visit_ImportFrom(self, node: ast.ImportFrom):
        if node.module == "pytest":
            return None
        return node

    def refuse_leftover_pytest(self, tree: ast.Module) -> None:
        """What the sites did not replace (skip, fixture, marks, a raises outside `with`) cannot be probed."""
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and (self.aliases.modules.get(node.id) == "pytest"
                                               or self.aliases.names.get(node.id, "").startswith("pytest.")):
                raise ProbeUnsupported(f"{self.where(node)}: `{ast.unparse(node)}` is pytest outside an assert, "
                                       "pytest.raises or pytest.approx; the probe grader supports only those")


def _strip_docstrings(tree: ast.Module) -> None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]


def _tests_of(tree: ast.Module, path: str) -> list[str]:
    """Test names like pytest collects them; refuses test code the runner cannot call faithfully."""
    out = []

    def check_fn(fn: ast.FunctionDef, method: bool) -> None:
        where = f"{path}:{fn.lineno} {fn.name}"
        if fn.decorator_list:
            raise ProbeUnsupported(f"{where}: decorated tests (marks, parametrize, fixtures) are not supported")
        names = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
        params = names[1:] if method else names
        if set(params) - {"tmp_path"} or fn.args.vararg or fn.args.kwarg:
            raise ProbeUnsupported(f"{where}: only the tmp_path fixture is supported, got parameters {params}")

    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            check_fn(node, False)
            out.append(node.name)
        elif isinstance(node, ast.AsyncFunctionDef) and node.name.startswith("test_"):
            raise ProbeUnsupported(f"{path}:{node.lineno}: async tests are not supported")
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            methods = [f for f in node.body if isinstance(f, ast.FunctionDef)]
            if any(f.name in ("__init__", "setup_class", "teardown_class", "teardown_method") for f in methods) or node.decorator_list:
                raise ProbeUnsupported(f"{path}:{node.lineno}: class {node.name} needs set-up the probe grader does not run")
            for f in methods:
                if f.name.startswith("test_"):
                    check_fn(f, True)
                    out.append(f"{node.name}::{f.name}")
        elif isinstance(node, ast.FunctionDef) and node.name in ("setup_module", "teardown_module", "setup_function"):
            raise ProbeUnsupported(f"{path}:{node.lineno}: module set-up ({node.name}) is not supported")
        elif isinstance(node, ast.Assert):
            raise ProbeUnsupported(f"{path}:{node.lineno}: asserts at module level are not supported")
    return out


def _holds_objects(outcome) -> bool:
    if not (isinstance(outcome, list) and len(outcome) == 2 and outcome[0] == "v"):
        return False
    stack = [outcome[1]]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            if "O" in x or "R" in x or "E" in x:
                return True
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return False


class _EqualityForm(ast.NodeTransformer):
    """The sandbox form with each computed-expected eq site as the test wrote it: bool(actual == expected).

    It shows the expected side, so it runs in a sandbox run of its own, and the host reads only
    these sites from it: the probe run decides the values, this run whether the package agrees."""

    def __init__(self, others: dict[int, ast.expr], sites: list[Site]):
        self.others, self.sites = others, sites

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == SITE_FN and isinstance(node.args[0], ast.Constant):
            k = node.args[0].value
            if k in self.others and self.sites[k].tol is None:
                compare = ast.Compare(left=node.args[1].body, ops=[ast.Eq()], comparators=[copy.deepcopy(self.others[k])])
                node.args[1] = _lambda(ast.Call(func=ast.Name("bool", ast.Load()), args=[compare], keywords=[]))
        return node


class _ReferenceForm(ast.NodeTransformer):
    """The sandbox form plus, on each eq site with a computed expected side, a thunk for that side."""

    def __init__(self, others: dict[int, ast.expr]):
        self.others = others

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == SITE_FN and isinstance(node.args[0], ast.Constant):
            other = self.others.get(node.args[0].value)
            if other is not None:
                node.args.append(_lambda(copy.deepcopy(other)))
        return node


def load_suite(tests_dir: Path) -> Suite:
    """Parse and transform every `tests_dir/test_*.py` (ProbeUnsupported for what cannot be probed)."""
    sites: list[Site] = []
    modules, ref_sources, ids = [], {}, []
    eq_sites: set[int] = set()
    for file in sorted(Path(tests_dir).glob("test_*.py")):
        rel = f"tests/{file.name}"
        try:
            tree = ast.parse(file.read_text(), filename=rel)
        except SyntaxError as e:
            raise ProbeUnsupported(f"{rel}: the hidden test file does not parse ({e})") from None
        tests = _tests_of(tree, rel)
        _strip_docstrings(tree)
        tr = _Transformer(rel, sites, _Aliases(tree))
        tree = ast.fix_missing_locations(tr.visit(tree))
        tr.refuse_leftover_pytest(tree)
        eq_tree = ast.fix_missing_locations(_EqualityForm(tr.others, sites).visit(copy.deepcopy(tree)))
        modules.append(ProbeModule(path=rel, tree=tree, tests=tests, eq_tree=eq_tree))
        ref_sources[rel] = ast.unparse(_ReferenceForm(tr.others).visit(copy.deepcopy(tree)))
        ids += [f"{rel}::{t}" for t in tests]
        eq_sites |= {k for k in tr.others if sites[k].tol is None}
    return Suite(modules=modules, sites=sites, reference_sources=ref_sources, tests=ids, eq_sites=frozenset(eq_sites))
