"""swe tasks from a local verl-schema file (parquet/jsonl), and export of the built-in tasks to one.

Rows are read by `envs.datasets.load_verl_tasks` (prompt, reward_model.ground_truth, extra_info).
A swe row is one of two kinds, told apart by its `extra_info`:

  built-in  extra_info.swe_mutation: a mutation record of `envs/swe/mutate.py` (its `project` is
            one of envs/swe/projects/); ground_truth: {"patch_old", "patch_new", "failing_tests"}.
            `python -m envs.swe.env --export FILE.jsonl` writes these.
  external  extra_info.repo_dir: a local checkout of the buggy repository (absolute, or relative to
            the data file); extra_info.package: the directory in it whose contents are scored
            (the model's fix); extra_info.hidden_tests_dir (optional, default `<repo_dir>/tests`):
            the tests copied in at submit, as `tests/` (every test function in them must pass).
            ground_truth: {"file", "patch_old", "patch_new"} for the scripted
            oracle, or any string when there is none. R2E-Gym rows need their repository checked
            out locally and these fields added; their docker images are not used.

Algorithm: load the rows, resolve paths, check that the repository and package exist, and build
`Task`s whose `answer` is what `SweEpisode` reads (package, repo_dir, hidden_tests_dir, mutation,
patch). Task texts and tools come from envs/swe/spec.py, so this module never imports the env. Invariants (tests/envs/swe/test_envs_swe.py): exported built-in rows load back into
tasks an oracle solves; an external row with a missing repo_dir raises ValueError naming the row.
"""

from __future__ import annotations

import json
from pathlib import Path

from envs.swe import mutate as mut
from envs.base import Task
from envs.datasets import load_verl_tasks
from envs.swe.spec import TOOLS, system_text


def _ground_truth(task: Task) -> dict:
    gt = task.answer
    if isinstance(gt, str):
        try:
            gt = json.loads(gt)
        except json.JSONDecodeError:
            return {}
    return gt if isinstance(gt, dict) else {}


def _external_answer(task: Task, extra: dict, gt: dict, base: Path, row: int) -> dict:
    def path(key: str) -> Path:
        p = Path(str(extra[key]))
        return p if p.is_absolute() else base / p

    for key in ("repo_dir", "package"):
        if key not in extra:
            raise ValueError(f"swe data row {row} has no extra_info.{key}; a swe row needs extra_info.swe_mutation "
                             f"(built-in) or extra_info.repo_dir and extra_info.package (external repository)")
    repo = path("repo_dir")
    if not (repo / str(extra["package"])).is_dir():
        raise ValueError(f"swe data row {row}: package dir {repo / str(extra['package'])} does not exist; "
                         f"check extra_info.repo_dir and extra_info.package")
    hidden = path("hidden_tests_dir") if "hidden_tests_dir" in extra else repo / "tests"
    return {"package": str(extra["package"]), "repo_dir": str(repo), "hidden_tests_dir": str(hidden),
            "mutation": None, "patch_old": gt.get("patch_old"),
            "patch_new": gt.get("patch_new"), "failing_tests": gt.get("failing_tests", [])}


def load_rows(data_path: str, *, level: int | None = None) -> list[Task]:
    base = Path(data_path).resolve().parent
    out = []
    for i, task in enumerate(load_verl_tasks(data_path, bench="swe", tools=TOOLS, system=system_text())):
        extra, gt = task.meta.get("extra_info", {}), _ground_truth(task)
        if "swe_mutation" in extra:
            m = mut.Mutation(**extra["swe_mutation"])
            answer = {"package": m.project, "mutation": extra["swe_mutation"], "patch_old": gt["patch_old"], "patch_new": gt["patch_new"], "failing_tests": gt["failing_tests"]}
            meta = {"project": m.project, "file": m.file, "kind": m.kind, "line": m.line, "function": m.function}
        else:
            answer = _external_answer(task, extra, gt, base, i)
            meta = {"project": answer["package"], "file": gt.get("file", "")}
        if answer.get("patch_old") and meta["file"]:
            meta["bug_line"] = _line_of(answer, meta["file"])
        out.append(Task(task_id=task.task_id, bench="swe", messages=task.messages, tools=TOOLS, answer=answer,
                        level=task.level if level is None else level, meta={**task.meta, **meta}))
    return out


def _line_of(answer: dict, file: str) -> int:
    repo = Path(answer.get("repo_dir") or mut.PROJECTS_DIR / answer["package"])
    text = (repo / file).read_text()
    if answer.get("mutation"):
        text = mut.Mutation(**answer["mutation"]).apply(text)
    at = text.find(answer["patch_old"])
    return text[:at].count("\n") + 1 if at >= 0 else 1


def export_rows(tasks: list[Task], path: str) -> Path:
    """Write built-in tasks as verl-schema jsonl rows (one per task, in order)."""
    out = Path(path)
    with out.open("w", encoding="utf-8") as f:
        for t in tasks:
            a = t.answer
            row = {"data_source": "libra/swe", "prompt": list(t.messages), "ability": "coding",
                   "reward_model": {"style": "rule", "ground_truth": {k: a[k] for k in ("patch_old", "patch_new", "failing_tests")}},
                   "extra_info": {"index": t.task_id, "level": t.level, "swe_mutation": a["mutation"]}}
            f.write(json.dumps(row, sort_keys=True) + "\n")
    return out
