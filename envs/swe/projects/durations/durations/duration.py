"""Parse and format durations written as number-unit pairs: '2d 4h', '1h30m', '90s', '1.5h'."""

UNITS = {
    "w": 7 * 24 * 3600,
    "d": 24 * 3600,
    "h": 3600,
    "m": 60,
    "s": 1,
}
ORDER = ["w", "d", "h", "m", "s"]


def parse_duration(text):
    """Total seconds of a duration string; units must appear from largest to smallest, once each."""
    text = text.strip().lower()
    if not text:
        raise ValueError("empty duration")
    total = 0.0
    last_rank = -1
    i = 0
    while i < len(text):
        if text[i] == " ":
            i += 1
            continue
        start = i
        while i < len(text) and (text[i].isdigit() or text[i] == "."):
            i += 1
        if start == i:
            raise ValueError(f"expected a number at {start} in {text!r}")
        number = float(text[start:i])
        if i >= len(text) or text[i] not in UNITS:
            raise ValueError(f"expected a unit at {i} in {text!r}")
        unit = text[i]
        rank = ORDER.index(unit)
        if rank <= last_rank:
            raise ValueError(f"unit {unit!r} out of order in {text!r}")
        last_rank = rank
        total += number * UNITS[unit]
        i += 1
    if total == int(total):
        return int(total)
    return total


def format_duration(seconds, max_units=None):
    """Largest units first, zero parts skipped: 5400 -> '1h 30m'; max_units keeps the biggest parts."""
    if seconds < 0:
        return "-" + format_duration(-seconds, max_units)
    seconds = int(round(seconds))
    if seconds == 0:
        return "0s"
    parts = []
    for unit in ORDER:
        size = UNITS[unit]
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    if max_units is not None:
        parts = parts[:max_units]
    return " ".join(parts)


def split_seconds(seconds):
    """(hours, minutes, seconds) of a whole number of seconds; hours may exceed 24."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return hours, minutes, secs


def clock_format(seconds):
    """'H:MM:SS' for a non-negative number of seconds."""
    hours, minutes, secs = split_seconds(int(seconds))
    return f"{hours}:{minutes:02d}:{secs:02d}"
