"""A reward of your own for `--data` rows: exact match of the answer with the row's ground truth.

    python libra.py --bench search --data examples/qa_rows.jsonl --reward examples.my_reward:exact_answer --model tiny

A reward function takes `(final_text, ground_truth, task)` and returns a float: `final_text` is
the model's last message, `ground_truth` the row's `reward_model.ground_truth` (a string, a
list of accepted strings, or {"target": [...]}), `task` the envs.base.Task (`task.meta` holds
`data_source` and `extra_info`). The bench's tools still run; only the score is yours.
Tested by tests/envs/test_plugins.py.
"""

import re


def _accepted(ground_truth) -> list[str]:
    if isinstance(ground_truth, dict):
        ground_truth = ground_truth.get("target", [])
    if isinstance(ground_truth, str):
        ground_truth = [ground_truth]
    return [str(g).strip().lower() for g in ground_truth]


def exact_answer(final_text: str, ground_truth, task) -> float:
    found = re.findall(r"<answer>(.*?)</answer>", final_text, re.DOTALL)
    answer = (found[-1] if found else final_text).strip().lower()
    return 1.0 if answer in _accepted(ground_truth) else 0.0
