"""The step semantics shared by the real runtime and the simulator. Pure Python, no torch, no clock, no I/O.

What lives here: `core` (the step core: admission under the lookahead bound, routing events to
the router, the batch to train, the metrics row, the planner's stats, a layout change),
`commands` (the plain data it speaks: its config, what the caller tells it, the commands it
answers with, a checkpoint's `RunState`), `records` (what the core keeps per request and per step),
`finish_order` (which complete groups make a finish-order batch, within a trained-lag bound) and `ledger`
(every started trajectory is trained once or dropped with a reason). The real
coordinator (`engine/runtime/coordinator.py`) and the simulator (`sim/cluster.py`) both drive the
same `StepCore`, so a step means the same thing in both by construction.

May import: scheduler, runlog
Must not import: torch or any device code (engine), the simulator (sim), envs or bench.
"""
