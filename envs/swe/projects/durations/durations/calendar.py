"""Calendar dates: leap years, month lengths, ordinal day numbers, weekdays, ISO parsing."""

MONTH_DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
WEEKDAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]


def is_leap_year(year):
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_in_month(year, month):
    if not 1 <= month <= 12:
        raise ValueError(f"month {month} is not in 1..12")
    if month == 2 and is_leap_year(year):
        return 29
    return MONTH_DAYS[month - 1]


def days_before_year(year):
    y = year - 1
    return y * 365 + y // 4 - y // 100 + y // 400


def days_before_month(year, month):
    total = sum(MONTH_DAYS[: month - 1])
    if month > 2 and is_leap_year(year):
        total += 1
    return total


class Date:
    __slots__ = ("year", "month", "day")

    def __init__(self, year, month, day):
        if year < 1:
            raise ValueError(f"year {year} is before year 1")
        if not 1 <= day <= days_in_month(year, month):
            raise ValueError(f"day {day} is not valid in {year}-{month:02d}")
        self.year = year
        self.month = month
        self.day = day

    def __repr__(self):
        return f"Date({self.year}, {self.month}, {self.day})"

    def __str__(self):
        return f"{self.year:04d}-{self.month:02d}-{self.day:02d}"

    def __eq__(self, other):
        return isinstance(other, Date) and self.ordinal() == other.ordinal()

    def __lt__(self, other):
        return self.ordinal() < other.ordinal()

    def __hash__(self):
        return self.ordinal()

    @classmethod
    def parse(cls, text):
        parts = text.strip().split("-")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError(f"expected YYYY-MM-DD, got {text!r}")
        return cls(int(parts[0]), int(parts[1]), int(parts[2]))

    def ordinal(self):
        """Day number with 0001-01-01 as day 1."""
        return days_before_year(self.year) + days_before_month(self.year, self.month) + self.day

    @classmethod
    def from_ordinal(cls, n):
        if n < 1:
            raise ValueError(f"ordinal {n} is before 0001-01-01")
        year = max(1, (n - 1) * 400 // 146097)
        while days_before_year(year + 1) < n:
            year += 1
        while days_before_year(year) >= n:
            year -= 1
        day_of_year = n - days_before_year(year)
        month = 1
        while day_of_year > days_in_month(year, month):
            day_of_year -= days_in_month(year, month)
            month += 1
        return cls(year, month, day_of_year)

    def add_days(self, days):
        return Date.from_ordinal(self.ordinal() + days)

    def days_until(self, other):
        return other.ordinal() - self.ordinal()

    def weekday(self):
        """0 = Monday ... 6 = Sunday (0001-01-01 was a Monday)."""
        return (self.ordinal() - 1) % 7

    def weekday_name(self):
        return WEEKDAYS[self.weekday()]

    def add_months(self, months):
        """Same day in a later month, clamped to that month's last day."""
        index = self.year * 12 + (self.month - 1) + months
        year, month = divmod(index, 12)
        month += 1
        day = min(self.day, days_in_month(year, month))
        return Date(year, month, day)

    def day_of_year(self):
        return days_before_month(self.year, self.month) + self.day
