"""Load tasks from local verl-schema files (parquet or jsonl) for users who have the real data sets.

Expected row fields (the verl RL data format used by Search-R1, DAPO-Math and R2E-Gym exports):

    prompt                   list of chat messages [{"role": "system"|"user", "content": str}, ...]  (required)
    reward_model.ground_truth  the checker's data: a string (DAPO-Math: the answer), a list of
                             accepted strings, or {"target": [...]} (Search-R1)              (required)
    extra_info               dict; "index" (or "id") names the task, "level" its difficulty, "demonstration"
                             an assistant message calling a tool, shown before other tasks (envs/demo.py)  (optional)
    data_source              free text kept in Task.meta                                     (optional)

Algorithm: read every row (pyarrow for .parquet, json per line for .jsonl/.json lines), check the
required fields, then build `Task`s with the env's tool schemas; when the prompt has no system
message, the env's system prompt (tool-call and answer format) is put first.

Invariants (tests/envs/test_envs_datasets.py): a row missing a field raises ValueError naming the
file, the row number and the field; parquet and jsonl with the same rows give the same tasks.
"""

from __future__ import annotations

import json
from pathlib import Path

from envs.base import Task
from envs.demo import DEMO_KEY


def read_rows(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--data {path} does not exist; pass the path of a .parquet or .jsonl file in the verl row schema.")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq  # only users with real data sets pay for the import

        return pq.read_table(path).to_pylist()
    if path.suffix in (".jsonl", ".json"):
        rows = []
        with path.open(encoding="utf-8") as f:
            for i, line in enumerate(f):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}: line {i + 1} is not valid JSON ({e.msg} at character {e.pos + 1}); "
                                     "write one JSON object per line.") from e
        return rows
    raise ValueError(f"data file {path} has suffix {path.suffix!r}; use .parquet or .jsonl.")


def _check_row(row: dict, i: int, where: str) -> None:
    """`i`: the row's 0-based index; messages count rows from 1, as an editor counts a .jsonl file's lines."""
    i += 1

    def missing(field: str) -> ValueError:
        return ValueError(f"{where}: row {i} has no field {field!r}; each row needs prompt (chat messages) and reward_model.ground_truth.")

    if not isinstance(row, dict):
        raise ValueError(f"{where}: row {i} is a {type(row).__name__}, not an object; each row needs prompt and reward_model.ground_truth.")
    if "prompt" not in row or row["prompt"] is None:
        raise missing("prompt")
    prompt = row["prompt"]
    if not isinstance(prompt, list) or not prompt or not all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
        raise ValueError(f"{where}: row {i} field 'prompt' must be a non-empty list of {{'role', 'content'}} messages; got {str(prompt)[:80]!r}.")
    rm = row.get("reward_model")
    if not isinstance(rm, dict):
        raise missing("reward_model")
    if rm.get("ground_truth") is None:
        raise missing("reward_model.ground_truth")
    if row.get("extra_info") is not None and not isinstance(row["extra_info"], dict):
        raise ValueError(f"{where}: row {i} field 'extra_info' must be an object; got {type(row['extra_info']).__name__}.")


def load_verl_tasks(path: str | Path, *, bench: str, tools: tuple[dict, ...], system: str) -> list[Task]:
    """Tasks from a verl-schema file; see the module docstring for the fields."""
    rows = read_rows(path)
    tasks = []
    for i, row in enumerate(rows):
        _check_row(row, i, str(path))
        extra = row.get("extra_info") or {}
        messages = tuple({"role": str(m["role"]), "content": str(m["content"])} for m in row["prompt"])
        if messages[0]["role"] != "system":
            messages = ({"role": "system", "content": system}, *messages)
        gt = row["reward_model"]["ground_truth"]
        tasks.append(Task(
            task_id=str(extra.get("index", extra.get("id", f"{bench}-file-{i}"))), bench=bench, messages=messages,
            tools=tools, answer=_jsonable(gt), level=int(extra.get("level", 0) or 0),
            meta={"data_source": str(row.get("data_source", "")), "row": i, "extra_info": _jsonable(extra),
                  **({DEMO_KEY: extra[DEMO_KEY]} if DEMO_KEY in extra else {})},
        ))
    return tasks


def _jsonable(value):
    # parquet gives numpy-free Python values already; this only normalises tuples and nested keys.
    return json.loads(json.dumps(value, default=str))
