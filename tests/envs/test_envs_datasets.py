"""verl-schema loading: jsonl and parquet give the same tasks; missing fields name the row and field."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from envs.datasets import load_verl_tasks, read_rows
from envs.search import SEARCH_TOOL

ROWS = [
    {"prompt": [{"role": "system", "content": "sys"}, {"role": "user", "content": "q0"}], "reward_model": {"ground_truth": "a0"},
     "extra_info": {"index": "id-0", "level": 2}, "data_source": "dapo"},
    {"prompt": [{"role": "user", "content": "q1"}], "reward_model": {"ground_truth": ["a1", "b1"]}, "extra_info": {}, "data_source": "nq"},
]


def _load(path):
    return load_verl_tasks(path, bench="search", tools=(SEARCH_TOOL,), system="SYSTEM")


def test_jsonl_rows_become_tasks(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS) + "\n")
    t0, t1 = _load(path)
    assert (t0.task_id, t0.level, t0.answer, t0.messages[0]["content"], len(t0.messages)) == ("id-0", 2, "a0", "sys", 2)
    assert (t1.task_id, t1.level, t1.answer) == ("search-file-1", 0, ["a1", "b1"])
    assert t1.messages == ({"role": "system", "content": "SYSTEM"}, {"role": "user", "content": "q1"})
    assert t1.meta == {"data_source": "nq", "row": 1, "extra_info": {}} and t1.tools == (SEARCH_TOOL,)


def test_parquet_and_jsonl_give_the_same_tasks(tmp_path):
    rows = [dict(r, reward_model={"ground_truth": json.dumps(r["reward_model"]["ground_truth"])}) for r in ROWS]
    for r in rows:
        r["extra_info"] = {"index": r["extra_info"].get("index", "x"), "level": r["extra_info"].get("level", 0)}
    jl, pqt = tmp_path / "r.jsonl", tmp_path / "r.parquet"
    jl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), pqt)
    assert read_rows(pqt) == read_rows(jl)
    assert _load(pqt) == _load(jl)


@pytest.mark.parametrize(
    "row, msg",
    [
        ({"reward_model": {"ground_truth": "x"}}, r"row 2 has no field 'prompt'"),
        ({"prompt": [{"role": "user", "content": "q"}]}, r"row 2 has no field 'reward_model'"),
        ({"prompt": [{"role": "user", "content": "q"}], "reward_model": {"style": "rule"}}, r"row 2 has no field 'reward_model.ground_truth'"),
        ({"prompt": "just text", "reward_model": {"ground_truth": "x"}}, r"row 2 field 'prompt' must be a non-empty list"),
        ({"prompt": [{"role": "user", "content": "q"}], "reward_model": {"ground_truth": "x"}, "extra_info": [1]}, r"row 2 field 'extra_info' must be an object"),
        ([1, 2], r"row 2 is a list, not an object"),
    ],
)
def test_missing_or_bad_field_names_row_and_field(tmp_path, row, msg):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=msg) as e:
        _load(path)
    assert str(path) in str(e.value)


def test_file_errors(tmp_path):
    with pytest.raises(ValueError, match=r"does not exist; pass the path of a .parquet or .jsonl file"):
        read_rows(tmp_path / "nope.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"has suffix '.csv'; use .parquet or .jsonl"):
        read_rows(tmp_path / "x.csv")
    (tmp_path / "broken.jsonl").write_text('{"prompt": \n')
    with pytest.raises(ValueError, match=r"line 1 is not valid JSON \(Expecting value at character 13\)"):
        read_rows(tmp_path / "broken.jsonl")
