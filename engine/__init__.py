"""Everything that touches torch, torch.distributed or a device.

The shared leaves live at this level: `devices` (cpu/gloo, cuda/nccl, npu/hccl), `precision`,
`models` (policy and tokenizer loading), `chat` (the chat template rendered to token ids) and
`trajectory` (the record that flows rollout -> coordinator -> trainer). Three packages sit on
them: `rollout` (the engines that generate), `trainer` (the GRPO/PPO update), `runtime` (the
launcher, the coordinator, the worker ranks, process groups, weight sync, checkpoints).

May import: envs, scheduler, runlog
Must not import: sim, bench, steps (only the runtime drives the step core); the shared leaves
never import rollout, trainer or runtime.
"""
