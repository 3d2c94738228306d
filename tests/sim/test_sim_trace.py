"""Trace format: record <-> spec round trip, loading errors, and fidelity replay of a synthetic trace."""

import json
import re

import pytest

from scheduler.api import OutcomeState
from sim.config import SimConfig
from sim.run import simulate
from sim.run import replay
from sim.trace import TraceWorkload, record_to_spec, spec_to_record
from sim.workload import SyntheticWorkload, TrajSpec, get_profile


def test_record_round_trips_every_spec_exactly():
    specs = SyntheticWorkload(get_profile("swe"), seed=1, num_steps=4).batch(2, 8, 4)
    for s in specs:
        rec = json.loads(json.dumps(spec_to_record(s, 2, [0, 3])))
        assert record_to_spec(rec) == s
        assert rec["turns"][0][0] == s.prompt_tokens and rec["num_tokens"] == s.total_tokens


def test_record_positions_follow_the_trace_format():
    spec = TrajSpec(request_id="r", prompt_id="t", prompt_tokens=10, turn_tokens=(5, 7),
                    tool_outcomes=(OutcomeState("bash", "small", "failure"),), tool_output_tokens=(3,),
                    tool_latency_s=(0.25,))
    rec = spec_to_record(spec, 0, [1])
    assert rec["turns"] == [[10, 15], [18, 25]]
    assert rec["tool_outcomes"] == [["bash", "small", "failure"]] and rec["num_tokens"] == 25


GOOD = {"step": 0, "request_id": "r", "task_id": "t", "num_tokens": 25, "prompt_len": 10, "turns": [[10, 15], [18, 25]],
        "tool_outcomes": [["bash", "small", "success"]], "tool_latency_s": [0.1], "instances": [0]}


@pytest.mark.parametrize("change,message", [
    ({"turns": [[5, 8]]}, "turns=[(5, 8)] must be non-empty [start, end) spans after prompt_len=10"),
    ({"turns": []}, "turns=[] must be non-empty"),
    ({"tool_latency_s": []}, "2 turns need 1 non-negative tool gaps, outcomes and latencies; got gaps=[3], 1 outcomes, 0 latencies"),
    ({"num_tokens": 20}, "turns end at 25 tokens past num_tokens=20"),
    ({"prompt_len": None}, "each record needs the fields listed in sim/trace.py"),
])
def test_malformed_records_raise_with_the_location(change, message):
    rec = dict(GOOD, **change)
    with pytest.raises(ValueError, match=re.escape(message)):
        record_to_spec(rec, "run/trajectories.jsonl:7")


def test_missing_trace_says_what_writes_it(tmp_path):
    with pytest.raises(ValueError, match="a real run writes trajectories.jsonl into its --out dir"):
        TraceWorkload.load(tmp_path)


def test_trace_workload_refuses_steps_it_does_not_have(tmp_path):
    (tmp_path / "trajectories.jsonl").write_text(json.dumps(GOOD) + "\n")
    wl = TraceWorkload.load(tmp_path)
    assert wl.num_steps == 1 and len(wl.batch(0, 99, 99)) == 1
    with pytest.raises(ValueError, match=re.escape("trace has 1 steps; step 1 asked for; set SimConfig.steps <= 1")):
        wl.batch(1, 1, 1)


def test_replay_of_a_simulated_run_reproduces_its_step_times(tmp_path):
    cfg = SimConfig(bench="search", hardware="cpu", model="tiny", num_devices=4, steps=3, prompts_per_step=4,
                    samples_per_prompt=4)
    simulate(cfg, "static", tmp_path)
    report = replay(tmp_path, system="static", num_devices=4, hardware="cpu", model="tiny")
    assert report["steps"] == 3
    assert report["predicted_step_s"] == pytest.approx(report["measured_step_s"], rel=1e-9)
    assert report["mape"] == pytest.approx(0.0, abs=1e-9)


def test_replay_reports_the_error_against_measured_times(tmp_path):
    cfg = SimConfig(bench="search", hardware="cpu", model="tiny", num_devices=4, steps=2, prompts_per_step=2,
                    samples_per_prompt=2)
    simulate(cfg, "static", tmp_path)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # pretend the real CPU run was twice as slow as predicted on every step
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(dict(r, step_s=2 * r["step_s"])) + "\n" for r in rows))
    report = replay(tmp_path, system="static", num_devices=4)
    assert report["mape"] == pytest.approx(0.5)
    assert report["measured_total_s"] == pytest.approx(2 * report["predicted_total_s"])
