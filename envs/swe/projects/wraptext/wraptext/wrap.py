"""Greedy word wrapping and friends, for fixed-width plain text."""


def words(text):
    """Split on any run of whitespace; no empty words."""
    out = []
    current = []
    for ch in text:
        if ch.isspace():
            if current:
                out.append("".join(current))
                current = []
        else:
            current.append(ch)
    if current:
        out.append("".join(current))
    return out


def _break_long(word, width):
    return [word[i : i + width] for i in range(0, len(word), width)]


def wrap(text, width, break_long_words=True):
    """Greedy wrap: each line holds as many words as fit in `width` characters."""
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    lines = []
    line = ""
    for word in words(text):
        pieces = _break_long(word, width) if break_long_words and len(word) > width else [word]
        for piece in pieces:
            if not line:
                line = piece
            elif len(line) + 1 + len(piece) <= width:
                line = line + " " + piece
            else:
                lines.append(line)
                line = piece
    if line:
        lines.append(line)
    return lines


def justify(line, width):
    """Pad the gaps between words so the line is exactly `width` wide; extra spaces go left."""
    parts = words(line)
    if len(parts) < 2:
        return line.ljust(width)
    gaps = len(parts) - 1
    spaces = width - sum(len(p) for p in parts)
    if spaces < gaps:
        raise ValueError(f"line {line!r} does not fit in width {width}")
    base, extra = divmod(spaces, gaps)
    out = parts[0]
    for i, part in enumerate(parts[1:]):
        pad = base + (1 if i < extra else 0)
        out += " " * pad + part
    return out


def fill(text, width, justified=False):
    """Wrap and join with newlines; justified text leaves the last line ragged."""
    lines = wrap(text, width)
    if justified:
        lines = [justify(line, width) for line in lines[:-1]] + lines[-1:]
    return "\n".join(lines)


def center(text, width, fillchar=" "):
    """Center text in `width`; when the padding is odd the extra char goes to the right."""
    if len(text) >= width:
        return text
    total = width - len(text)
    left = total // 2
    right = total - left
    return fillchar * left + text + fillchar * right


def truncate(text, max_chars, ellipsis="..."):
    """Cut text to at most `max_chars`, ending with the ellipsis when something was cut."""
    if max_chars < len(ellipsis):
        raise ValueError(f"max_chars {max_chars} is shorter than the ellipsis {ellipsis!r}")
    if len(text) <= max_chars:
        return text
    keep = max_chars - len(ellipsis)
    cut = text[:keep]
    space = cut.rfind(" ")
    if space > keep // 2:
        cut = cut[:space]
    return cut.rstrip() + ellipsis


def indent(text, prefix, first_prefix=None):
    """Prefix every non-empty line; the first line may get its own prefix."""
    out = []
    for i, line in enumerate(text.split("\n")):
        if not line.strip():
            out.append(line)
            continue
        head = first_prefix if (i == 0 and first_prefix is not None) else prefix
        out.append(head + line)
    return "\n".join(out)


def columns(items, num_columns, gap=2):
    """Lay out items in column-major order, each column as wide as its widest item."""
    if num_columns < 1:
        raise ValueError(f"num_columns must be >= 1, got {num_columns}")
    if not items:
        return []
    num_rows = (len(items) + num_columns - 1) // num_columns
    cols = [items[c * num_rows : (c + 1) * num_rows] for c in range(num_columns)]
    cols = [c for c in cols if c]
    widths = [max(len(x) for x in col) for col in cols]
    rows = []
    for r in range(num_rows):
        cells = []
        for col, w in zip(cols, widths):
            if r < len(col):
                cells.append(col[r].ljust(w))
        rows.append((" " * gap).join(cells).rstrip())
    return rows


def count_lines(text, width):
    """Number of lines `text` takes when wrapped at `width` (0 for blank text)."""
    return len(wrap(text, width))
