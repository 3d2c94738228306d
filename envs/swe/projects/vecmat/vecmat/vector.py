"""Vector operations on plain lists; lengths must match."""

import math


def _check(a, b):
    if len(a) != len(b):
        raise ValueError(f"length mismatch: {len(a)} vs {len(b)}")


def add(a, b):
    _check(a, b)
    return [x + y for x, y in zip(a, b)]


def sub(a, b):
    _check(a, b)
    return [x - y for x, y in zip(a, b)]


def scale(a, k):
    return [x * k for x in a]


def dot(a, b):
    _check(a, b)
    return sum(x * y for x, y in zip(a, b))


def norm(a, p=2):
    """p-norm; p=1 is the sum of absolute values, p=inf the largest absolute value."""
    if p == math.inf:
        return max((abs(x) for x in a), default=0)
    if p < 1:
        raise ValueError(f"p must be >= 1, got {p}")
    return sum(abs(x) ** p for x in a) ** (1 / p)


def normalize(a):
    length = norm(a)
    if length == 0:
        raise ValueError("cannot normalize the zero vector")
    return [x / length for x in a]


def cross(a, b):
    if len(a) != 3 or len(b) != 3:
        raise ValueError("cross product needs two 3-vectors")
    return [
        a[1] * b[2] - a[2] * b[1],
        a[2] * b[0] - a[0] * b[2],
        a[0] * b[1] - a[1] * b[0],
    ]


def lerp(a, b, t):
    """Linear interpolation: t=0 gives a, t=1 gives b."""
    _check(a, b)
    return [x + (y - x) * t for x, y in zip(a, b)]


def angle(a, b):
    """Angle between two non-zero vectors, in radians."""
    cos = dot(a, b) / (norm(a) * norm(b))
    return math.acos(max(-1.0, min(1.0, cos)))
