"""Radix prefix cache accounting: matches, locks, LRU eviction, host tier load-back."""

from __future__ import annotations

from autotune.sim.prefixcache import BLOCK, PrefixCache


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_insert_match_lock_and_evict() -> None:
    cache = PrefixCache()
    ids = seq(0, 5 * BLOCK + 3)
    assert cache.insert(ids, [], now=1.0) == 5 * BLOCK
    m = cache.match(ids, len(ids) - 1, now=2.0)
    assert m.gpu_tokens == 5 * BLOCK and m.host_tokens == 0
    cache.lock(m.nodes)
    assert cache.locked_tokens == 5 * BLOCK and cache.evictable_tokens == 0
    assert cache.evict(BLOCK) == 0  # everything locked
    cache.unlock(m.nodes, now=3.0)
    assert cache.evict(2 * BLOCK) == 2 * BLOCK  # leaves first
    assert cache.match(ids, len(ids), now=4.0).gpu_tokens == 3 * BLOCK


def test_shared_prefix_and_divergence() -> None:
    cache = PrefixCache()
    cache.insert(seq(0, 4 * BLOCK), [], now=1.0)
    other = seq(0, 2 * BLOCK) + seq(1000, 2 * BLOCK)
    assert cache.match(other, len(other), now=2.0).tokens == 2 * BLOCK


def test_host_tier_keeps_evicted_prefixes_and_loads_them_back() -> None:
    cache = PrefixCache(host_capacity=100 * BLOCK)
    ids = seq(0, 4 * BLOCK)
    cache.insert(ids, [], now=1.0)
    assert cache.host_tokens == 4 * BLOCK  # write-through backup
    assert cache.evict(4 * BLOCK) == 4 * BLOCK
    m = cache.match(ids, len(ids), now=2.0)
    assert m.gpu_tokens == 0 and m.host_tokens == 4 * BLOCK
    assert cache.load_back(m) == 4 * BLOCK
    assert cache.gpu_tokens == 4 * BLOCK and cache.loaded_back_total == 4 * BLOCK


def test_disabled_cache_never_matches() -> None:
    cache = PrefixCache(enabled=False)
    assert cache.insert(seq(0, 64), [], now=1.0) == 0
    assert cache.match(seq(0, 64), 64, now=1.0).tokens == 0
