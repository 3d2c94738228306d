import datetime

import pytest

from durations import Date, days_in_month, format_duration, is_leap_year, parse_duration
from durations.duration import clock_format, split_seconds


def test_parse_simple_units():
    """Each unit converts to seconds: 90s, 2m, 3h, 1d, 1w."""
    assert parse_duration("90s") == 90
    assert parse_duration("2m") == 120
    assert parse_duration("3h") == 10800
    assert parse_duration("1d") == 86400
    assert parse_duration("1w") == 604800


def test_parse_compound_and_spaces():
    """Compound durations add up, with or without spaces, in any letter case."""
    assert parse_duration("1h30m") == 5400
    assert parse_duration("2d 4h") == 187200
    assert parse_duration(" 1H 1M 1S ") == 3661


def test_parse_fractions():
    """Fractional numbers are allowed and whole results come back as int."""
    assert parse_duration("1.5h") == 5400
    assert isinstance(parse_duration("1.5h"), int)
    assert parse_duration("0.5s") == 0.5


def test_parse_errors():
    """Empty text, a missing unit, a missing number, unknown or repeated or misordered units fail."""
    for bad in ("", "  ", "10", "h", "5x", "1m 2m", "1m 1h", "3 h"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_format_duration():
    """Formatting uses the largest units first and skips zero parts."""
    assert format_duration(5400) == "1h 30m"
    assert format_duration(90061) == "1d 1h 1m 1s"
    assert format_duration(604800 + 3600) == "1w 1h"
    assert format_duration(59) == "59s"
    assert format_duration(60) == "1m"
    assert format_duration(0) == "0s"


def test_format_duration_rounding_negative_and_max_units():
    """Seconds are rounded, negatives get a minus sign, max_units keeps the biggest parts."""
    assert format_duration(59.6) == "1m"
    assert format_duration(-3600) == "-1h"
    assert format_duration(90061, max_units=2) == "1d 1h"
    assert format_duration(-90061, max_units=1) == "-1d"


def test_format_parse_round_trip():
    """Formatting then parsing gives the original number of seconds."""
    for seconds in (1, 61, 3599, 3600, 86399, 700000, 1234567):
        assert parse_duration(format_duration(seconds).replace(" ", "")) == seconds


def test_clock_format():
    """clock_format writes H:MM:SS and hours may exceed a day."""
    assert clock_format(0) == "0:00:00"
    assert clock_format(3725) == "1:02:05"
    assert clock_format(90000) == "25:00:00"
    assert split_seconds(3661) == (1, 1, 1)


def test_leap_years():
    """Leap years: divisible by 4, except centuries, except every 400 years."""
    assert is_leap_year(2024)
    assert not is_leap_year(2023)
    assert not is_leap_year(1900)
    assert is_leap_year(2000)


def test_days_in_month():
    """February has 29 days in leap years; month numbers outside 1..12 fail."""
    assert days_in_month(2023, 2) == 28
    assert days_in_month(2024, 2) == 29
    assert days_in_month(2023, 1) == 31
    assert days_in_month(2023, 4) == 30
    assert days_in_month(2023, 12) == 31
    with pytest.raises(ValueError):
        days_in_month(2023, 13)
    with pytest.raises(ValueError):
        days_in_month(2023, 0)


def test_date_validation_and_parse():
    """Dates validate their day, parse from YYYY-MM-DD and print back the same way."""
    assert str(Date.parse("2024-02-29")) == "2024-02-29"
    assert str(Date(7, 3, 9)) == "0007-03-09"
    for bad in ("2023-02-29", "2023-04-31", "2023-1-0", "2023/01/01", "x-1-1", "0-01-01"):
        with pytest.raises(ValueError):
            Date.parse(bad)


def test_ordinal_matches_datetime():
    """The ordinal day number agrees with Python's datetime for many dates."""
    for y, m, d in [(1, 1, 1), (1, 12, 31), (4, 3, 1), (1900, 3, 1), (2000, 2, 29), (2024, 12, 31), (2100, 3, 1)]:
        assert Date(y, m, d).ordinal() == datetime.date(y, m, d).toordinal()


def test_from_ordinal_round_trip():
    """from_ordinal inverts ordinal, across month, year and leap boundaries."""
    for n in [1, 31, 32, 59, 60, 365, 366, 730119, 730120, 738886, 738887, 767011]:
        expected = datetime.date.fromordinal(n)
        got = Date.from_ordinal(n)
        assert (got.year, got.month, got.day) == (expected.year, expected.month, expected.day)
    with pytest.raises(ValueError):
        Date.from_ordinal(0)


def test_add_days_and_days_until():
    """Adding days crosses month and year ends; days_until is the signed difference."""
    assert Date(2023, 12, 31).add_days(1) == Date(2024, 1, 1)
    assert Date(2024, 2, 28).add_days(1) == Date(2024, 2, 29)
    assert Date(2024, 3, 1).add_days(-1) == Date(2024, 2, 29)
    assert Date(2024, 1, 1).days_until(Date(2025, 1, 1)) == 366
    assert Date(2025, 1, 1).days_until(Date(2024, 1, 1)) == -366


def test_weekday():
    """Weekdays match the real calendar: 2024-01-01 was a Monday, 2000-01-01 a Saturday."""
    assert Date(2024, 1, 1).weekday() == 0
    assert Date(2024, 1, 1).weekday_name() == "Mon"
    assert Date(2000, 1, 1).weekday_name() == "Sat"
    assert Date(2023, 12, 31).weekday_name() == "Sun"


def test_add_months_clamps():
    """Adding months keeps the day, clamped to the end of shorter months, across years."""
    assert Date(2024, 1, 31).add_months(1) == Date(2024, 2, 29)
    assert Date(2023, 1, 31).add_months(1) == Date(2023, 2, 28)
    assert Date(2023, 11, 15).add_months(3) == Date(2024, 2, 15)
    assert Date(2023, 3, 31).add_months(-1) == Date(2023, 2, 28)
    assert Date(2023, 5, 10).add_months(12) == Date(2024, 5, 10)


def test_day_of_year_and_ordering():
    """Day of year counts from 1, includes Feb 29 in leap years; dates order chronologically."""
    assert Date(2023, 1, 1).day_of_year() == 1
    assert Date(2023, 12, 31).day_of_year() == 365
    assert Date(2024, 12, 31).day_of_year() == 366
    assert Date(2024, 3, 1).day_of_year() == 61
    assert Date(2023, 5, 1) < Date(2023, 5, 2)
    assert not Date(2023, 5, 2) < Date(2023, 5, 2)
    assert sorted([Date(2024, 1, 2), Date(2023, 12, 31)]) == [Date(2023, 12, 31), Date(2024, 1, 2)]
