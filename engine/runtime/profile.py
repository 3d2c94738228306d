"""Profile this machine for the planner and the simulator: `python -m engine.runtime.profile --model tiny`.

Measures, with the runtime's own code on the machine it runs on, and writes a
`scheduler.profile.HardwareProfile` JSON (default `profiles/<model>-<device>.json`):
  - decode / prefill: the rollout engine's `BatchRunner` (engine/rollout/runner.py) on one rank:
    a request of C prompt tokens is prefilled (timed), its KV is copied to B rows, and decode
    steps of the B-row batch are timed (median of `--decode-steps`), for each B and C of the grid;
  - training: `Trainer.train_step` tokens/s on 1..`--max-trainer-ranks` gloo ranks (`train_rate`,
    also bench/trainer.py's), and there the trainer's full-weight gather (`Trainer.full_state_dict`)
    that every sync starts with, and a trainer rank's peak RSS (a CPU run's ranks share the host's
    memory: the planner keeps its layouts within it); a rollout rank's RSS is the decode's at a batch of
    16 x 1,024 tokens (`ROLLOUT_RSS_POINT`);
  - weight sync and group rebuild: `engine.runtime.weights` transfer of the model's bytes and
    `GroupManager.apply` of a new role map over `--ranks` gloo ranks;
  - reconfiguration: a role switch as the coordinator runs it, less the drain (tool calls in
    flight, which the planner adds from the tool latencies it has seen): the old trainer saves
    its hand-off (`save_handoff`, model + Adam moments), the groups are rebuilt, a two-rank
    trainer group builds its trainer and loads it (`load_handoff`), one weight sync;
  - step overhead: mailbox round trips over the torch TCPStore (engine/runtime/control.py), two per
    step on the training path (Train -> Trained, Sync -> Synced), plus the coordinator's poll period.

`--quick` (what a run's `--planner.profile auto` measures once per machine and model,
engine/runtime/profile_cache.py): a coarser decode grid with fewer repetitions, and one two-rank
spawn for every trainer figure instead of one per rank count plus one for the hand-off: rank 0
alone trains (tokens/s and gather on 1 rank) and saves the hand-off, then both ranks build an FSDP
trainer, load it (the switch's new group) and train (tokens/s and gather on 2 ranks; more ranks
are extrapolated); the sync is timed once. SmolLM2 on 2 busy cores: ~70 s instead of ~5 minutes.

A run measures in a subprocess (`python -m engine.runtime.profile --quick`), never in the launcher:
the profile sets torch to one thread, loads the model, and spawns its own ranks through the
forkserver with its own preloads, none of which may stay behind in the launcher (its forkserver,
its threads, its peak RSS in summary.json), and its progress lines are read as they come.
`python -m bench.profile` is the same CLI.

Last line: `profile: PATH`. Pass the file to a run with `--planner.profile PATH`, to the
simulator with `SimConfig(profile=PATH)`, and to `python -m bench.fidelity --profile PATH`. On a
loaded 2-core box every figure is noisy; run it when the machine is quiet.

Invariants (tests/engine/runtime/test_profile_cache.py): a real `--quick` of the tiny model writes
a profile `HardwareProfile.load` reads, with `meta["quick"]` set; a failure exits non-zero with
the error as its last line of stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import psutil
import torch

from engine.devices import DeviceInfo
from engine.runtime.launch import PRELOAD, spawn
from scheduler.profile import HANDOFF_RANKS, HardwareProfile


_T0 = time.perf_counter()
ROLLOUT_RSS_POINT = (16, 1024)  # (batch, context) a CPU run's rollout rank is sized at: the quick grid's largest point


def _peak_rss_bytes() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0


def _say(line: str) -> None:
    """A progress line with the seconds since the profile started (a caller reads them as they come)."""
    print(f"[{time.perf_counter() - _T0:5.0f} s] {line}", flush=True)


def _median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def synthetic_batch(num_trajectories: int, seq_len: int, vocab_size: int, version: int):
    """GRPO groups of 4 random trajectories of `seq_len` tokens, half prompt, alternating rewards."""
    from engine.trajectory import Trajectory

    gen = torch.Generator().manual_seed(1234 + version)
    prompt_len = seq_len // 2
    out = []
    for i in range(num_trajectories):
        ids = torch.randint(0, vocab_size, (seq_len,), generator=gen).tolist()
        k = seq_len - prompt_len
        out.append(Trajectory(request_id=f"b{version}-{i}", task_id=f"t{i // 4}", group_id=f"g{version}-{i // 4}",
                              prompt_len=prompt_len, token_ids=ids, loss_mask=[0] * prompt_len + [1] * k,
                              logprobs=[0.0] * prompt_len + [-5.0] * k, versions=[-1] * prompt_len + [version] * k,
                              reward=float(i % 2)))
    return out


def _train_rank(ctx, model_spec: str, num_ranks: int, steps: int, num_trajectories: int, seq_len: int,
                micro_batch_tokens: int):
    """One warm-up step, `steps` timed ones, then the median of three full-weight gathers."""
    import torch.distributed as dist

    from engine.models import load_policy
    from engine.trainer.trainer import Trainer, TrainerConfig

    model, tokenizer = load_policy(model_spec, device="cpu")
    group = dist.group.WORLD if num_ranks > 1 else None
    trainer = Trainer(model, TrainerConfig(lr=1e-6, micro_batch_tokens=micro_batch_tokens), group=group, device="cpu")
    vocab = len(tokenizer)
    trainer.train_step(synthetic_batch(num_trajectories, seq_len, vocab, 0), 0)  # warm-up
    if group is not None:
        dist.barrier()
    start = time.perf_counter()
    for step in range(1, steps + 1):
        metrics = trainer.train_step(synthetic_batch(num_trajectories, seq_len, vocab, step), step)
    elapsed = time.perf_counter() - start
    gather_s = []  # what a weight sync pays on the trainer before it sends: the full weights on every trainer rank
    for _ in range(3):
        t0 = time.perf_counter()
        trainer.full_state_dict()
        gather_s.append(time.perf_counter() - t0)
    return {"elapsed_s": elapsed, "tokens": metrics["train/tokens"] * steps, "loss": metrics["train/loss"],
            "params": sum(p.numel() for p in model.parameters()), "gather_s": sorted(gather_s)[1],
            "rss_bytes": _peak_rss_bytes()}


def train_rate(model_spec: str, num_ranks: int, *, steps: int, num_trajectories: int, seq_len: int,
               micro_batch_tokens: int, threads_per_rank: int, timeout_s: float) -> dict:
    """`Trainer.train_step` on `num_ranks` gloo ranks (FSDP2 past one): tokens/s over the slowest rank's time,
    every token of the batch counted, and the slowest rank's full-weight gather."""
    cores = os.cpu_count() or 1
    results = spawn(
        _train_rank, num_ranks, (model_spec, num_ranks, steps, num_trajectories, seq_len, micro_batch_tokens),
        device_info=DeviceInfo("cpu", cores), threads_per_rank=threads_per_rank, timeout_s=timeout_s,
        preload=PRELOAD + ["engine.trainer.trainer", "engine.models"],
    )
    slowest = max(r["elapsed_s"] for r in results)
    return {"tokens_per_s": results[0]["tokens"] / slowest, "elapsed_s": slowest, "loss": results[0]["loss"],
            "params": results[0]["params"], "gather_s": max(r["gather_s"] for r in results),
            "rss_bytes": max(r["rss_bytes"] for r in results)}


def measure_rollout(model_spec: str, batches: list[int], contexts: list[int], decode_steps: int, prefill_repeats: int = 3):
    """(decode points, prefill points, the model's parameters, a rollout rank's RSS: at the largest grid point within
    `ROLLOUT_RSS_POINT`, with that batch's KV live; the peak over the whole grid, 5.7 GB for SmolLM2 at 32 x 1,536
    tokens with each row's KV cloned, was 2.5x what its rollout ranks held in a run)."""
    from engine.models import load_policy
    from engine.rollout.runner import BatchRunner

    torch.set_num_threads(1)  # a rollout rank runs one thread (LaunchConfig.threads_per_rank)
    model, tok = load_policy(model_spec, device="cpu")
    model.eval()
    vocab = len(tok)
    decode, prefill, rss = [], [], 0.0
    with torch.no_grad():
        for c in contexts:
            ids = torch.randint(0, vocab, (c,)).tolist()
            runner = BatchRunner(model, device="cpu")
            t0 = time.perf_counter()
            runner.prefill(["r0"], [ids])
            prefill.append((c, time.perf_counter() - t0))
            _say(f"prefill {c:>5} tokens: {prefill[-1][1]:.2f} s")
            kv, n = runner.parked["r0"]
            for b in batches:
                runner = BatchRunner(model, device="cpu")
                runner.parked = {f"r{i}": ([(k.clone(), v.clone()) for k, v in kv], n) for i in range(b)}
                runner.admit([f"r{i}" for i in range(b)])
                runner.decode([1] * b)  # warm-up
                decode.append((b, c, _median_s(lambda: runner.decode([1] * b), decode_steps)))
                _say(f"decode batch {b:>3} context {c:>5}: {decode[-1][2] * 1e3:8.2f} ms/step")
                if b <= ROLLOUT_RSS_POINT[0] and c <= ROLLOUT_RSS_POINT[1]:
                    rss = max(rss, psutil.Process().memory_info().rss)
        for n_tok in (64, 256):
            if n_tok < min(contexts):
                ids = torch.randint(0, vocab, (n_tok,)).tolist()
                prefill.append((n_tok, _median_s(lambda: BatchRunner(model, device="cpu").prefill(["x"], [ids]),
                                                 prefill_repeats)))
    num_params = sum(p.numel() for p in model.parameters())
    return decode, sorted(prefill), num_params, rss or _peak_rss_bytes()


def _comm_rank(ctx, nbytes: int, rebuilds: int, syncs: int):
    import random

    import torch.distributed as dist

    from engine.runtime.control import Mailbox
    from engine.runtime.groups import GroupManager
    from engine.runtime.weights import WeightReceiver, WeightSender, manifest
    from scheduler.layout import BucketsConfig, random_role_map

    mgr = GroupManager(ctx.store, global_rank=ctx.rank, world_size=ctx.world_size, rank_offset=0, timeout_s=60)
    rng = random.Random(7)
    rebuild_s = []
    for v in range(1, rebuilds + 1):
        dist.barrier()
        t0 = time.perf_counter()
        mgr.apply(random_role_map(rng, ctx.world_size, v, BucketsConfig().buckets()))
        rebuild_s.append(time.perf_counter() - t0)
    mgr.destroy()
    group = dist.new_group(list(range(ctx.world_size)))
    state = {"w": (torch.randn if ctx.rank == 0 else torch.empty)(max(1, nbytes // 4))}  # receivers' values are overwritten
    sender = WeightSender(group, 0, bucket_size_mb=64, device=torch.device("cpu"))
    receiver = WeightReceiver(group, 0, manifest(state), bucket_size_mb=64, device=torch.device("cpu"))
    sync_s = []
    for r in range(syncs):
        dist.barrier()
        t0 = time.perf_counter()
        if ctx.rank == 0:
            sender.send(state, r + 1)
        else:
            receiver.recv()
        dist.barrier()
        sync_s.append(time.perf_counter() - t0)
    box = Mailbox(ctx.store, ctx.rank)
    rtt = []
    for i in range(20):  # rank 0 plays the coordinator; rank 1 answers
        if ctx.rank == 0:
            t0 = time.perf_counter()
            box.send(1, ("ping", i))
            box.recv(timeout_s=30, expect_from="rank 1")
            rtt.append(time.perf_counter() - t0)
        elif ctx.rank == 1:
            box.recv(timeout_s=30, expect_from="rank 0")
            box.send(0, ("pong", i))
    dist.barrier()
    return {"rebuild_s": statistics.median(rebuild_s), "sync_s": statistics.median(sync_s),
            "rtt_s": statistics.median(rtt) if rtt else 0.0}


def _handoff_rank(ctx, model_spec: str, out_dir: str) -> dict:
    """A role switch's trainer hand-off with the worker's own code: one trainer (one step in, so Adam
    holds its moments) saves its state, then a two-rank FSDP group builds its trainer and loads it."""
    import torch.distributed as dist

    from engine.models import load_policy
    from engine.trainer.trainer import Trainer, TrainerConfig, load_handoff, save_handoff

    cfg = TrainerConfig(lr=1e-6, micro_batch_tokens=1024)
    save_s = 0.0
    if ctx.rank == 0:
        model, tok = load_policy(model_spec, device="cpu")
        old = Trainer(model, cfg, group=None, device="cpu")
        old.train_step(synthetic_batch(4, 128, len(tok), 0), 0)
        t0 = time.perf_counter()
        save_handoff(old, out_dir, write=True)
        save_s = time.perf_counter() - t0
        del old, model
    dist.barrier()
    t0 = time.perf_counter()
    model, _ = load_policy(model_spec, device="cpu")
    load_handoff(Trainer(model, cfg, group=dist.group.WORLD, device="cpu"), out_dir, "cpu")
    dist.barrier()
    return {"save_s": save_s, "load_s": time.perf_counter() - t0}


def measure_comm(num_params: int, ranks: int, rebuilds: int = 5, syncs: int = 3) -> dict:
    out = spawn(_comm_rank, ranks, (num_params * 4, rebuilds, syncs), device_info=DeviceInfo("cpu", 2), timeout_s=300)[0]
    _say(f"weight sync to {ranks - 1} ranks {out['sync_s']:.2f} s, group rebuild {out['rebuild_s'] * 1e3:.1f} ms")
    return out


def measure_handoff(model_spec: str) -> dict:
    """Seconds the old trainer takes to save the hand-off, and the new two-rank group to build and load it."""
    with tempfile.TemporaryDirectory() as tmp:
        results = spawn(_handoff_rank, HANDOFF_RANKS, (model_spec, tmp), device_info=DeviceInfo("cpu", 2), timeout_s=900)
    out = {"save_s": results[0]["save_s"], "load_s": max(r["load_s"] for r in results)}
    _say(f"hand-off: save {out['save_s']:.2f} s, build + load on 2 trainer ranks {out['load_s']:.2f} s")
    return out


def measure_train(model_spec: str, max_ranks: int, seq_len: int) -> tuple[dict[int, float], dict[int, float], dict[int, float]]:
    """Tokens/s, the full-weight gather's seconds and a rank's peak RSS per trainer rank count."""
    tokens_per_s, gather_s, rss = {}, {}, {}
    for n in range(1, max_ranks + 1):
        r = train_rate(model_spec, n, steps=2, num_trajectories=4, seq_len=seq_len, micro_batch_tokens=1024,
                       threads_per_rank=1, timeout_s=900.0)
        tokens_per_s[n], gather_s[n], rss[n] = r["tokens_per_s"], r["gather_s"], r["rss_bytes"]
        _say(f"train {n} rank(s): {tokens_per_s[n]:8.1f} tokens/s, full-weight gather {gather_s[n] * 1e3:.1f} ms, "
             f"peak RSS {rss[n] / 2**30:.2f} GiB a rank")
    return tokens_per_s, gather_s, rss


def _timed_train(trainer, batch, version: int, group) -> tuple[float, float]:
    """Tokens/s of one train step on `batch` (over the group's slowest rank) and the full-weight gather's seconds."""
    import torch.distributed as dist

    if group is not None:
        dist.barrier(group)
    t0 = time.perf_counter()
    tokens = trainer.train_step(batch, version)["train/tokens"]
    if group is not None:
        dist.barrier(group)
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    trainer.full_state_dict()
    return tokens / train_s, time.perf_counter() - t0


def _quick_trainer_rank(ctx, model_spec: str, out_dir: str, num_trajectories: int, seq_len: int) -> dict:
    """Every trainer figure of `--quick` in one spawn of HANDOFF_RANKS ranks: rank 0 alone trains and
    saves the hand-off; then all build an FSDP trainer, load it (a switch's new group) and train the
    same tokens per rank. No warm-up step: on a CPU a first step costs little more than the next."""
    import torch.distributed as dist

    from engine.models import load_policy
    from engine.trainer.trainer import Trainer, TrainerConfig, load_handoff, save_handoff

    cfg = TrainerConfig(lr=1e-6, micro_batch_tokens=1024)
    out = {}
    if ctx.rank == 0:  # the others wait in the barrier: one busy process, as a lone trainer rank
        model, tok = load_policy(model_spec, device="cpu")
        old = Trainer(model, cfg, group=None, device="cpu")
        out["tps_1"], out["gather_1"] = _timed_train(old, synthetic_batch(num_trajectories, seq_len, len(tok), 0), 0, None)
        out["rss_1"] = _peak_rss_bytes()
        t0 = time.perf_counter()
        save_handoff(old, out_dir, write=True)
        out["save_s"] = time.perf_counter() - t0
        del old, model
    dist.barrier()
    t0 = time.perf_counter()
    model, tok = load_policy(model_spec, device="cpu")
    trainer = Trainer(model, cfg, group=dist.group.WORLD, device="cpu")
    load_handoff(trainer, out_dir, "cpu")
    dist.barrier()
    out["load_s"] = time.perf_counter() - t0
    batch = synthetic_batch(num_trajectories * ctx.world_size, seq_len, len(tok), 1)
    out["tps_n"], out["gather_n"] = _timed_train(trainer, batch, 1, dist.group.WORLD)
    out["rss_n"] = _peak_rss_bytes()  # rank 0's includes its lone trainer's: the others' is an FSDP rank's
    return out


def measure_train_quick(model_spec: str, num_trajectories: int, seq_len: int) -> tuple[dict, dict, dict, dict]:
    """`--quick`: (tokens/s, gather seconds, a rank's peak RSS) per trainer rank count {1, HANDOFF_RANKS}, and the
    hand-off's seconds."""
    _say(f"training {num_trajectories} x {seq_len} tokens on 1 rank, the hand-off, then as much per rank on "
         f"{HANDOFF_RANKS} ranks (the longest part)")
    with tempfile.TemporaryDirectory() as tmp:
        res = spawn(_quick_trainer_rank, HANDOFF_RANKS, (model_spec, tmp, num_trajectories, seq_len),
                    device_info=DeviceInfo("cpu", 2), timeout_s=900)
    n = HANDOFF_RANKS
    tokens_per_s = {1: res[0]["tps_1"], n: res[0]["tps_n"]}
    gather_s = {1: res[0]["gather_1"], n: max(r["gather_n"] for r in res)}
    rss = {1: res[0]["rss_1"], n: max(r["rss_n"] for r in res[1:])}
    handoff = {"save_s": res[0]["save_s"], "load_s": max(r["load_s"] for r in res)}
    for k in (1, n):
        _say(f"train {k} rank(s): {tokens_per_s[k]:8.1f} tokens/s, full-weight gather {gather_s[k] * 1e3:.1f} ms, "
             f"peak RSS {rss[k] / 2**30:.2f} GiB a rank")
    _say(f"hand-off: save {handoff['save_s']:.2f} s, build + load on {n} trainer ranks {handoff['load_s']:.2f} s")
    return tokens_per_s, gather_s, rss, handoff


# the grid and repetitions of a full profile and of `--quick` (flags given explicitly win over both)
FULL = {"batches": "1,4,16,32", "contexts": "128,512,1024,1536", "decode_steps": 5, "max_trainer_ranks": 4,
        "train_seq_len": 512}
QUICK = {"batches": "1,16", "contexts": "256,1024", "decode_steps": 2, "max_trainer_ranks": HANDOFF_RANKS,
         "train_seq_len": 256, "train_trajectories": 2}


def parse_args(argv: list[str] | None = None, description: str | None = None) -> argparse.Namespace:
    """The CLI's flags, the grid filled from FULL or QUICK where a flag was not given."""
    p = argparse.ArgumentParser(description=description or __doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", help="tiny, smollm2 or a local HF model dir")
    p.add_argument("--device", default="cpu", choices=("cpu",), help="only CPU is profiled here (no GPU on these machines)")
    p.add_argument("--out", default="", help="profile path; default profiles/<model>-<device>.json")
    p.add_argument("--quick", action="store_true", help="a short profile (~70 s for smollm2 on 2 busy cores): see the docstring")
    p.add_argument("--batches", help=f"decode batch sizes (default {FULL['batches']}, quick {QUICK['batches']})")
    p.add_argument("--contexts", help=f"decode contexts (default {FULL['contexts']}, quick {QUICK['contexts']})")
    p.add_argument("--decode-steps", type=int,
                   help=f"timed decode steps per point (default {FULL['decode_steps']}, quick {QUICK['decode_steps']})")
    p.add_argument("--max-trainer-ranks", type=int,
                   help=f"the CPU run has 4 workers; colocate trains on all (default {FULL['max_trainer_ranks']}, "
                        f"quick {HANDOFF_RANKS})")
    p.add_argument("--ranks", type=int, default=5, help="gloo ranks for the sync and rebuild (the CPU run: 4 workers + coordinator)")
    p.add_argument("--train-seq-len", type=int,
                   help=f"tokens per training sequence (default {FULL['train_seq_len']}, quick {QUICK['train_seq_len']})")
    p.add_argument("--poll-s", type=float, default=0.001, help="the coordinator loop's poll period")
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.quick and args.max_trainer_ranks != HANDOFF_RANKS:
        p.error(f"--quick measures training on 1 and {HANDOFF_RANKS} ranks; drop --max-trainer-ranks or --quick")
    return args


def measure_profile(args: argparse.Namespace) -> HardwareProfile:
    """Every figure of the profile `args` asks for, measured now, as a HardwareProfile."""
    from engine.models import model_arch_name, model_spec
    from scheduler.costmodel import MODELS

    t_start = time.time()
    _say(f"profiling {args.model} on {args.device} ({os.cpu_count()} cores){', quick' if args.quick else ''}")
    decode, prefill, num_params, rollout_rss = measure_rollout(args.model, [int(x) for x in args.batches.split(",")],
                                                  [int(x) for x in args.contexts.split(",")], args.decode_steps,
                                                  prefill_repeats=1 if args.quick else 3)
    if args.quick:
        train, gather, trainer_rss, handoff = measure_train_quick(args.model, args.train_trajectories, args.train_seq_len)
        comm = measure_comm(num_params, args.ranks, rebuilds=2, syncs=1)
    else:
        train, gather, trainer_rss = measure_train(args.model, args.max_trainer_ranks, args.train_seq_len)
        comm = measure_comm(num_params, args.ranks)
        handoff = measure_handoff(args.model)
    arch, spec = model_arch_name(args.model), model_spec(args.model)
    return HardwareProfile(
        model=args.model, arch=arch, spec={} if arch in MODELS else dataclasses.asdict(spec), device=args.device, hardware=args.device,
        decode=tuple(decode), prefill=tuple(prefill), train_tokens_per_s=train, sync_s=comm["sync_s"],
        group_rebuild_s=comm["rebuild_s"],
        # a switch as the coordinator runs it: hand-off save, rebuild, new trainers built and loaded, a sync
        reconfig_s=handoff["save_s"] + comm["rebuild_s"] + handoff["load_s"] + comm["sync_s"],
        step_overhead_s=2 * comm["rtt_s"] + args.poll_s, gather_s=gather, cores=os.cpu_count() or 1,
        trainer_rss_bytes=trainer_rss, rollout_rss_bytes=rollout_rss,
        host_mem_bytes=float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")),
        meta={"host": os.uname().nodename, "cores": os.cpu_count(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M"), "params": num_params, "profile_wall_s": round(time.time() - t_start, 1),
              "load_1m": os.getloadavg()[0], "quick": args.quick})


def main(argv: list[str] | None = None, description: str | None = None) -> None:
    """Measure, save, print the headline figures and, last, `profile: PATH (N s)`."""
    args = parse_args(argv, description)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    t_start = time.time()
    profile = measure_profile(args)
    path = Path(args.out or f"profiles/{args.model}-{args.device}.json")
    profile.save(path)
    print(f"{'measure':<28} value")
    for name, value in (("sync_s", profile.sync_s), ("group_rebuild_s", profile.group_rebuild_s),
                        ("reconfig_s", profile.reconfig_s), ("step_overhead_s", profile.step_overhead_s)):
        print(f"{name:<28} {value:.4f}")
    for n, tps in profile.train_tokens_per_s.items():
        print(f"{'train tokens/s, ' + str(n) + ' rank(s)':<28} {tps:.1f}")
    print(f"profile: {path} ({time.time() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
