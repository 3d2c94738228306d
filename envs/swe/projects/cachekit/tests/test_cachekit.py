import pytest

from cachekit import CacheStats, LRUCache, TTLCache, memoize


class FakeClock:
    def __init__(self, now=0.0):
        self.now = now

    def __call__(self):
        return self.now


def test_lru_rejects_zero_capacity():
    """An LRU cache with capacity below 1 raises ValueError, also on resize."""
    with pytest.raises(ValueError):
        LRUCache(0)
    cache = LRUCache(1)
    with pytest.raises(ValueError):
        cache.resize(0)


def test_lru_get_put():
    """A stored value is returned by get; a missing key returns the default."""
    cache = LRUCache(2)
    cache.put("a", 1)
    assert cache.get("a") == 1
    assert cache.get("zz") is None
    assert cache.get("zz", 7) == 7
    assert "a" in cache and "zz" not in cache


def test_lru_evicts_least_recently_used():
    """When full, inserting evicts the entry used longest ago; get refreshes recency."""
    cache = LRUCache(3)
    for key in "abc":
        cache.put(key, key.upper())
    cache.get("a")
    cache.put("d", "D")
    assert cache.keys() == ["c", "a", "d"]
    assert len(cache) == 3


def test_lru_fills_to_capacity_exactly():
    """A cache of capacity 3 holds exactly 3 entries before evicting."""
    cache = LRUCache(3)
    for i in range(3):
        cache.put(i, i)
    assert cache.keys() == [0, 1, 2]
    assert cache.stats.evictions == 0
    cache.put(3, 3)
    assert cache.keys() == [1, 2, 3]
    assert cache.stats.evictions == 1


def test_lru_update_existing_does_not_evict():
    """Overwriting an existing key in a full cache evicts nothing and makes it most recent."""
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 10)
    assert cache.keys() == ["b", "a"]
    assert cache.peek("a") == 10
    assert cache.stats.evictions == 0


def test_lru_on_evict_callback():
    """The eviction callback receives the evicted key and value, in eviction order."""
    seen = []
    cache = LRUCache(2, on_evict=lambda k, v: seen.append((k, v)))
    for i in range(5):
        cache.put(i, i * 10)
    assert seen == [(0, 0), (1, 10), (2, 20)]


def test_lru_peek_does_not_touch():
    """peek neither changes recency nor counts as a hit or miss."""
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.peek("a") == 1
    assert cache.peek("x", 5) == 5
    cache.put("c", 3)
    assert cache.keys() == ["b", "c"]
    assert cache.stats.as_dict() == {"hits": 0, "misses": 0, "evictions": 1}


def test_lru_stats():
    """Hits and misses are counted and the hit rate is hits over lookups."""
    cache = LRUCache(4)
    cache.put(1, "x")
    cache.get(1)
    cache.get(1)
    cache.get(1)
    cache.get(2)
    assert cache.stats.hits == 3
    assert cache.stats.misses == 1
    assert cache.stats.hit_rate() == 0.75
    assert CacheStats().hit_rate() == 0.0


def test_lru_resize_and_pop_and_clear():
    """Shrinking evicts the oldest entries; pop and clear remove entries."""
    cache = LRUCache(4)
    for i in range(4):
        cache.put(i, i)
    cache.resize(2)
    assert cache.keys() == [2, 3]
    assert cache.stats.evictions == 2
    assert cache.pop(2) == 2
    assert cache.pop(2, "gone") == "gone"
    cache.clear()
    assert len(cache) == 0


def test_ttl_rejects_bad_ttl():
    """A TTL cache with a non-positive ttl raises ValueError."""
    with pytest.raises(ValueError):
        TTLCache(0, FakeClock())


def test_ttl_expiry_boundary():
    """An entry is readable before its TTL ends and gone exactly at the deadline."""
    clock = FakeClock(100.0)
    cache = TTLCache(10, clock)
    cache.put("k", "v")
    clock.now = 109.5
    assert cache.get("k") == "v"
    clock.now = 110.0
    assert cache.get("k") is None
    assert cache.stats.as_dict() == {"hits": 1, "misses": 1, "evictions": 0}


def test_ttl_per_entry_ttl_and_remaining():
    """A per-entry TTL overrides the default, and remaining_s counts down to zero."""
    clock = FakeClock(0.0)
    cache = TTLCache(10, clock)
    cache.put("short", 1, ttl_s=2)
    cache.put("long", 2)
    clock.now = 1.5
    assert cache.remaining_s("short") == 0.5
    assert cache.remaining_s("long") == 8.5
    assert cache.remaining_s("none") == 0.0
    clock.now = 3
    assert cache.get("short") is None
    assert cache.get("long") == 2
    assert cache.remaining_s("short") == 0.0


def test_ttl_rewrite_resets_deadline():
    """Writing a key again restarts its TTL."""
    clock = FakeClock(0.0)
    cache = TTLCache(5, clock)
    cache.put("k", 1)
    clock.now = 4
    cache.put("k", 2)
    clock.now = 8
    assert cache.get("k") == 2


def test_ttl_len_and_purge():
    """len counts only live entries; purge drops the expired ones and says how many."""
    clock = FakeClock(0.0)
    cache = TTLCache(5, clock)
    cache.put("a", 1)
    clock.now = 3
    cache.put("b", 2)
    cache.put("c", 3)
    clock.now = 6
    assert len(cache) == 2
    assert cache.purge() == 1
    clock.now = 20
    assert cache.purge() == 2
    assert len(cache) == 0


def test_ttl_max_entries_drops_oldest():
    """With max_entries, writing beyond the limit drops the oldest written entries."""
    clock = FakeClock(0.0)
    cache = TTLCache(100, clock, max_entries=2)
    for key in "abc":
        cache.put(key, key)
    assert cache.get("a") is None
    assert cache.get("b") == "b" and cache.get("c") == "c"
    assert cache.stats.evictions == 1


def test_memoize_calls_once_per_argument():
    """A memoized function runs once per distinct argument, even when it returns None."""
    calls = []

    @memoize(LRUCache(8))
    def square(x):
        calls.append(x)
        return None if x == 0 else x * x

    assert [square(3), square(3), square(4), square(0), square(0)] == [9, 9, 16, None, None]
    assert calls == [3, 4, 0]
    assert square.cache.stats.hits == 2
