"""Half-open intervals [start, end) and a normalised set of disjoint intervals."""


class Interval:
    """A half-open interval [start, end) with start <= end."""

    __slots__ = ("start", "end")

    def __init__(self, start, end):
        if start > end:
            raise ValueError(f"start {start} is after end {end}")
        self.start = start
        self.end = end

    def __repr__(self):
        return f"Interval({self.start}, {self.end})"

    def __eq__(self, other):
        if not isinstance(other, Interval):
            return NotImplemented
        return self.start == other.start and self.end == other.end

    def __hash__(self):
        return hash((self.start, self.end))

    def __len__(self):
        return self.end - self.start

    def is_empty(self):
        return self.start == self.end

    def contains(self, point):
        return self.start <= point < self.end

    def overlaps(self, other):
        return self.start < other.end and other.start < self.end

    def touches(self, other):
        return self.end == other.start or other.end == self.start

    def intersection(self, other):
        start = max(self.start, other.start)
        end = min(self.end, other.end)
        if start >= end:
            return None
        return Interval(start, end)

    def shift(self, offset):
        return Interval(self.start + offset, self.end + offset)

    def split(self, point):
        if not self.start < point < self.end:
            raise ValueError(f"split point {point} is not strictly inside {self!r}")
        return Interval(self.start, point), Interval(point, self.end)


class IntervalSet:
    """A set of points stored as sorted, disjoint, non-touching intervals."""

    def __init__(self, intervals=()):
        self._items = []
        for item in intervals:
            if isinstance(item, tuple):
                item = Interval(*item)
            self.add(item)

    def __iter__(self):
        return iter(list(self._items))

    def __len__(self):
        return len(self._items)

    def __repr__(self):
        inner = ", ".join(f"[{i.start}, {i.end})" for i in self._items)
        return f"IntervalSet({inner})"

    def __eq__(self, other):
        if not isinstance(other, IntervalSet):
            return NotImplemented
        return self._items == other._items

    def __contains__(self, point):
        lo, hi = 0, len(self._items) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            item = self._items[mid]
            if point < item.start:
                hi = mid - 1
            elif point >= item.end:
                lo = mid + 1
            else:
                return True
        return False

    def as_tuples(self):
        return [(i.start, i.end) for i in self._items]

    def add(self, interval):
        if interval.is_empty():
            return self
        start, end = interval.start, interval.end
        kept = []
        for item in self._items:
            if item.end < start or item.start > end:
                kept.append(item)
            else:
                start = min(start, item.start)
                end = max(end, item.end)
        kept.append(Interval(start, end))
        kept.sort(key=lambda i: i.start)
        self._items = kept
        return self

    def remove(self, interval):
        if interval.is_empty():
            return self
        kept = []
        for item in self._items:
            if not item.overlaps(interval):
                kept.append(item)
                continue
            if item.start < interval.start:
                kept.append(Interval(item.start, interval.start))
            if item.end > interval.end:
                kept.append(Interval(interval.end, item.end))
        self._items = kept
        return self

    def total_length(self):
        return sum(len(i) for i in self._items)

    def span(self):
        if not self._items:
            return None
        return Interval(self._items[0].start, self._items[-1].end)

    def union(self, other):
        result = IntervalSet(self._items)
        for item in other:
            result.add(item)
        return result

    def intersection(self, other):
        result = IntervalSet()
        a, b = self._items, list(other)
        i = j = 0
        while i < len(a) and j < len(b):
            common = a[i].intersection(b[j])
            if common is not None:
                result.add(common)
            if a[i].end < b[j].end:
                i += 1
            else:
                j += 1
        return result

    def complement(self, bounds):
        result = IntervalSet([bounds])
        for item in self._items:
            result.remove(item)
        return result

    def gaps(self):
        out = []
        for left, right in zip(self._items, self._items[1:]):
            out.append(Interval(left.end, right.start))
        return out

    def largest(self):
        best = None
        for item in self._items:
            if best is None or len(item) > len(best):
                best = item
        return best

    def nearest(self, point):
        """The interval that contains `point`, else the one whose edge is closest (ties go left)."""
        best, best_dist = None, None
        for item in self._items:
            if item.contains(point):
                return item
            dist = item.start - point if point < item.start else point - item.end + 1
            if best_dist is None or dist < best_dist:
                best, best_dist = item, dist
        return best
