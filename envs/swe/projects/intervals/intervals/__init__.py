"""Half-open integer intervals and sets of them."""

from intervals.core import Interval, IntervalSet

__all__ = ["Interval", "IntervalSet"]
