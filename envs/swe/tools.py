"""The file tools of a `swe` episode, confined to its work dir: view, search, replace, test summary.

Algorithm: every tool goes through envs/sandbox/hostfs.py: the model's relative path is walked from
the work dir without following links (no absolute paths, no `..`, no symlink, FIFO, socket or
device is ever opened), reads are capped in bytes, walks in entries and time (`Limits`), and a
`replace` writes a new file and renames it into place. Shown lines are cut at
`max_line_chars`; listings and search hits are capped. Pytest output is summarised: one status
line first (PASSED/FAILED with the counts), then the output, cut in the middle when long.

Invariants (tests/envs/swe/test_envs_swe.py, tests/envs/sandbox/test_adversarial.py): a path outside the work dir is
rejected with a message, never read or written; `replace` edits only when `old` occurs exactly
once, and on a directory (`.` included) is a message, never an exception; a selector with a NUL
byte is refused before anything runs; every output stays within its caps, whatever the files hold;
no call blocks on a FIFO. The model sees no token cap here: engine/rollout/engine.py cuts every tool
output to the trajectory's token budget.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from envs.sandbox import hostfs
from envs.sandbox.hostfs import HostFsError as PathError

__all__ = ["Limits", "PathError", "view", "search", "replace", "check_selector", "count_results", "summarize_tests"]

_SUMMARY_RE = re.compile(r"(\d+) (passed|failed|error|errors|skipped|deselected)")
_TEXT_SUFFIXES = (".py", ".txt", ".md", ".ini", ".cfg", ".toml", ".json")


@dataclass(frozen=True, kw_only=True)
class Limits:
    view_max_lines: int = 120  # lines one view_file call shows at most
    search_max_hits: int = 40  # matches one search call lists at most
    max_line_chars: int = 400  # a shown line longer than this is cut
    max_listing_entries: int = 300  # files one directory listing names at most
    max_file_bytes: int = 1 << 20  # bytes read of one file (a longer one is refused for replace, cut for view/search)
    max_walk_entries: int = 20_000  # directory entries one listing or search looks at
    max_search_bytes: int = 8 << 20  # bytes one search reads in all
    host_timeout_s: float = 2.0  # wall limit of one host-side listing or search


def _cut(line: str, max_chars: int) -> str:
    return line if len(line) <= max_chars else f"{line[:max_chars]}... [{len(line) - max_chars} more characters]"


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _listing(root: Path, rel: str, lim: Limits) -> str:
    files, cut = hostfs.walk_files(root, rel, max_entries=lim.max_walk_entries,
                                   deadline=time.monotonic() + lim.host_timeout_s, suffixes=_TEXT_SUFFIXES)
    shown = files[: lim.max_listing_entries]
    more = len(files) - len(shown)
    tail = f"\n... {more} more files; view a subdirectory" if more > 0 else ""
    tail += "\n... (listing cut short: too many entries)" if cut else ""
    return f"{rel} is a directory with files:\n" + "\n".join(_cut(f, lim.max_line_chars) for f in shown) + tail


def view(root: Path, rel: str, start_line: int | None, end_line: int | None, lim: Limits) -> str:
    what = hostfs.kind(root, rel)
    if what == "dir":
        return _listing(root, rel, lim)
    if what == "missing":
        raise PathError(f"no file {rel!r}; view '.' to list the repository")
    data, longer = hostfs.read_file(root, rel, lim.max_file_bytes)
    lines = _text(data).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    start = max(1, start_line or 1)
    end = min(len(lines), end_line or start + lim.view_max_lines - 1, start + lim.view_max_lines - 1)
    if start > len(lines):
        raise PathError(f"start_line {start} is past the end of {rel} ({len(lines)} lines)")
    body = "\n".join(f"{i:4d}| {_cut(lines[i - 1], lim.max_line_chars)}" for i in range(start, end + 1))
    more = f"\n... ({len(lines) - end} more lines; pass start_line={end + 1})" if end < len(lines) else ""
    big = f"\n... (file longer than {lim.max_file_bytes} bytes; the rest is not shown)" if longer else ""
    return f"{rel} lines {start}-{end} of {len(lines)}:\n{body}{more}{big}"


def search(root: Path, pattern: str, rel: str | None, lim: Limits) -> str:
    """Plain substring search (case-sensitive) over the text files under `rel`."""
    if not pattern:
        raise PathError("pattern must be a non-empty string")
    rel = rel or "."
    deadline = time.monotonic() + lim.host_timeout_s
    what = hostfs.kind(root, rel)
    if what == "missing":
        raise PathError(f"no file or directory {rel!r}; view '.' to list the repository")
    if what == "file":
        paths, cut = [rel], False
    else:
        paths, cut = hostfs.walk_files(root, rel, max_entries=lim.max_walk_entries, deadline=deadline, suffixes=_TEXT_SUFFIXES)
    hits, num_hits, budget = [], 0, lim.max_search_bytes
    for path in paths:
        if budget <= 0 or time.monotonic() > deadline:
            cut = True
            break
        try:
            data, _ = hostfs.read_file(root, path, min(lim.max_file_bytes, budget))
        except PathError:
            continue  # swapped for a link or a FIFO since the walk: skip it
        budget -= len(data)
        for i, line in enumerate(_text(data).split("\n"), 1):
            if pattern in line:
                num_hits += 1
                if len(hits) < lim.search_max_hits:
                    hits.append(f"{path}:{i}: {_cut(line.strip(), lim.max_line_chars)}")
    note = "\n... (search cut short: too many files or bytes; narrow the path)" if cut else ""
    if not hits:
        return f"no matches for {pattern!r}{note}"
    more = f"\n... {num_hits - len(hits)} more matches; narrow the pattern or the path" if num_hits > len(hits) else ""
    return f"{num_hits} matches for {pattern!r}:\n" + "\n".join(hits) + more + note


def replace(root: Path, rel: str, old: str, new: str, lim: Limits, owner: tuple[int, int] | None = None) -> str:
    if not old:
        raise PathError("old must be a non-empty string copied from the file")
    what = hostfs.kind(root, rel)
    if what == "missing":
        raise PathError(f"no file {rel!r}; view '.' to list the repository")
    if what == "dir":
        raise PathError(f"{rel!r} is a directory; replace edits one file: view {rel!r} to list its files")
    data, longer = hostfs.read_file(root, rel, lim.max_file_bytes)
    if longer:
        raise PathError(f"{rel} is longer than {lim.max_file_bytes} bytes; only smaller files can be edited")
    text = _text(data)
    count = text.count(old)
    if count == 0:
        raise PathError(f"old text not found in {rel}; view the file and copy the text exactly (indentation included)")
    if count > 1:
        lines = [text[: m.start()].count("\n") + 1 for m in re.finditer(re.escape(old), text)][:20]
        raise PathError(f"old text occurs {count} times in {rel} (lines {lines}); include more surrounding text to make it unique")
    at = text.index(old)
    updated = text[:at] + new + text[at + len(old):]
    hostfs.write_file(root, rel, updated.encode("utf-8"), owner)
    first = text[:at].count("\n") + 1
    last = first + new.count("\n")
    new_lines = updated.split("\n")
    shown = "\n".join(f"{i:4d}| {_cut(new_lines[i - 1], lim.max_line_chars)}"
                      for i in range(max(1, first - 1), min(len(new_lines), last + 1, first + lim.view_max_lines) + 1))
    return f"replaced 1 occurrence in {rel}; the region now reads:\n{shown}"


def check_selector(root: Path, selector: str) -> None:
    """PathError unless `selector` names a test path (or id) inside the work dir."""
    if "\0" in selector:
        raise PathError(f"selector {selector!r} may not contain a NUL byte; e.g. 'tests/test_x.py::test_y'")
    if selector.startswith("-"):
        raise PathError(f"selector {selector!r} must be a test path or id like 'tests/test_x.py::test_y', not an option")
    if hostfs.kind(root, selector.split("::")[0]) not in ("file", "dir"):
        raise PathError(f"no test file or directory {selector.split('::')[0]!r}; e.g. 'tests/test_x.py'")


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
