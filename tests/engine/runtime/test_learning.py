"""GRPO learns: the tiny random policy's reward rises from < 0.3 to > 0.8 in 30 steps (seeded, CPU).

Why not `envs/toy.py`: its answers ("blue", "green", "gold") are 3-4 tokens each in the tiny
tokenizer, so a random policy over 512 tokens never samples one and GRPO sees only zero
advantages. `DigitEnv` (examples/digits_env.py) keeps the Env protocol with a dense reward a random policy can
climb: the share of digit characters in the reply. The sampler is a plain KV-cached loop that
records the behaviour log-probs and policy versions exactly as the rollout engine does.
"""

import torch

from engine.models import build_tiny, render_prompt
from engine.rollout.runner import cache_kwarg
from engine.trainer.trainer import Trainer, TrainerConfig
from engine.trajectory import Trajectory
from examples.digits_env import DigitEnv

NUM_STEPS = 30
TASKS_PER_STEP = 4
SAMPLES_PER_TASK = 8
MAX_NEW_TOKENS = 8


@torch.no_grad()
def sample(model, prompts, gen):
    """One sample per prompt (equal lengths) at temperature 1: (new ids [B, T], log-probs [B, T])."""
    out = model(input_ids=torch.tensor(prompts), use_cache=True)
    tokens, logprobs = [], []
    for _ in range(MAX_NEW_TOKENS):
        logp = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
        tok = torch.multinomial(logp.exp(), 1, generator=gen)
        tokens.append(tok)
        logprobs.append(logp.gather(1, tok))
        out = model(input_ids=tok, **{cache_kwarg(): out.past_key_values}, use_cache=True)
    return torch.cat(tokens, 1).tolist(), torch.cat(logprobs, 1).tolist()


def rollout(model, tokenizer, env, tasks, step, version, gen):
    prompts = [render_prompt(tokenizer, task.messages, task.tools) for task in tasks]
    assert len({len(p) for p in prompts}) == 1, "the batched sampler needs equal prompt lengths"
    ids, lps = sample(model, [p for p in prompts for _ in range(SAMPLES_PER_TASK)], gen)
    trajs = []
    for j, (task, prompt) in enumerate(zip(tasks, prompts)):
        rows = range(j * SAMPLES_PER_TASK, (j + 1) * SAMPLES_PER_TASK)
        for k, new, lp in zip(range(SAMPLES_PER_TASK), (ids[r] for r in rows), (lps[r] for r in rows)):
            if tokenizer.eos_token_id in new:  # keep the stop token: the policy learns to stop
                cut = new.index(tokenizer.eos_token_id) + 1
                new, lp = new[:cut], lp[:cut]
            episode = env.start(task)
            reward = episode.score(tokenizer.decode(new, skip_special_tokens=True))
            trajs.append(Trajectory(
                request_id=f"{step}-{task.task_id}-{k}", task_id=task.task_id, group_id=f"{step}-{task.task_id}",
                prompt_len=len(prompt), token_ids=prompt + new, loss_mask=[0] * len(prompt) + [1] * len(new),
                logprobs=[0.0] * len(prompt) + lp, versions=[-1] * len(prompt) + [version] * len(new), reward=reward,
            ).check())
    return trajs


def test_grpo_raises_reward_of_the_tiny_policy():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the CI box has 2 shared cores; a tiny model gains nothing from more
    try:
        run_learning(seed=0)
    finally:
        torch.set_num_threads(threads)


def run_learning(seed):
    torch.manual_seed(seed)
    model, tokenizer = build_tiny(seed)
    trainer = Trainer(model, TrainerConfig(lr=2e-2, grad_clip=1.0, off_policy="bypass", max_staleness=0))
    env = DigitEnv()
    tasks = env.tasks()
    gen = torch.Generator().manual_seed(seed)
    before = {k: v.clone() for k, v in trainer.full_state_dict().items()}
    rewards = []
    for step in range(NUM_STEPS):
        model.eval()  # sampling; the trainer switches back to train mode below
        picked = [tasks[(step * TASKS_PER_STEP + j) % len(tasks)] for j in range(TASKS_PER_STEP)]
        trajs = rollout(model, tokenizer, env, picked, step, trainer.policy_version, gen)
        model.train()
        metrics = trainer.train_step(trajs, trainer.policy_version)
        # on-policy: the behaviour log-probs are the trainer's own, up to float noise (a step
        # whose samples all earned the same reward runs no forward, so it measures no ratio)
        assert not metrics["train/stepped"] or abs(metrics["train/ratio_mean"] - 1.0) < 1e-3, metrics
        rewards.append(metrics["train/reward_mean"])
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert first < 0.3 and last > 0.8, [round(r, 3) for r in rewards]
    after = trainer.full_state_dict()
    assert all(not torch.equal(before[k], after[k]) for k in before)
    assert trainer.policy_version == NUM_STEPS
    return rewards
