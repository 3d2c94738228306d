"""Split an expression string into tokens: numbers, names, operators and parentheses."""

OPERATORS = "+-*/%^(),="


class Token:
    __slots__ = ("kind", "value", "pos")

    def __init__(self, kind, value, pos):
        self.kind = kind
        self.value = value
        self.pos = pos

    def __repr__(self):
        return f"Token({self.kind!r}, {self.value!r}, {self.pos})"

    def __eq__(self, other):
        return (self.kind, self.value, self.pos) == (other.kind, other.value, other.pos)


class LexError(ValueError):
    pass


def _read_number(text, i):
    start = i
    seen_dot = False
    while i < len(text) and (text[i].isdigit() or text[i] == "."):
        if text[i] == ".":
            if seen_dot:
                raise LexError(f"second decimal point at {i}")
            seen_dot = True
        i += 1
    raw = text[start:i]
    if raw == ".":
        raise LexError(f"lonely decimal point at {start}")
    value = float(raw) if seen_dot else int(raw)
    return Token("num", value, start), i


def _read_name(text, i):
    start = i
    while i < len(text) and (text[i].isalnum() or text[i] == "_"):
        i += 1
    return Token("name", text[start:i], start), i


def tokenize(text):
    tokens = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch.isdigit() or ch == ".":
            token, i = _read_number(text, i)
            tokens.append(token)
        elif ch.isalpha() or ch == "_":
            token, i = _read_name(text, i)
            tokens.append(token)
        elif ch == "*" and text[i + 1 : i + 2] == "*":
            tokens.append(Token("op", "^", i))
            i += 2
        elif ch in OPERATORS:
            tokens.append(Token("op", ch, i))
            i += 1
        else:
            raise LexError(f"unexpected character {ch!r} at {i}")
    tokens.append(Token("end", None, len(text)))
    return tokens
