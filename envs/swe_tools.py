"""The file tools of a `swe` episode, confined to its work dir: view, search, replace, test summary.

Algorithm: every tool first resolves the model's relative path with `confine` (no absolute
paths, no `..`, no symlink that resolves outside the work dir), then does plain text work on
the files. Pytest output is summarised: one status line first (PASSED/FAILED with the counts),
then the output, cut in the middle when it is longer than the budget.

Invariants (tests/test_envs_swe.py): a path outside the work dir is rejected with a message, never
read or written; `replace` edits only when `old` occurs exactly once; outputs stay within budget.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_SUMMARY_RE = re.compile(r"(\d+) (passed|failed|error|errors|skipped|deselected)")
_TEXT_SUFFIXES = (".py", ".txt", ".md", ".ini", ".cfg", ".toml", ".json")


class PathError(ValueError):
    """A model-given path that is not allowed; the message says why."""


def confine(root: Path, rel: str) -> Path:
    """The real path of `rel` inside `root`; PathError for absolute, `..` or escaping paths."""
    if not rel or rel.startswith(("/", "\\", "~")):
        raise PathError(f"path {rel!r} must be relative to the repository root, e.g. 'pkg/module.py'")
    if ".." in Path(rel).parts or "\0" in rel:
        raise PathError(f"path {rel!r} may not contain '..'")
    root_real = os.path.realpath(root)
    real = os.path.realpath(os.path.join(root_real, rel))
    if real != root_real and not real.startswith(root_real + os.sep):
        raise PathError(f"path {rel!r} leaves the repository (through a symlink)")
    return Path(real)


def _rel(root: Path, path: Path) -> str:
    return os.path.relpath(path, os.path.realpath(root))


def list_tree(root: Path, path: Path) -> str:
    files = sorted(
        _rel(root, Path(d) / f)
        for d, dirs, names in os.walk(path)
        for f in names
        if "__pycache__" not in d and f.endswith(_TEXT_SUFFIXES)
    )
    return f"{_rel(root, path)} is a directory with files:\n" + "\n".join(files)


def view(root: Path, rel: str, start_line: int | None, end_line: int | None, max_lines: int) -> str:
    path = confine(root, rel)
    if path.is_dir():
        return list_tree(root, path)
    if not path.is_file():
        raise PathError(f"no file {rel!r}; view '.' to list the repository")
    lines = path.read_text(errors="replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    start = max(1, start_line or 1)
    end = min(len(lines), end_line or start + max_lines - 1, start + max_lines - 1)
    if start > len(lines):
        raise PathError(f"start_line {start} is past the end of {rel} ({len(lines)} lines)")
    body = "\n".join(f"{i:4d}| {lines[i - 1]}" for i in range(start, end + 1))
    more = f"\n... ({len(lines) - end} more lines; pass start_line={end + 1})" if end < len(lines) else ""
    return f"{rel} lines {start}-{end} of {len(lines)}:\n{body}{more}"


def search(root: Path, pattern: str, rel: str | None, max_hits: int) -> str:
    """Plain substring search (case-sensitive) over the text files under `rel`."""
    if not pattern:
        raise PathError("pattern must be a non-empty string")
    base = confine(root, rel or ".")
    paths = [base] if base.is_file() else sorted(
        Path(d) / f for d, _, names in os.walk(base) for f in names if f.endswith(_TEXT_SUFFIXES) and "__pycache__" not in d
    )
    hits = []
    for path in paths:
        for i, line in enumerate(path.read_text(errors="replace").split("\n"), 1):
            if pattern in line:
                hits.append(f"{_rel(root, path)}:{i}: {line.strip()}")
    if not hits:
        return f"no matches for {pattern!r}"
    shown = hits[:max_hits]
    more = f"\n... {len(hits) - max_hits} more matches; narrow the pattern or the path" if len(hits) > max_hits else ""
    return f"{len(hits)} matches for {pattern!r}:\n" + "\n".join(shown) + more


def replace(root: Path, rel: str, old: str, new: str) -> str:
    path = confine(root, rel)
    if not path.is_file():
        raise PathError(f"no file {rel!r}; view '.' to list the repository")
    if not old:
        raise PathError("old must be a non-empty string copied from the file")
    text = path.read_text(errors="replace")
    count = text.count(old)
    if count == 0:
        raise PathError(f"old text not found in {rel}; view the file and copy the text exactly (indentation included)")
    if count > 1:
        lines = [text[: m.start()].count("\n") + 1 for m in re.finditer(re.escape(old), text)]
        raise PathError(f"old text occurs {count} times in {rel} (lines {lines}); include more surrounding text to make it unique")
    at = text.index(old)
    path.write_text(text[:at] + new + text[at + len(old) :])
    first = text[:at].count("\n") + 1
    last = first + new.count("\n")
    new_lines = (text[:at] + new + text[at + len(old) :]).split("\n")
    shown = "\n".join(f"{i:4d}| {new_lines[i - 1]}" for i in range(max(1, first - 1), min(len(new_lines), last + 1) + 1))
    return f"replaced 1 occurrence in {rel}; the region now reads:\n{shown}"


def count_results(output: str) -> dict[str, int]:
    """{'passed': n, 'failed': n, ...} from pytest's final summary line."""
    counts: dict[str, int] = {}
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    for line in reversed(lines):
        found = _SUMMARY_RE.findall(line)
        if found:
            for num, word in found:
                counts["error" if word == "errors" else word] = int(num)
            break
    return counts


def summarize_tests(output: str, returncode: int, max_chars: int) -> str:
    counts = count_results(output)
    parts = ", ".join(f"{n} {w}" for w, n in sorted(counts.items())) or "no test summary"
    status = "PASSED" if returncode == 0 else "NO TESTS RAN" if returncode == 5 else "FAILED"
    head = f"{status}: {parts} (pytest exit code {returncode})\n"
    body = output.strip()
    if len(body) > max_chars:
        half = max_chars // 2
        body = f"{body[:half]}\n... [{len(body) - max_chars} characters cut] ...\n{body[-half:]}"
    return head + body
