"""One entry point for every benchmark env: `make_env(bench, seed=..., num_tasks=..., ...)`.

Algorithm: look the bench up in a table of lazy constructors (each imports its module only when
asked, so `search` never pays for the swe projects and vice versa) and pass the common keyword
arguments (seed, num_tasks, data_path, level) plus any env-specific ones through; `env_cfg` (the
`--env.*` sandbox settings, envs/config.py) goes to the benches whose tools run in a sandbox. Scripted
agents (`oracle_actions`, `wrong_actions`) are found the same way via `scripted_agents(bench)`.

Invariants (tests/envs/test_envs_toy.py, test_envs_search.py, test_envs_math.py): every bench in
BENCHES builds through make_env; an unknown bench raises ValueError naming the choices.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from envs.base import Env, Task
from envs.config import EnvConfig

BENCHES = ("swe", "search", "math", "toy")
# bench -> (module, env class, whether its tools run in a sandbox); modules are imported on first use.
_ENTRIES = {
    "swe": ("envs.swe.env", "SweEnv", True),
    "search": ("envs.search", "SearchEnv", False),
    "math": ("envs.math.env", "MathEnv", True),
    "toy": ("envs.toy", "ToyEnv", False),
}


def _module(bench: str):
    if bench not in _ENTRIES:
        raise ValueError(f"unknown bench {bench!r}; pick one of {', '.join(BENCHES)}.")
    return importlib.import_module(_ENTRIES[bench][0])


def make_env(bench: str, *, seed: int = 0, num_tasks: int | None = None, data_path: str | None = None,
             level: int | None = None, env_cfg: EnvConfig | None = None, **kw) -> Env:
    cls = getattr(_module(bench), _ENTRIES[bench][1])
    if env_cfg is not None and _ENTRIES[bench][2]:
        kw["env_cfg"] = env_cfg
    return cls(seed=seed, num_tasks=num_tasks, data_path=data_path, level=level, **kw)


def scripted_agents(bench: str) -> tuple[Callable[[Task], list[str]], Callable[[Task], list[str]]]:
    """(oracle_actions, wrong_actions) of a bench, for tests and workload profiles."""
    mod = _module(bench)
    return mod.oracle_actions, mod.wrong_actions
