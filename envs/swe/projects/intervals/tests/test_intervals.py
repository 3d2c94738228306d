import pytest

from intervals import Interval, IntervalSet


def test_interval_rejects_reversed_bounds():
    """Creating an interval whose start is after its end raises ValueError."""
    with pytest.raises(ValueError):
        Interval(5, 2)


def test_interval_length_and_empty():
    """An interval's length is end minus start, and [3, 3) is empty."""
    assert len(Interval(2, 9)) == 7
    assert Interval(3, 3).is_empty()
    assert not Interval(3, 4).is_empty()


def test_interval_contains_is_half_open():
    """An interval contains its start but not its end."""
    i = Interval(2, 5)
    assert i.contains(2)
    assert i.contains(4)
    assert not i.contains(5)
    assert not i.contains(1)


def test_interval_overlap_and_touch():
    """[0, 5) and [5, 8) touch but do not overlap; [0, 5) and [4, 8) overlap."""
    a, b, c = Interval(0, 5), Interval(5, 8), Interval(4, 8)
    assert not a.overlaps(b)
    assert a.touches(b) and b.touches(a)
    assert a.overlaps(c) and c.overlaps(a)
    assert not a.touches(c)


def test_interval_intersection():
    """The intersection of [0, 6) and [4, 10) is [4, 6); disjoint intervals give None."""
    assert Interval(0, 6).intersection(Interval(4, 10)) == Interval(4, 6)
    assert Interval(0, 4).intersection(Interval(4, 10)) is None
    assert Interval(0, 3).intersection(Interval(5, 10)) is None


def test_interval_shift_and_split():
    """Shifting moves both ends; splitting [0, 10) at 4 gives [0, 4) and [4, 10)."""
    assert Interval(1, 3).shift(10) == Interval(11, 13)
    assert Interval(1, 3).shift(-1) == Interval(0, 2)
    assert Interval(0, 10).split(4) == (Interval(0, 4), Interval(4, 10))
    with pytest.raises(ValueError):
        Interval(0, 10).split(10)
    with pytest.raises(ValueError):
        Interval(0, 10).split(0)


def test_interval_equality_and_hash():
    """Equal intervals compare equal and hash alike."""
    assert Interval(1, 2) == Interval(1, 2)
    assert Interval(1, 2) != Interval(1, 3)
    assert len({Interval(1, 2), Interval(1, 2)}) == 1
    assert repr(Interval(1, 2)) == "Interval(1, 2)"


def test_set_merges_overlapping_and_touching():
    """Adding overlapping or touching intervals merges them into one."""
    s = IntervalSet([(0, 3), (2, 5), (5, 7)])
    assert s.as_tuples() == [(0, 7)]


def test_set_keeps_disjoint_sorted():
    """Disjoint intervals are kept separate and sorted by start."""
    s = IntervalSet([(10, 12), (0, 2), (5, 6)])
    assert s.as_tuples() == [(0, 2), (5, 6), (10, 12)]
    assert len(s) == 3


def test_set_add_bridges_several():
    """One added interval that spans several stored ones swallows them all."""
    s = IntervalSet([(0, 1), (3, 4), (6, 7), (20, 21)])
    s.add(Interval(1, 10))
    assert s.as_tuples() == [(0, 10), (20, 21)]


def test_set_ignores_empty():
    """Adding or removing an empty interval changes nothing."""
    s = IntervalSet([(0, 5)])
    s.add(Interval(7, 7))
    s.remove(Interval(2, 2))
    assert s.as_tuples() == [(0, 5)]


def test_set_membership():
    """Point membership uses half-open semantics across many intervals."""
    s = IntervalSet([(0, 2), (4, 6), (8, 10), (12, 14), (16, 18)])
    inside = [p for p in range(-1, 20) if p in s]
    assert inside == [0, 1, 4, 5, 8, 9, 12, 13, 16, 17]
    assert 3 not in IntervalSet()


def test_set_remove_middle_splits():
    """Removing the middle of an interval leaves the two outer pieces."""
    s = IntervalSet([(0, 10)])
    s.remove(Interval(3, 6))
    assert s.as_tuples() == [(0, 3), (6, 10)]


def test_set_remove_edges():
    """Removing across edges trims intervals and drops fully covered ones."""
    s = IntervalSet([(0, 4), (6, 8), (10, 15)])
    s.remove(Interval(2, 12))
    assert s.as_tuples() == [(0, 2), (12, 15)]
    s.remove(Interval(15, 20))
    assert s.as_tuples() == [(0, 2), (12, 15)]


def test_set_total_length_and_span():
    """Total length sums the pieces; the span runs from first start to last end."""
    s = IntervalSet([(0, 2), (5, 9)])
    assert s.total_length() == 6
    assert s.span() == Interval(0, 9)
    assert IntervalSet().span() is None
    assert IntervalSet().total_length() == 0


def test_set_union():
    """The union of two sets merges them and leaves the inputs unchanged."""
    a = IntervalSet([(0, 2), (10, 12)])
    b = IntervalSet([(1, 5), (12, 13)])
    assert a.union(b).as_tuples() == [(0, 5), (10, 13)]
    assert a.as_tuples() == [(0, 2), (10, 12)]


def test_set_intersection():
    """The intersection keeps only the points present in both sets."""
    a = IntervalSet([(0, 5), (8, 12), (20, 30)])
    b = IntervalSet([(3, 9), (11, 25)])
    assert a.intersection(b).as_tuples() == [(3, 5), (8, 9), (11, 12), (20, 25)]
    assert a.intersection(IntervalSet()).as_tuples() == []


def test_set_complement():
    """The complement within bounds is every gap plus the outer margins."""
    s = IntervalSet([(2, 4), (6, 7)])
    assert s.complement(Interval(0, 10)).as_tuples() == [(0, 2), (4, 6), (7, 10)]
    assert IntervalSet().complement(Interval(1, 3)).as_tuples() == [(1, 3)]


def test_set_gaps():
    """Gaps are the holes between consecutive intervals."""
    s = IntervalSet([(0, 1), (3, 4), (9, 10)])
    assert s.gaps() == [Interval(1, 3), Interval(4, 9)]
    assert IntervalSet([(0, 1)]).gaps() == []


def test_set_largest():
    """The largest interval wins; among equals the first one is kept."""
    s = IntervalSet([(0, 3), (5, 9), (20, 24)])
    assert s.largest() == Interval(5, 9)
    assert IntervalSet().largest() is None


def test_set_nearest():
    """nearest returns the containing interval, else the closest by edge distance, ties to the left."""
    s = IntervalSet([(0, 2), (10, 12)])
    assert s.nearest(1) == Interval(0, 2)
    assert s.nearest(3) == Interval(0, 2)
    assert s.nearest(8) == Interval(10, 12)
    assert s.nearest(5) == Interval(0, 2)
    assert s.nearest(6) == Interval(10, 12)
    assert IntervalSet([(0, 3), (10, 12)]).nearest(6) == Interval(0, 3)
    assert s.nearest(50) == Interval(10, 12)
    assert IntervalSet().nearest(1) is None


def test_set_repr_and_equality():
    """Sets with the same points compare equal and print as half-open ranges."""
    assert IntervalSet([(0, 2), (2, 3)]) == IntervalSet([(0, 3)])
    assert repr(IntervalSet([(0, 2)])) == "IntervalSet([0, 2))"
    assert list(IntervalSet([(1, 2)])) == [Interval(1, 2)]
