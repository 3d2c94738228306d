"""Per grading: a fresh probe of a suite for the sandbox, what its runner reports decoded, the verdict.

The suite (`envs/swe/probe.py`) holds every hidden test's sites and what each must show; this
module does what changes with every grading and what decides it:

1. `render`: fresh random site ids and test names, random negations of truth sites, and
   canaries: copies of random real tests under names like the others, placed among them, for
   which the host expects one site to FAIL. An honest package fails a canary; one that passes
   was answered by something that knows what the host expects.
2. `decode`: the runner's JSON report back to plain values (objects of the package as `Obj`,
   by class name and attributes), bounded in depth; anything malformed is a ValueError.
3. `check_test` compares, per test and site, every occurrence (a site in a loop occurs several
   times; the count must match the reference) and the test's end (no exception);
   `check_equality` checks the package's own `==` where its objects were compared.

Invariants (tests/envs/swe/test_swe_probe.py): a probe source holds no expected value and its names and
canaries change every grading; a constant answer, a forged record and an echo of the expected
side score 0; decoding refuses malformed and too deep reports.
"""

from __future__ import annotations

import ast
import copy
import json
import math
import random
import re
import secrets
from dataclasses import dataclass

from envs.swe.probe import REF, SITE_FN, Site, Suite

NUM_CANARIES = 2
MAX_DECODE_DEPTH = 64


# ---- per grading: what the sandbox gets -----------------------------------------------------------


@dataclass
class Rendering:
    sources: dict[str, str]  # path -> probe source
    plan: list[list]  # [[path, name], ...] in run order; names as in `sources`
    entries: list[tuple[str, bool]]  # per plan entry: (test id, is_canary)
    site_of: dict[int, int]  # shown site id -> suite site index
    flipped: set[int]  # suite site indexes of truth sites shown negated
    inverted: dict[int, int]  # plan position of a canary -> the suite site it must fail


class _Renamer(ast.NodeTransformer):
    """Shown site ids instead of table indexes; flipped truth sites negated."""

    def __init__(self, ids: dict[int, int], flipped: set[int]):
        self.ids, self.flipped = ids, flipped

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == SITE_FN and isinstance(node.args[0], ast.Constant):
            index = node.args[0].value
            node.args[0] = ast.Constant(self.ids[index])
            if index in self.flipped:  # lambda: bool(X) -> lambda: not X
                node.args[1].body = ast.UnaryOp(op=ast.Not(), operand=node.args[1].body.args[0])
        return node


def _opaque(rng: random.Random, used: set[str]) -> str:
    while True:
        name = f"test_{rng.getrandbits(40):010x}"
        if name not in used:
            used.add(name)
            return name


def render(suite: Suite, rng: random.Random | None = None, *, equality: bool = False) -> Rendering:
    """A fresh probe of `suite`: random site ids, names, negations, canaries and order.

    `equality`: the equality form instead, for `suite.eq_tests` only, without canaries."""
    rng = rng or random.Random(secrets.randbits(64))
    ids = rng.sample(range(10_000, 10_000 + 50 * (len(suite.sites) + 1)), len(suite.sites))
    site_ids = {s.index: ids[s.index] for s in suite.sites}
    flipped = {s.index for s in suite.sites if s.kind == "truth" and rng.random() < 0.5}
    used: set[str] = set()
    sources, plan_by_path = {}, {}
    reference = suite.reference or {}
    canary_pool = [t for t in suite.tests if _sites_in(reference.get(t))]
    canaries = [] if equality else rng.sample(canary_pool, min(NUM_CANARIES, len(canary_pool)))
    wanted = set(suite.eq_tests) if equality else set(suite.tests)
    inverted_site: dict[str, int] = {}
    for module in suite.modules:
        tree = copy.deepcopy(module.eq_tree if equality else module.tree)
        names = {}
        new_body = []
        for node in tree.body:
            new_body.append(node)
            if isinstance(node, ast.FunctionDef) and node.name in module.tests:
                names[node.name] = _opaque(rng, used)
                node.name = names[node.name]
            elif isinstance(node, ast.ClassDef) and any(t.startswith(f"{node.name}::") for t in module.tests):
                cls = _opaque(rng, used).replace("test_", "Test", 1)
                for f in node.body:
                    if isinstance(f, ast.FunctionDef) and f"{node.name}::{f.name}" in module.tests:
                        names[f"{node.name}::{f.name}"] = f"{cls}::" + _opaque(rng, used)
                        f.name = names[f"{node.name}::{f.name}"].split("::")[1]
                names[node.name] = cls
                node.name = cls
        for test in module.tests:
            test_id = f"{module.path}::{test}"
            if test_id not in wanted:
                continue
            plan_by_path.setdefault(module.path, []).append((names[test], test_id, False))
            if test_id in canaries and "::" not in test:  # a copy of a function among the others
                fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == names[test])
                twin = copy.deepcopy(fn)
                twin.name = _opaque(rng, used)
                new_body.insert(rng.randrange(len(new_body) + 1), twin)
                plan_by_path[module.path].append((twin.name, test_id, True))
                inverted_site[twin.name] = rng.choice(sorted(_sites_in(reference.get(test_id))))
        tree.body = new_body
        sources[module.path] = ast.unparse(ast.fix_missing_locations(_Renamer(site_ids, flipped).visit(tree)))
    order = [(path, name, test_id, canary) for path, items in plan_by_path.items() for name, test_id, canary in items]
    rng.shuffle(order)
    return Rendering(sources=sources, plan=[[p, n] for p, n, _, _ in order], entries=[(t, c) for _, _, t, c in order],
                     site_of={v: k for k, v in site_ids.items()}, flipped=flipped,
                     inverted={i: inverted_site[n] for i, (_, n, _, c) in enumerate(order) if c})


def _sites_in(trace) -> set[int]:
    return {k for k, v in (trace or {}).get("sites", {}).items() if v}


# ---- what the runner reports, decoded ---------------------------------------------------------------


@dataclass(frozen=True)
class Obj:
    """An object of the package (or any class without a plain value), by class name and attributes."""

    cls: str
    attrs: tuple


@dataclass(frozen=True)
class Opaque:
    cls: str
    text: str  # repr, for types without attributes (datetime, Fraction, ...)


@dataclass(frozen=True)
class EnumValue:
    cls: str
    name: str


@dataclass(frozen=True)
class Unhashable:
    value: str  # a dict key / set element that decoded to an unhashable value, by its JSON


def _hashable(v):
    try:
        hash(v)
        return v
    except TypeError:
        return Unhashable(json.dumps(v, default=repr, sort_keys=True))


def decode(x):
    """The runner's JSON dump of a value as a plain Python value (ValueError on anything malformed:
    the dump comes from a process the graded package controls)."""
    try:
        return _decode(x, 0)
    except (TypeError, AttributeError, IndexError, KeyError, OverflowError, RecursionError) as e:
        raise ValueError(f"malformed value ({type(e).__name__})") from None


def _decode(x, depth: int):
    if depth > MAX_DECODE_DEPTH:
        raise ValueError("value nested too deep")
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if not isinstance(x, dict) or not x:
        raise ValueError(f"not a value record: {str(x)[:60]}")
    tag = next(iter(x))
    v = x[tag]
    d = depth + 1
    match tag:
        case "I":
            return int(v, 16)
        case "L":
            return [_decode(i, d) for i in v]
        case "T":
            return tuple(_decode(i, d) for i in v)
        case "D":
            return {_hashable(_decode(k, d)): _decode(i, d) for k, i in v}
        case "S":
            return frozenset(_hashable(_decode(i, d)) for i in v)
        case "B":
            return bytes.fromhex(v)
        case "C":
            return complex(v[0], v[1])
        case "E":
            return EnumValue(str(v), str(x.get("n", "")))
        case "O":
            return Obj(str(v), tuple((str(k), _hashable(_decode(i, d))) for k, i in sorted(x.get("a", {}).items())))
        case "R" | "F" | "X" | "...":
            return Opaque(f"{tag}:{v}", str(x.get("r", "")))
    raise ValueError(f"unknown value tag {tag!r}")


def approx_equal(actual, expected, rel: float, abs_: float, symmetric: bool) -> bool:
    """math.isclose (symmetric: relative to the larger) or pytest.approx (relative to expected), elementwise."""
    a, b = actual, expected
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if not (math.isfinite(a) and math.isfinite(b)):
            return a == b
        scale = max(abs(a), abs(b)) if symmetric else abs(b)
        return abs(a - b) <= max(rel * scale, abs_)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and type(a) is type(b):
        return len(a) == len(b) and all(approx_equal(x, y, rel, abs_, symmetric) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(approx_equal(a[k], b[k], rel, abs_, symmetric) for k in a)
    return a == b


# ---- the verdict ------------------------------------------------------------------------------------


def site_holds(site: Site, outcome, other, flipped: bool) -> bool:
    """Whether one occurrence of `site` passed: `outcome` from the graded run, `other` the
    reference's expected operand (eq sites with REF)."""
    if not isinstance(outcome, list) or not outcome:
        return False
    if site.kind == "raises":
        if outcome[0] != "x" or len(outcome) != 3 or not isinstance(outcome[1], list):
            return False
        names = {str(n).rsplit(".", 1)[-1] for n in outcome[1]}
        return bool(names & set(site.exc)) and (site.match is None or re.search(site.match, str(outcome[2])) is not None)
    if outcome[0] != "v" or len(outcome) != 2:
        return False
    if site.kind == "truth":
        return type(outcome[1]) is bool and outcome[1] == (not site.negate) ^ flipped
    try:
        value = decode(outcome[1])
        expected = site.expect
        if expected is REF:
            if not isinstance(other, list) or len(other) != 2 or other[0] != "v":
                return False
            expected = decode(other[1])
        if site.tol is not None:
            return approx_equal(value, expected, *site.tol)
        return bool(value == expected)
    except (TypeError, ValueError, RecursionError, OverflowError):
        return False


def check_test(suite: Suite, got: dict, ref: dict, flipped: set[int], inverted: int | None = None) -> tuple[bool, str]:
    """(passed, why not) of one test run `got` against its reference trace `ref`.

    Traces: {"sites": {suite index: [outcome, ...]}, "others": {index: [outcome, ...]}, "end": outcome}.
    `inverted`: a canary's site that must fail (the canary "passes" only if it does).
    """
    if got.get("end") != ["ok"]:
        end = got.get("end")
        return False, "raised " + (str(end[1][0]) if isinstance(end, list) and len(end) > 1 and end[1] else "no end record")
    for index, ref_outcomes in ref["sites"].items():
        seen = got["sites"].get(index, [])
        site = suite.sites[index]
        if len(seen) != len(ref_outcomes):
            return False, f"line {site.line}: {len(seen)} checks ran, {len(ref_outcomes)} expected"
        others = ref["others"].get(index, [None] * len(seen))
        for n, (outcome, other) in enumerate(zip(seen, others)):
            holds = site_holds(site, outcome, other, index in flipped)
            if index == inverted and n == 0:
                holds = not holds
            if not holds:
                return False, f"line {site.line}: check failed"
    extra = set(got["sites"]) - set(ref["sites"])
    if extra:
        return False, f"checks at lines {sorted(suite.sites[i].line for i in extra)[:3]} ran that the reference never reached"
    return True, ""


def check_equality(suite: Suite, got: dict, ref: dict) -> tuple[bool, str]:
    """(passed, why not) of one test of the equality run: every computed-expected `==` held."""
    if got.get("end") != ["ok"]:
        return False, "raised in the equality run"
    for index in suite.eq_sites & set(ref["sites"]):
        seen = got["sites"].get(index, [])
        if len(seen) != len(ref["sites"][index]) or any(o != ["v", True] for o in seen):
            return False, f"line {suite.sites[index].line}: the package's == disagrees with the expected value"
    extra = set(got["sites"]) - set(ref["sites"])
    if extra:
        return False, f"checks at lines {sorted(suite.sites[i].line for i in extra)[:3]} ran that the reference never reached"
    return True, ""
