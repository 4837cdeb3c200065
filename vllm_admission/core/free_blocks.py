"""The free blocks of one block pool, in the order they are handed out.

vLLM 0.32 keeps every free block in one doubly linked list whose order is the
eviction order (``vllm/v1/core/kv_cache_utils.py``, ``FreeKVCacheBlockQueue``,
driven by ``vllm/v1/core/block_pool.py``):

* ``BlockPool.free_blocks`` puts blocks without a hash at the head
  (``prepend_n``: reused first, last freed first) and cached blocks at the end
  (``append_n``: the LRU end);
* ``BlockPool.unpin_blocks`` appends blocks without a hash at the end, as
  last-resort candidates;
* ``BlockPool.get_new_blocks`` takes blocks from the head and drops the hash of
  any cached block it took; ``BlockPool.touch`` pulls a cached block back out
  on a prefix hit.

:class:`FreeBlocks` keeps the same hand-out order as three tiers, so that the
cached tier can follow any :class:`~vllm_admission.core.eviction.EvictionPolicy`:

1. ``uncached``: blocks without a hash, a stack (top = last pushed);
2. cached blocks, in the eviction policy's order;
3. ``last_resort``: blocks without a hash appended after the cached ones, first in
   first out.

With :class:`~vllm_admission.core.eviction.LRUEviction` the order is vLLM's,
block for block. A pool built ``switchable`` remembers when each candidate was
freed and its value, so that :meth:`FreeBlocks.switch` can hand the cached
tier to another policy mid-run (the adaptive controller,
:mod:`vllm_admission.core.adaptive`). The simulator's :class:`~vllm_admission.core.cache.BlockPool`
and the plugin's ``PolicyFreeBlockQueue`` both keep their free blocks in this
one structure; blocks are integer ids.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from vllm_admission.core.eviction import EvictionPolicy

__all__ = ["FreeBlocks"]


class FreeBlocks:
    """Free block ids in hand-out order: uncached stack, policy-ordered cached, last-resort FIFO.

    Args:
        eviction: orders the cached tier (the object is used, not copied).
        switchable: remember each candidate's ``(now, value, next_use)`` so
            that :meth:`switch` can move the candidates to another policy.

    Attributes:
        uncached: the uncached stack as an insertion-ordered dict (top = last key).
        last_resort: the last-resort FIFO (first key = next out).
        num_cached: cached blocks waiting in the eviction policy.
        latest: the largest ``now`` any cached block was added at (``-inf`` before any).
    """

    __slots__ = ("eviction", "uncached", "last_resort", "num_cached", "latest", "_stamps")

    def __init__(self, eviction: EvictionPolicy, *, switchable: bool = False) -> None:
        self.eviction = eviction
        self.uncached: dict[int, None] = {}
        self.last_resort: dict[int, None] = {}
        self.num_cached = 0
        self.latest = -math.inf
        # id -> (now, value, next_use), in the order the candidates were added.
        self._stamps: dict[int, tuple[float, float, float]] | None = {} if switchable else None

    @property
    def switchable(self) -> bool:
        """Whether :meth:`switch` can be used."""
        return self._stamps is not None

    def clone(self, eviction: EvictionPolicy) -> FreeBlocks:
        """An independent copy whose cached tier is ``eviction`` (a clone of ours)."""
        other = FreeBlocks(eviction)
        other.uncached = self.uncached.copy()
        other.last_resort = self.last_resort.copy()
        other.num_cached = self.num_cached
        other.latest = self.latest
        other._stamps = self._stamps.copy() if self._stamps is not None else None
        return other

    def switch(self, eviction: EvictionPolicy,
               demote: Callable[[int], bool] | None = None) -> None:
        """Order the cached tier by ``eviction`` (empty, not yet used) from now on.

        The candidates move to it in the order they were freed, each with the
        time and value it was freed with, so the new policy sees the same
        history as if it had run all along (apart from hits heard before the
        switch, which a policy that ``needs_hits`` does not get).

        Args:
            eviction: the new policy.
            demote: ``f(block_id) -> bool``: candidates to hand over first, as
                if freed (keeping their values) at the earliest time any
                candidate was freed; the others follow in their own order
                with their own times. The new policy then orders them by its
                rule (``lru`` evicts them first; ``reuse`` may keep a reused
                one longer than a younger first-time one).

        Raises:
            RuntimeError: the structure was not built ``switchable``.
            ValueError: ``eviction`` already holds candidates.
        """
        if self._stamps is None:
            raise RuntimeError("this free list was not built switchable")
        if len(eviction):
            raise ValueError(f"the new eviction policy already holds {len(eviction)} candidates")
        if demote is not None and self._stamps:
            stamps = self._stamps
            first = {b: None for b in stamps if demote(b)}
            if first:
                # Stamps are in free order, so times never decrease: the first is the earliest.
                t0 = next(iter(stamps.values()))[0]
                ordered = {b: (t0, *stamps[b][1:]) for b in first}
                ordered.update((b, s) for b, s in stamps.items() if b not in first)
                self._stamps = ordered
        run: list[int] = []
        values: list[float] = []
        next_uses: list[float] = []
        t_run = 0.0  # the current run's time; read only once the run holds a block
        for b, (t, v, nu) in self._stamps.items():
            if t != t_run and run:
                eviction.add_many(run, t_run, values, next_uses)
                run, values, next_uses = [], [], []
            t_run = t
            run.append(b)
            values.append(v)
            next_uses.append(nu)
        if run:
            eviction.add_many(run, t_run, values, next_uses)
        self.eviction = eviction

    def __len__(self) -> int:
        return len(self.uncached) + self.num_cached + len(self.last_resort)

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
        if values is None:
            values = [0.0] * n
        if next_uses is None:
            next_uses = [math.inf] * n
        self.eviction.add_many(block_ids, now, values, next_uses)
        stamps = self._stamps
        if stamps is not None:
            for b, v, nu in zip(block_ids, values, next_uses, strict=True):
                stamps[b] = (now, v, nu)
        self.num_cached += n
        if now > self.latest:
            self.latest = now

    def append_last_resort(self, block_ids: Sequence[int]) -> None:
        """Put blocks without a hash after every cached block (``unpin_blocks``)."""
        last_resort = self.last_resort
        for b in block_ids:
            last_resort[b] = None

    # -- taking blocks -------------------------------------------------------
    def take(self, n: int, now: float) -> list[int]:
        """Remove and return the next ``n`` blocks in hand-out order.

        Cached blocks among them are the eviction policy's victims; the caller
        drops their hashes.

        Raises:
            ValueError: fewer than ``n`` blocks are free.
        """
        uncached = self.uncached
        if n > len(uncached) + self.num_cached + len(self.last_resort):
            raise ValueError(f"cannot take {n} blocks, {len(self)} are free")
        k = n if n < len(uncached) else len(uncached)
        if k:
            pop = uncached.popitem
            out = [pop()[0] for _ in range(k)]
        else:
            out = []
        need = n - len(out)
        if need:
            k = need if need < self.num_cached else self.num_cached
            if k:
                victims = self.eviction.pop_n(k, now)
                out.extend(victims)
                self.num_cached -= k
                need -= k
                stamps = self._stamps
                if stamps is not None:
                    for b in victims:
                        del stamps[b]
            last_resort = self.last_resort
            for _ in range(need):
                b = next(iter(last_resort))
                del last_resort[b]
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
            self.remove_cached(block_id)
            return True
        if block_id in self.uncached:
            del self.uncached[block_id]
        else:
            del self.last_resort[block_id]
        return False

    def remove_cached(self, block_id: int) -> None:
        """Withdraw a block known to be a cached candidate (the hot path of a hit)."""
        self.eviction.remove(block_id)
        self.num_cached -= 1
        if self._stamps is not None:
            del self._stamps[block_id]

    def order(self, now: float) -> list[int]:
        """Every free block id in the order :meth:`take` would hand them out now
        (the eviction policy is cloned, not changed)."""
        out = list(reversed(self.uncached))
        if self.num_cached:
            copy = self.eviction.clone()
            out.extend(copy.pop_n(len(copy), max(now, self.latest)))
        out.extend(self.last_resort)
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
        if self._stamps is not None:
            self._stamps.clear()
        self.last_resort.clear()
        self.uncached.clear()
        self.push_uncached(order)
        return order
