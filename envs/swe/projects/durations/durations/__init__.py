"""Durations like '1h30m' and proleptic Gregorian calendar dates, without the datetime module."""

from durations.calendar import Date, days_in_month, is_leap_year
from durations.duration import format_duration, parse_duration

__all__ = ["Date", "days_in_month", "format_duration", "is_leap_year", "parse_duration"]
