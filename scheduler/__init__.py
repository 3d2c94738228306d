"""Libra scheduler: C-MLFQ, baseline routers, cost model, planner. Pure Python, no torch."""
