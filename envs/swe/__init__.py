"""The swe bench: repair bugs in small Python projects with view, search, replace, run_tests, submit.

What lives here: `env` (SweEnv, the episode), `spec` (a task from an index record), `mutate`
(AST-mutation bugs verified against each project's tests; `python -m envs.swe.env --generate`),
`data` (verl-schema rows), `tools` (host-side file tools), `grade` with `probe`, `probe_check`
and `probe_runner` (hidden-test grading decided against a reference run), and the data:
`projects/` (the six projects) and `tasks/` (the committed task index).

May import: envs, envs.sandbox
Must not import: torch, engine, sim, envs.math.
"""
