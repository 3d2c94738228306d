"""In-memory caches: least-recently-used with a capacity, and time-to-live with an injected clock."""

from cachekit.caches import CacheStats, LRUCache, TTLCache, memoize

__all__ = ["CacheStats", "LRUCache", "TTLCache", "memoize"]
