"""A radix prefix cache over the token pool, with an optional host tier (HiCache).

Prefixes are cached in blocks of BLOCK tokens, each block a node keyed by its parent and its
tokens, so a match walks block by block from the root (SGLang matches to the token; block
granularity keeps the bookkeeping cheap and only rounds hits down). Nodes live on the GPU, on the
host, or both. GPU nodes held by a live request are locked; unlocked GPU leaves are evictable in
LRU order. With a host tier, an evicted GPU node keeps its host copy (write-through backs nodes up
as they are inserted) and a later match loads it back at a bandwidth cost.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

BLOCK = 16


@dataclass(eq=False)
class Node:
    """One cached block of `BLOCK` tokens, keyed by its parent and its tokens: where it lives (GPU,
    host, both), how many live requests lock it, when it was last used, and its children."""

    key: int
    parent: Node | None
    last: float = 0.0
    lock: int = 0
    on_gpu: bool = True
    on_host: bool = False
    gpu_children: int = 0
    children: int = 0


@dataclass
class Match:
    """The longest cached prefix of a request, block by block: the nodes, and the tokens found on
    the GPU and on the host only (those are loaded back at a cost)."""

    nodes: list[Node] = field(default_factory=list)
    gpu_tokens: int = 0
    host_tokens: int = 0

    @property
    def tokens(self) -> int:
        """Tokens of the prefix found at all, on the GPU or the host."""
        return self.gpu_tokens + self.host_tokens


class PrefixCache:
    """Token accounting for cached prefixes: GPU tokens, locked tokens, host tokens."""

    def __init__(self, enabled: bool = True, host_capacity: int = 0) -> None:
        self.enabled = enabled
        self.host_capacity = host_capacity
        self.nodes: dict[int, Node] = {}
        self.gpu_tokens = 0
        self.locked_tokens = 0
        self.host_tokens = 0
        self.loaded_back_total = 0
        self.backed_up_total = 0
        self._heap: list[tuple[float, int, Node]] = []
        self._host_heap: list[tuple[float, int, Node]] = []
        self._seq = itertools.count()

    @property
    def evictable_tokens(self) -> int:
        """GPU tokens no live request locks: what the scheduler may evict to admit a request."""
        return self.gpu_tokens - self.locked_tokens

    @staticmethod
    def _key(parent: Node | None, block: Sequence[int]) -> int:
        return hash((parent.key if parent else 0, tuple(block)))

    def match(self, ids: Sequence[int], limit: int, now: float) -> Match:
        """Longest cached prefix of ids[:limit] in whole blocks."""
        out = Match()
        if not self.enabled:
            return out
        parent: Node | None = None
        for start in range(0, limit - BLOCK + 1, BLOCK):
            node = self.nodes.get(self._key(parent, ids[start : start + BLOCK]))
            if node is None or not (node.on_gpu or node.on_host):
                break
            node.last = now
            out.nodes.append(node)
            if node.on_gpu:
                out.gpu_tokens += BLOCK
            else:
                out.host_tokens += BLOCK
            parent = node
        return out

    def load_back(self, match: Match) -> int:
        """Bring host-only nodes of a match onto the GPU (caller made room). Returns tokens."""
        moved = 0
        for node in match.nodes:
            if not node.on_gpu:
                node.on_gpu = True
                self.gpu_tokens += BLOCK
                if node.parent is not None:
                    node.parent.gpu_children += 1
                moved += BLOCK
        match.gpu_tokens += moved
        match.host_tokens -= moved
        self.loaded_back_total += moved
        return moved

    def lock(self, nodes: Sequence[Node]) -> None:
        """Lock `nodes` for a live request (counted once per node): a locked node is never
        evicted."""
        for node in nodes:
            if node.lock == 0 and node.on_gpu:
                self.locked_tokens += BLOCK
            node.lock += 1

    def unlock(self, nodes: Sequence[Node], now: float) -> None:
        """Release a request's lock on `nodes`, deepest first, stamping their use at `now`; a node
        no request holds becomes evictable."""
        for node in reversed(nodes):
            node.lock -= 1
            node.last = now
            if node.lock == 0 and node.on_gpu:
                self.locked_tokens -= BLOCK
                self._push(node)

    def insert(self, ids: Sequence[int], start_nodes: Sequence[Node], now: float) -> int:
        """Cache the whole blocks of `ids` past `start_nodes`; returns GPU tokens newly taken
        over from the caller's own allocation."""
        if not self.enabled:
            return 0
        parent = start_nodes[-1] if start_nodes else None
        taken = 0
        for start in range(len(start_nodes) * BLOCK, len(ids) - BLOCK + 1, BLOCK):
            key = self._key(parent, ids[start : start + BLOCK])
            node = self.nodes.get(key)
            if node is None:
                node = Node(key, parent, now)
                self.nodes[key] = node
                self.gpu_tokens += BLOCK
                taken += BLOCK
                if parent is not None:
                    parent.children += 1
                    parent.gpu_children += 1
                self._backup(node, now)
            elif not node.on_gpu:
                node.on_gpu = True
                self.gpu_tokens += BLOCK
                taken += BLOCK
                if parent is not None:
                    parent.gpu_children += 1
            node.last = now
            if node.lock == 0 and node.gpu_children == 0:
                self._push(node)
            parent = node
        return taken

    def _backup(self, node: Node, now: float) -> None:
        if self.host_capacity <= 0:
            return
        if self.host_tokens + BLOCK > self.host_capacity:
            self._evict_host(self.host_tokens + BLOCK - self.host_capacity)
        if self.host_tokens + BLOCK <= self.host_capacity:
            node.on_host = True
            self.host_tokens += BLOCK
            self.backed_up_total += BLOCK
            heapq.heappush(self._host_heap, (now, next(self._seq), node))

    def _push(self, node: Node) -> None:
        heapq.heappush(self._heap, (node.last, next(self._seq), node))

    def evict(self, tokens: int) -> int:
        """Free at least `tokens` GPU tokens from unlocked leaves, LRU first. Returns freed."""
        freed = 0
        while freed < tokens and self._heap:
            last, _, node = heapq.heappop(self._heap)
            if (
                not node.on_gpu
                or node.lock > 0
                or node.gpu_children > 0
                or last != node.last
                or self.nodes.get(node.key) is not node
            ):
                continue
            node.on_gpu = False
            self.gpu_tokens -= BLOCK
            freed += BLOCK
            parent = node.parent
            if parent is not None:
                parent.gpu_children -= 1
                if parent.gpu_children == 0 and parent.lock == 0 and parent.on_gpu:
                    self._push(parent)
            if node.on_host:
                heapq.heappush(self._host_heap, (node.last, next(self._seq), node))
            else:
                self._drop(node)
        return freed

    def _drop(self, node: Node) -> None:
        if node.children > 0:
            return  # kept as a path to descendants cached on the host
        if self.nodes.get(node.key) is node:
            del self.nodes[node.key]
        parent = node.parent
        if parent is not None:
            parent.children -= 1
            if parent.children == 0 and not parent.on_gpu and not parent.on_host:
                self._drop(parent)

    def _evict_host(self, tokens: int) -> None:
        freed = 0
        while freed < tokens and self._host_heap:
            _, _, node = heapq.heappop(self._host_heap)
            if not node.on_host or node.children > 0 or node.on_gpu:
                continue
            node.on_host = False
            self.host_tokens -= BLOCK
            freed += BLOCK
            self._drop(node)

    def clear(self) -> None:
        """Drop every cached prefix, GPU and host (`/flush_cache`)."""
        self.nodes.clear()
        self._heap.clear()
        self._host_heap.clear()
        self.gpu_tokens = self.locked_tokens = self.host_tokens = 0
