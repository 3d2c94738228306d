"""LRU and TTL caches built on an insertion-ordered dict (the front is the oldest entry)."""

_MISSING = object()


class CacheStats:
    __slots__ = ("hits", "misses", "evictions")

    def __init__(self):
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def hit_rate(self):
        total = self.hits + self.misses
        if total == 0:
            return 0.0
        return self.hits / total

    def as_dict(self):
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions}


class LRUCache:
    """Holds at most `capacity` entries; inserting into a full cache evicts the least recently used."""

    def __init__(self, capacity, on_evict=None):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.on_evict = on_evict
        self.stats = CacheStats()
        self._data = {}

    def __len__(self):
        return len(self._data)

    def __contains__(self, key):
        return key in self._data

    def keys(self):
        """Keys from least to most recently used."""
        return list(self._data)

    def get(self, key, default=None):
        value = self._data.pop(key, _MISSING)
        if value is _MISSING:
            self.stats.misses += 1
            return default
        self._data[key] = value
        self.stats.hits += 1
        return value

    def peek(self, key, default=None):
        """Read without touching recency or stats."""
        return self._data.get(key, default)

    def put(self, key, value):
        if key in self._data:
            del self._data[key]
        elif len(self._data) >= self.capacity:
            self._evict_oldest()
        self._data[key] = value

    def _evict_oldest(self):
        oldest = next(iter(self._data))
        value = self._data.pop(oldest)
        self.stats.evictions += 1
        if self.on_evict is not None:
            self.on_evict(oldest, value)

    def pop(self, key, default=None):
        return self._data.pop(key, default)

    def resize(self, capacity):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        while len(self._data) > self.capacity:
            self._evict_oldest()

    def clear(self):
        self._data.clear()


class TTLCache:
    """Entries expire `ttl_s` seconds after they were written; `clock` returns the time in seconds."""

    def __init__(self, ttl_s, clock, max_entries=None):
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self.ttl_s = ttl_s
        self.clock = clock
        self.max_entries = max_entries
        self.stats = CacheStats()
        self._data = {}

    def _expired(self, expires_at):
        return self.clock() >= expires_at

    def put(self, key, value, ttl_s=None):
        ttl = self.ttl_s if ttl_s is None else ttl_s
        self._data.pop(key, None)
        self._data[key] = (value, self.clock() + ttl)
        if self.max_entries is not None:
            self.purge()
            while len(self._data) > self.max_entries:
                self._data.pop(next(iter(self._data)))
                self.stats.evictions += 1

    def get(self, key, default=None):
        entry = self._data.get(key)
        if entry is None:
            self.stats.misses += 1
            return default
        value, expires_at = entry
        if self._expired(expires_at):
            del self._data[key]
            self.stats.misses += 1
            return default
        self.stats.hits += 1
        return value

    def remaining_s(self, key):
        entry = self._data.get(key)
        if entry is None:
            return 0.0
        return max(0.0, entry[1] - self.clock())

    def purge(self):
        """Drop every expired entry; return how many were dropped."""
        dead = [k for k, (_, exp) in self._data.items() if self._expired(exp)]
        for key in dead:
            del self._data[key]
        return len(dead)

    def __len__(self):
        return sum(1 for _, exp in self._data.values() if not self._expired(exp))


def memoize(cache):
    """Decorator: cache a one-argument function's results in `cache` (None results too)."""

    def decorate(fn):
        def wrapper(arg):
            value = cache.get(arg, _MISSING)
            if value is _MISSING:
                value = fn(arg)
                cache.put(arg, value)
            return value

        wrapper.cache = cache
        return wrapper

    return decorate
