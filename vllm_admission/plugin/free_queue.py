"""A policy-ordered stand-in for vLLM's ``FreeKVCacheBlockQueue``.

vLLM 0.32 keeps every free block of the pool in one doubly linked list,
``BlockPool.free_block_queue`` (``vllm/v1/core/kv_cache_utils.py``,
``FreeKVCacheBlockQueue``), and that list's order is the eviction order:
``BlockPool.free_blocks`` puts blocks without a hash at the head
(``prepend_n``) and cached blocks at the tail (``append_n``);
``BlockPool.get_new_blocks`` takes blocks from the head (``popleft_n``) and
drops the hash of any cached block it took; ``BlockPool.touch`` pulls a cached
block back out on a prefix hit (``remove``).

:class:`PolicyFreeBlockQueue` serves the same calls from the core's
:class:`~vllm_admission.core.free_blocks.FreeBlocks` (the simulator's pool
keeps its free blocks in the same structure), three tiers taken in this order
by ``popleft``/``popleft_n``:

1. blocks without a hash, as a stack: ``prepend_n`` pushes, so the next block
   handed out is exactly the one vLLM's list would hand out;
2. cached blocks, ordered by any engine-capable
   :class:`vllm_admission.core.eviction.EvictionPolicy` (``flop``: Marconi's
   recency + alpha x FLOP efficiency; or any other), the same object the
   simulator's pool runs;
3. blocks without a hash that were *appended* (vLLM's ``BlockPool.unpin_blocks``
   returns such blocks as last-resort candidates), first in first out.

A cached block's FLOP efficiency (for policies that ``needs_values``) is
supplied at ``append_n`` time by the caller, either staged per block
(:meth:`stage_value`, valid only while the block keeps that hash) or through the
current free stamp: a ``(now, value_of)`` pair, the time and the value function
shared by a free batch (the blocks one request frees together), set directly as
:attr:`free_stamp` or made on first need by ``free_stamp_maker(key)`` while
:meth:`open_free_batch` ``(key)`` is in effect (the plugin's KV cache coordinator
opens a batch, keyed by request id, while it frees that request's blocks). Without
either the value is 0. Time comes from the injected ``clock`` (the plugin's request clock
in the engine: the index of the latest arriving request, the same unit as the
simulator's ``now``).

This module does not import vLLM: blocks only need ``block_id`` and
``block_hash`` attributes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from vllm_admission.core.eviction import EvictionPolicy
from vllm_admission.core.free_blocks import FreeBlocks

__all__ = ["PolicyFreeBlockQueue"]

Block = Any  # vllm.v1.core.kv_cache_utils.KVCacheBlock or any object with block_id / block_hash


class PolicyFreeBlockQueue:
    """Free blocks of one ``BlockPool``: uncached first, cached ones in the policy's order.

    The order lives in a core :class:`~vllm_admission.core.free_blocks.FreeBlocks`
    over block ids (the structure the simulator's pool uses); this class adds
    the translation from vLLM's block objects and the values of cached blocks.

    Args:
        blocks: the free blocks in the order vLLM's queue holds them (head
            first), e.g. ``old_queue.get_all_free_blocks()``. Blocks with a
            hash become eviction candidates with value 0.
        eviction: orders the cached free blocks (a tunable policy's ``alpha``
            may be changed at any time).
        clock: non-decreasing recency clock (default ``time.monotonic``; the
            engine passes the request clock of ``AdmissionControl``).
        switchable: allow :meth:`switch` (``auto``).

    Attributes:
        num_free_blocks: free blocks in all tiers (vLLM reads this attribute).
        free_stamp: ``None`` or ``(now, value_of)``: while set, ``append_n`` stamps
            cached blocks with time ``now`` and value ``value_of(block)``.
        free_stamp_maker: ``f(key) -> (now, value_of)`` for :meth:`open_free_batch`.
    """

    def __init__(self, blocks: Iterable[Block], eviction: EvictionPolicy,
                 clock: Callable[[], float] = time.monotonic, *, switchable: bool = False) -> None:
        self.clock = clock
        self.num_free_blocks = 0
        self.free_stamp: tuple[float, Callable[[Block], float]] | None = None
        self.free_stamp_maker: Callable[[Any], tuple[float, Callable[[Block], float]]] | None = None
        self._free_batch_key: Any = None
        self._free = FreeBlocks(eviction, switchable=switchable)
        self._blocks: dict[int, Block] = {}               # every free block by id
        self._staged: dict[int, tuple[Any, float]] = {}   # id -> (hash, value)
        blocks = list(blocks)
        self.prepend_n([b for b in blocks if b.block_hash is None])
        cached = [b for b in blocks if b.block_hash is not None]
        for b in cached:
            self._blocks[b.block_id] = b
        self._free.add_cached([b.block_id for b in cached], clock())
        self.num_free_blocks = len(blocks)
        for b in blocks:  # the linked-list fields belong to vLLM's queue
            if hasattr(b, "prev_free_block"):
                b.prev_free_block = b.next_free_block = None

    @property
    def eviction(self) -> EvictionPolicy:
        """The policy that orders the cached free blocks."""
        return self._free.eviction

    def switch(self, eviction: EvictionPolicy,
               demote: Callable[[Block], bool] | None = None) -> None:
        """Order the cached blocks by ``eviction`` (a fresh policy) from now on;
        the candidates move over with their free times and values, those for
        which ``demote(block)`` is true first, as the oldest
        (:meth:`FreeBlocks.switch <vllm_admission.core.free_blocks.FreeBlocks.switch>`).

        Raises:
            RuntimeError: the queue was not built ``switchable``.
        """
        blocks = self._blocks
        self._free.switch(eviction, None if demote is None else lambda b: demote(blocks[b]))

    # -- values ----------------------------------------------------------
    def stage_value(self, block: Block, value: float) -> None:
        """Give ``block``'s next ``append_n`` this value (FLOPs per byte), provided
        it still holds the hash it has now (a value belongs to a block's content)."""
        self._staged[block.block_id] = (block.block_hash, value)

    def open_free_batch(self, key: Any) -> None:
        """Blocks appended until :meth:`close_free_batch` get ``free_stamp_maker(key)``'s time
        and values (made at the first cached block, so an empty batch costs nothing)."""
        self._free_batch_key = key
        self.free_stamp = None

    def close_free_batch(self) -> None:
        self._free_batch_key = None
        self.free_stamp = None

    # -- vLLM's FreeKVCacheBlockQueue interface ---------------------------
    def popleft(self) -> Block:
        """Take the next block to reuse. Raises ValueError when none is free."""
        if self.num_free_blocks == 0:
            raise ValueError("No free blocks available")
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[Block]:
        """Take ``n`` blocks: uncached ones, then the policy's victims, then the last-resort FIFO.

        Raises:
            ValueError: fewer than ``n`` blocks are free.
        """
        if n <= 0:
            return []
        blocks = self._blocks
        out = [blocks.pop(bid) for bid in self._free.take(n, self.clock())]
        self.num_free_blocks -= n
        return out

    def remove(self, block: Block) -> None:
        """Withdraw a free block (a prefix hit took it). RuntimeError if it is not free."""
        bid = block.block_id
        if self._blocks.pop(bid, None) is None:
            raise RuntimeError(f"remove() called on a block that is not free: {block!r}")
        self._free.remove(bid)
        self.num_free_blocks -= 1

    def append(self, block: Block) -> None:
        """Return one block (see :meth:`append_n`)."""
        self.append_n([block])

    def append_n(self, blocks: list[Block]) -> None:
        """Return blocks to the pool as eviction candidates, in the given order.

        Cached blocks join the policy-ordered tier with the current free stamp's time
        and value (or a staged value); uncached ones join the last-resort FIFO.
        """
        if not blocks:
            return
        registry = self._blocks
        staged = self._staged
        cached: list[int] = []
        values: list[float] = []
        value_of: Callable[[Block], float] | None = None
        now: float | None = None
        for b in blocks:
            bid = b.block_id
            registry[bid] = b
            entry = staged.pop(bid, None) if staged else None
            if b.block_hash is None:
                self._free.append_last_resort((bid,))
                continue
            if now is None:
                stamp = self.free_stamp
                if stamp is None and self._free_batch_key is not None and self.free_stamp_maker is not None:
                    stamp = self.free_stamp = self.free_stamp_maker(self._free_batch_key)
                if stamp is not None:
                    now, value_of = stamp
                else:
                    now = self.clock()
            if entry is not None and entry[0] == b.block_hash:
                values.append(entry[1])
            else:
                values.append(value_of(b) if value_of is not None else 0.0)
            cached.append(bid)
        if cached:
            assert now is not None  # set at the first cached block
            self._free.add_cached(cached, now, values)
        self.num_free_blocks += len(blocks)

    def prepend_n(self, blocks: list[Block]) -> None:
        """Put blocks at the head, ``blocks[0]`` first (vLLM's order for uncached blocks)."""
        registry = self._blocks
        for b in blocks:
            registry[b.block_id] = b
        self._free.push_uncached([b.block_id for b in blocks])
        self.num_free_blocks += len(blocks)

    def get_all_free_blocks(self) -> list[Block]:
        """Every free block in the order they would be handed out now."""
        blocks = self._blocks
        return [blocks[bid] for bid in self._free.order(self.clock())]

    def iter_blocks_after(self, cursor: Block | None) -> Iterator[Block]:
        """Free blocks in hand-out order after ``cursor`` (all of them for ``None``)."""
        blocks = self.get_all_free_blocks()
        start = 0
        if cursor is not None:
            for i, b in enumerate(blocks):
                if b is cursor:
                    start = i + 1
                    break
        yield from blocks[start:]

    # -- plugin helpers ----------------------------------------------------
    def forget_hashes(self) -> None:
        """After ``BlockPool.reset_prefix_cache``: every free block is now uncached.

        Keeps the current hand-out order, all in the uncached stack.
        """
        order = self._free.uncache_all(self.clock())
        eviction = self.eviction
        if eviction.needs_hits:
            for bid in order:
                eviction.forget(bid)
        self._staged.clear()

    @property
    def num_cached_candidates(self) -> int:
        """Free blocks that still hold a hash (eviction candidates)."""
        return self._free.num_cached

    def __len__(self) -> int:
        return self.num_free_blocks

    def __repr__(self) -> str:
        free = self._free
        return (f"PolicyFreeBlockQueue(free={self.num_free_blocks}, uncached={len(free.uncached)}, "
                f"cached={free.num_cached}, last_resort={len(free.last_resort)}, "
                f"eviction={self.eviction.name})")
