"""The README and docs/ cannot drift from the tree: its layout, its size, its commands, every doc link.

- The README's `## Layout` section is one fenced block, one line per entry: a path, then what it
  is (`engine/rollout/   rollout engines ...`). It must list exactly the project's packages (every
  directory under engine, envs, scheduler, steps, sim, bench, examples that holds an `__init__.py`,
  as must every directory above it, so bench data such as envs/swe/projects/ is not one), the
  top-level modules (`*.py` at the root), `tests/` and `docs/`.
- The README stays a user's README: under 12,000 bytes, and it keeps the two commands CI and
  users run, `bash run.sh test` and `bash run.sh`.
- Every `docs/*.md` named in the README, in docs/, or in any `.py` file of the project exists;
  every relative link of the README and docs/ leads to a file or directory that exists, and an
  `#anchor` to a heading of its target; every repository path they name (`engine/...`,
  `tests/...`, ...) exists; every docs page is linked from the README; docs/benchmarks.md names
  every bench module.
Run `python -m pytest -q tests/test_readme.py`; a failure names what to add, remove or fix.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PACKAGE_ROOTS = ("engine", "envs", "scheduler", "steps", "sim", "bench", "examples")
TOP_DIRS = ("tests/", "docs/")
MAX_README_BYTES = 12_000
SKIP_DIRS = {"runs", "__pycache__", "node_modules"}  # and every hidden dir (.venv, .git)
DOC_REF = re.compile(r"docs/([A-Za-z0-9_.-]+\.md)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# a repository path in running text or code spans: starts at a top-level dir of the project
REPO_PATH = re.compile(r"(?<![\w./-])((?:engine|envs|scheduler|steps|sim|bench|examples|tests|docs)/[\w./-]*[\w/])"
                       r"(?![\w*/-]|\.\w)")  # a whole path; a glob (`adversarial_*.py`) is not one


def layout_entries(text: str) -> dict[str, str]:
    """name -> description of each line of the fenced block under `## Layout`."""
    m = re.search(r"^## Layout\s*$(.*?)^## ", text + "\n## ", re.M | re.S)
    assert m, "README.md has no '## Layout' section"
    block = re.search(r"^```[^\n]*\n(.*?)^```", m.group(1), re.M | re.S)
    assert block, "README.md's Layout section has no fenced block"
    entries = {}
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        name, _, desc = line.strip().partition(" ")
        assert name not in entries, f"README layout lists {name} twice"
        entries[name] = desc.strip()
    return entries


def project_packages() -> set[str]:
    """Every importable package of the project as `path/` (a dir whose parents are packages too)."""
    out = set()
    for top in PACKAGE_ROOTS:
        for init in (ROOT / top).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT).parts
            if all((ROOT.joinpath(*parts[:n]) / "__init__.py").exists() for n in range(1, len(parts) + 1)):
                out.add("/".join(parts) + "/")
    return out


def expected_layout() -> set[str]:
    return project_packages() | {p.name for p in ROOT.glob("*.py")} | set(TOP_DIRS)


def project_py_files() -> list[Path]:
    out = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).parts
        if not any(p.startswith(".") or p in SKIP_DIRS for p in rel[:-1]):
            out.append(path)
    return out


def doc_pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def strip_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (not `-` or `_`), spaces to `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", strip_fences(path.read_text()), re.M):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


# ---- the README ---------------------------------------------------------------------------------
def test_the_expected_layout_sees_the_project():
    want = expected_layout()
    assert {"engine/rollout/", "envs/sandbox/", "steps/", "bench/", "examples/"} <= want
    assert {"libra.py", "config.py", "runlog.py", "loggers.py", "tests/", "docs/"} <= want
    assert not any(p.startswith("envs/swe/projects") for p in want)


def test_readme_layout_lists_exactly_the_packages_and_modules():
    listed = layout_entries(README.read_text())
    want = expected_layout()
    missing, extra = sorted(want - set(listed)), sorted(set(listed) - want)
    assert (missing, extra) == ([], []), f"README layout: add {missing}, remove {extra}"
    assert [n for n, d in listed.items() if not d] == [], "every layout line says what the entry is"


def test_readme_is_a_short_users_readme():
    size = len(README.read_bytes())
    assert size < MAX_README_BYTES, f"README.md is {size} bytes; move detail into docs/ to stay under {MAX_README_BYTES}"


def test_readme_keeps_the_two_commands():
    text = README.read_text()
    assert re.search(r"bash run\.sh test\b", text), "README.md must show `bash run.sh test` (CI runs it)"
    assert re.search(r"bash run\.sh(?! test)", text), "README.md must show the plain `bash run.sh` (the main job)"


def test_readme_links_every_doc_page():
    text = README.read_text()
    unlinked = [p.name for p in doc_pages() if f"docs/{p.name}" not in text]
    assert doc_pages() and unlinked == []


# ---- docs/ --------------------------------------------------------------------------------------
def test_every_cited_doc_exists():
    cited: dict[str, set[str]] = {}
    for path in [README, *doc_pages(), *project_py_files()]:
        for name in DOC_REF.findall(path.read_text(errors="replace")):
            cited.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    assert {"design.md", "platform.md", "sandbox.md"} <= set(cited)
    missing = {name: sorted(where) for name, where in cited.items() if not (DOCS / name).is_file()}
    assert missing == {}


def test_every_relative_link_resolves():
    bad = []
    for page in [README, *doc_pages()]:
        for target in LINK.findall(strip_fences(page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            if not dest.exists():
                bad.append(f"{page.name}: {target} (no such path)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{page.name}: {target} (no heading #{anchor} in {dest.name})")
    assert bad == []


def test_every_repository_path_named_in_the_docs_exists():
    bad = []
    for page in [README, *doc_pages()]:
        for path in REPO_PATH.findall(page.read_text()):
            if not (ROOT / path).exists():
                bad.append(f"{page.name}: {path}")
    assert bad == []


def test_benchmarks_doc_names_every_bench_module():
    text = (DOCS / "benchmarks.md").read_text()
    modules = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem != "__init__")
    missing = [m for m in modules if f"bench.{m}" not in text and f"bench/{m}.py" not in text]
    assert modules and missing == []
    assert "bench/device_check.sh" in text
