"""Config: flags generated from the dataclasses, presets, validation messages, round trip."""

import dataclasses

import pytest

from config import DERIVED, LibraConfig, RunConfig, build_parser, load_config, parse_args


def test_every_field_has_a_flag():
    flags = {a.dest for a in build_parser()._actions}
    for section in dataclasses.fields(LibraConfig):
        sub = getattr(LibraConfig(), section.name)
        for f in dataclasses.fields(sub):
            if dataclasses.is_dataclass(getattr(sub, f.name)) or f"{section.name}.{f.name}" in DERIVED:
                continue
            assert f"{section.name}.{f.name}" in flags, f"no flag for {section.name}.{f.name}"


def test_flags_override_the_cpu_preset():
    cfg = parse_args(["--bench", "math", "--steps", "7", "--rollout.max-turns", "3", "--buckets.max-tokens",
                      "100,200", "--trainer.normalize-std", "false"], device_kind_of=lambda d: "cpu")
    assert cfg.run.bench == "math" and cfg.run.steps == 7
    assert cfg.rollout.max_turns == 3
    assert cfg.buckets.max_tokens == (100, 200)
    assert cfg.trainer.normalize_std is False
    assert cfg.rollout.max_new_tokens_per_turn == 128  # from the CPU preset for SmolLM2


def test_derived_fields_follow_their_source():
    cfg = parse_args(["--step.max-staleness", "2", "--rollout.temperature", "0.7", "--system", "libra-no-design"],
                     device_kind_of=lambda d: "cpu")
    assert (cfg.trainer.max_staleness, cfg.trainer.temperature) == (2, 0.7)
    assert "--trainer.max-staleness" not in build_parser().format_help()
    # finish-order peers bound staleness at admission (AReaL): their trainer takes a long group's lag. Libra's designs,
    # finish-order ones too, bound the trained lag at the design cap (steps/finish_order.py)
    for system, bound, *more in (("fully-async", None), ("partial-rollout", None), ("verl-async", 2), ("libra", 2),
                                 ("libra-no-design", 2), ("libra", 2, "--planner.design", "colocate"),
                                 ("libra", 4, "--planner.max-lag", "4"),
                                 ("libra", None, "--planner.bound-trained-lag", "false")):
        cfg = parse_args(["--system", system, "--step.max-staleness", "2", *more], device_kind_of=lambda d: "cpu")
        assert cfg.trainer.max_staleness == bound, (system, more)


@pytest.mark.parametrize("argv, demo_turns", [
    ([], 1),  # SmolLM2 is the default model: it needs a demonstration to call tools at all
    (["--model", "tiny"], 0),
    (["--data", "rows.jsonl"], 0),  # file tasks carry no oracle to demonstrate with
    (["--demo-turns", "0"], 0),
    (["--model", "tiny", "--demo-turns", "2"], 2),
])
def test_demo_turns_default_follows_the_model(argv, demo_turns):
    assert parse_args(argv, device_kind_of=lambda d: "cpu").run.demo_turns == demo_turns


def test_resolved_config_round_trips(tmp_path):
    cfg = parse_args(["--bench", "search", "--planner.ratio-band", "0.9,1.1"], device_kind_of=lambda d: "cpu")
    cfg.write(tmp_path / "config.json")
    assert load_config(tmp_path / "config.json") == cfg


@pytest.mark.parametrize("argv, message", [
    (["--bench", "chess"], r"--bench 'chess' is not one of \('swe', 'search', 'math', 'toy'\)"),
    (["--system", "fast"], r"--system 'fast' is not one of"),
    (["--nproc", "1"], r"--nproc 1: Libra needs >= 2 worker ranks"),
    (["--steps", "0"], r"--steps 0 must be >= 1"),
    (["--demo-turns", "-2"], r"--demo-turns -2 must be >= 0, or -1 for the model's default"),
    (["--step.samples-per-prompt", "1"], r"--step.samples-per-prompt 1 >= 2 \(GRPO compares samples within a group\)"),
    (["--sync.bucket-size-mb", "0"], r"--sync.bucket-size-mb 0.0 must be > 0"),
    (["--launch.start-method", "fork"], r"must be forkserver or spawn"),
    (["--rollout.top-p", "0"], r"--rollout.top-p 0.0: RolloutConfig.top_p=0.0 must be in \(0, 1\]"),
    (["--planner.design", "split"], r"--planner.design 'split': PlannerConfig: design='split' is none of \('auto', 'libra', "
                                    r"'libra-partial', 'colocate', 'libra-hybrid'\); auto lets the planner choose"),
    (["--planner.first-design", "auto"], r"first_design='auto' is none of \('prior', 'split'\); prior chooses libra's "
                                         r"design before step 1, split starts on the launcher's split"),
    (["--buckets.max-tokens", "200,100"], r"--buckets.max-tokens \(200, 100\): BucketsConfig: max_tokens=\(200, 100\) must be positive and strictly increasing"),
])
def test_bad_values_name_the_flag_and_the_fix(argv, message):
    with pytest.raises(ValueError, match=message):
        parse_args(argv, device_kind_of=lambda d: "cpu")


def test_libra_main_reports_config_errors_with_exit_code_2(capsys):
    import libra

    assert libra.main(["--bench", "chess"]) == 2


def test_run_config_is_keyword_only_and_frozen():
    with pytest.raises(TypeError):
        RunConfig("swe")
    with pytest.raises(dataclasses.FrozenInstanceError):
        RunConfig().steps = 3


def test_each_system_trains_stale_tokens_as_its_users_do_unless_a_flag_says_otherwise():
    from config import for_system

    assert parse_args(["--sim", "--system", "verl-async"]).trainer.off_policy == "bypass"
    assert parse_args(["--sim", "--system", "fully-async"]).trainer.off_policy == "decoupled"
    assert parse_args(["--sim", "--system", "verl-async", "--trainer.off-policy", "recompute"]).trainer.off_policy == "recompute"
    base = parse_args(["--sim"])
    verl = for_system(base, "verl-async")
    assert verl.run.system == "verl-async" and verl.trainer.off_policy == "bypass" and not verl.run.compare
    fully = for_system(base, "fully-async")
    assert fully.trainer.max_staleness is None  # finish-order: bounded at admission, derived again
    chosen = for_system(parse_args(["--sim", "--trainer.off-policy", "recompute"]), "verl-async")
    assert chosen.trainer.off_policy == "recompute"


def test_the_planner_prices_the_batch_the_engine_runs():
    from scheduler.layout import MAX_SEQS_PER_INSTANCE
    from sim.config import SimConfig

    gpu = parse_args(["--bench", "math"], device_kind_of=lambda d: "cuda")
    assert gpu.planner.max_batch == gpu.rollout.max_batch == MAX_SEQS_PER_INSTANCE == SimConfig().max_seqs_per_instance
    cpu = parse_args(["--bench", "math"], device_kind_of=lambda d: "cpu")
    assert cpu.planner.max_batch == cpu.rollout.max_batch == 32  # the CPU preset's engine
    flag = parse_args(["--rollout.max-batch", "48"], device_kind_of=lambda d: "cuda")
    assert flag.planner.max_batch == 48
    assert "--planner.max-batch" not in build_parser().format_help()


def test_the_launcher_resolves_tp_degrees_and_cost_model_once_and_rank_0_uses_them(monkeypatch):
    from engine.devices import DeviceInfo
    from engine.runtime import run

    cfg = parse_args(["--bench", "toy", "--model", "tiny", "--device", "cpu", "--planner.allowed-tp", "1,2,4",
                      "--planner.profile", "none"], device_kind_of=lambda d: "cpu")
    resolved, info, role_map = run.plan_placement(cfg)
    assert resolved.planner.allowed_tp == (1, 2)  # the tiny model's 2 KV heads do not split 4 ways
    cost = run.cost_model_for(resolved, DeviceInfo("cpu", 1))

    def again(*_a, **_k):
        raise AssertionError("rank 0 resolved again what the launcher resolved")

    monkeypatch.setattr(run, "valid_tp_degrees", again)
    monkeypatch.setattr(run, "cost_model_for", again)
    parts = run.build_parts(resolved, role_map, cost, None)
    try:
        assert parts.planner.cfg.allowed_tp == (1, 2) and parts.planner.cm is cost
    finally:
        parts.env.close()


def test_far_more_cpu_ranks_than_cores_is_a_warning_that_says_the_cost(monkeypatch, caplog):
    import logging

    from engine.devices import DeviceInfo
    from engine.runtime import run

    monkeypatch.setattr(run, "detect", lambda _kind: DeviceInfo("cpu", 2))
    cfg = parse_args(["--bench", "toy", "--model", "tiny", "--device", "cpu", "--nproc", "64"], device_kind_of=lambda d: "cpu")
    with caplog.at_level(logging.WARNING):
        run.plan_placement(cfg)
    assert "--nproc 64 on 2 CPU core(s): 65 processes share them" in caplog.text and "the CPU default is 4" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        run.plan_placement(parse_args(["--bench", "toy", "--model", "tiny", "--device", "cpu", "--nproc", "8"],
                                      device_kind_of=lambda d: "cpu"))
    assert "share them" not in caplog.text


def test_help_names_the_export_command_and_resume():
    text = build_parser().format_help()
    assert "python libra.py export runs/" in text and "libra.py export --help" in text and "--resume runs/" in text
