"""Decisions only: C-MLFQ and the baseline routers, the cost model, the layout search, the planner, and
which idle rollout instances help train a step (`elastic`).

Pure Python over plain data, no torch, no clock, no I/O: told of events with an explicit `now`,
it returns small frozen dataclasses (a bucket, a migration, a plan). The very same objects drive
the real runtime and the simulator. `api` holds the shared types and the `Router` protocol;
`layout` the role map; `systems` builds each compared system's router and planner.

May import: runlog
Must not import: torch, transformers, multiprocessing, or any other part of Libra.
"""
