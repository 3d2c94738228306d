"""What several trainer tests share: GRPO groups of random trajectories with exact recorded log-probs."""

import torch

from engine.trajectory import Trajectory


def make_trajs(num_groups=2, n=4, seed=0, version=0, rewards=None, prompt_len=3, behaviour_logprob=-6.0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(num_groups * n):
        length = int(torch.randint(prompt_len + 2, prompt_len + 12, (1,), generator=gen))
        ids = torch.randint(0, 500, (length,), generator=gen).tolist()
        k = length - prompt_len
        reward = float(i % 2) if rewards is None else rewards[i]
        out.append(Trajectory(request_id=f"r{i}", task_id=f"t{i // n}", group_id=f"g{i // n}", prompt_len=prompt_len,
                              token_ids=ids, loss_mask=[0] * prompt_len + [1] * k,
                              logprobs=[0.0] * prompt_len + [behaviour_logprob] * k,
                              versions=[-1] * prompt_len + [version] * k, reward=reward))
    return out
