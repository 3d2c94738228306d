"""The math bench: DAPO-style problems solved with a Python tool, graded against the gold answer.

What lives here: `env` (MathEnv, the episode and its python tool run in the sandbox) and
`grade` (exact match, else math_verify in a forked child under one deadline).

May import: envs, envs.sandbox
Must not import: torch, engine, sim, envs.swe.
"""
