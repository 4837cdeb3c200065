"""The free blocks of one block pool, in the order they are handed out.

vLLM 0.32 keeps every free block in one doubly linked list whose order is the
eviction order (``vllm/v1/core/kv_cache_utils.py``, ``FreeKVCacheBlockQueue``,
driven by ``vllm/v1/core/block_pool.py``):

* ``BlockPool.free_blocks`` puts blocks without a hash at the head
  (``prepend_n``: reused first, last freed first) and cached blocks at the tail
  (``append_n``: the LRU end);
* ``BlockPool.unpin_blocks`` appends blocks without a hash at the tail, as
  last-resort candidates;
* ``BlockPool.get_new_blocks`` takes blocks from the head and drops the hash of
  any cached block it took; ``BlockPool.touch`` pulls a cached block back out
  on a prefix hit.

:class:`FreeBlocks` keeps the same hand-out order as three tiers, so that the
cached tier can follow any :class:`~vllm_admission.core.eviction.EvictionPolicy`:

1. ``uncached``: blocks without a hash, a stack (top = last pushed);
2. cached blocks, in the eviction policy's order;
3. ``tail``: blocks without a hash appended after the cached ones, first in
   first out.

With :class:`~vllm_admission.core.eviction.LRUEviction` the order is vLLM's,
block for block. The simulator's :class:`~vllm_admission.core.cache.BlockPool`
and the plugin's ``PolicyFreeBlockQueue`` both keep their free blocks in this
one structure; blocks are integer ids.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from vllm_admission.core.eviction import EvictionPolicy

__all__ = ["FreeBlocks"]


class FreeBlocks:
    """Free block ids in hand-out order: uncached stack, policy-ordered cached, FIFO tail.

    Args:
        eviction: orders the cached tier (the object is used, not copied).

    Attributes:
        uncached: the uncached stack as an insertion-ordered dict (top = last key).
        tail: the last-resort FIFO (first key = next out).
        num_cached: cached blocks waiting in the eviction policy.
        latest: the largest ``now`` any cached block was added at (``-inf`` before any).
    """

    __slots__ = ("eviction", "uncached", "tail", "num_cached", "latest")

    def __init__(self, eviction: EvictionPolicy) -> None:
        self.eviction = eviction
        self.uncached: dict[int, None] = {}
        self.tail: dict[int, None] = {}
        self.num_cached = 0
        self.latest = -math.inf

    def clone(self, eviction: EvictionPolicy) -> FreeBlocks:
        """An independent copy whose cached tier is ``eviction`` (a clone of ours)."""
        other = FreeBlocks(eviction)
        other.uncached = self.uncached.copy()
        other.tail = self.tail.copy()
        other.num_cached = self.num_cached
        other.latest = self.latest
        return other

    def __len__(self) -> int:
        return len(self.uncached) + self.num_cached + len(self.tail)

    # -- returning blocks --------------------------------------------------
    def push_uncached(self, block_ids: Sequence[int]) -> None:
        """Put blocks without a hash at the head, ``block_ids[0]`` handed out first
        (``FreeKVCacheBlockQueue.prepend_n``)."""
        self.uncached.update(dict.fromkeys(reversed(block_ids)))

    def add_cached(self, block_ids: Sequence[int], now: float,
                   values: Sequence[float] | None = None,
                   next_uses: Sequence[float] | None = None) -> None:
        """Make cached blocks eviction candidates at time ``now``, in the given order.

        ``values`` (FLOPs saved per byte) and ``next_uses`` (request index of the
        next use) are aligned with ``block_ids``; missing ones are 0 and infinity.
        """
        n = len(block_ids)
        if not n:
            return
        self.eviction.add_many(block_ids, now, values if values is not None else [0.0] * n,
                               next_uses if next_uses is not None else [math.inf] * n)
        self.num_cached += n
        if now > self.latest:
            self.latest = now

    def append_tail(self, block_ids: Sequence[int]) -> None:
        """Put blocks without a hash after every cached block (``unpin_blocks``)."""
        tail = self.tail
        for b in block_ids:
            tail[b] = None

    # -- taking blocks -------------------------------------------------------
    def take(self, n: int, now: float) -> list[int]:
        """Remove and return the next ``n`` blocks in hand-out order.

        Cached blocks among them are the eviction policy's victims; the caller
        drops their hashes.

        Raises:
            ValueError: fewer than ``n`` blocks are free.
        """
        if n > len(self):
            raise ValueError(f"cannot take {n} blocks, {len(self)} are free")
        uncached = self.uncached
        out: list[int] = []
        for _ in range(min(n, len(uncached))):
            out.append(uncached.popitem()[0])
        need = n - len(out)
        if need:
            k = min(need, self.num_cached)
            if k:
                out.extend(self.eviction.pop_n(k, now))
                self.num_cached -= k
                need -= k
            tail = self.tail
            for _ in range(need):
                b = next(iter(tail))
                del tail[b]
                out.append(b)
        return out

    def remove(self, block_id: int) -> bool:
        """Withdraw a free block (a prefix hit took it).

        Returns:
            True if it was a cached candidate, False if it was uncached.

        Raises:
            KeyError: ``block_id`` is not free.
        """
        if block_id in self.eviction:
            self.eviction.remove(block_id)
            self.num_cached -= 1
            return True
        if block_id in self.uncached:
            del self.uncached[block_id]
        else:
            del self.tail[block_id]
        return False

    def remove_cached(self, block_id: int) -> None:
        """Withdraw a block known to be a cached candidate (the hot path of a hit)."""
        self.eviction.remove(block_id)
        self.num_cached -= 1

    def order(self, now: float) -> list[int]:
        """Every free block id in the order :meth:`take` would hand them out now
        (the eviction policy is cloned, not changed)."""
        out = list(reversed(self.uncached))
        if self.num_cached:
            copy = self.eviction.clone()
            out.extend(copy.pop_n(len(copy), max(now, self.latest)))
        out.extend(self.tail)
        return out

    def uncache_all(self, now: float) -> list[int]:
        """Every cached candidate loses its hash: the whole free list becomes the
        uncached stack, keeping the hand-out order (``reset_prefix_cache``).

        Returns:
            The free block ids in hand-out order.
        """
        order = self.order(now)
        eviction = self.eviction
        for b in order:
            if b in eviction:
                eviction.remove(b)
        self.num_cached = 0
        self.tail.clear()
        self.uncached.clear()
        self.push_uncached(order)
        return order
