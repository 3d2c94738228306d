"""Discrete-event cluster simulator driving the same scheduler/ objects. No torch."""
