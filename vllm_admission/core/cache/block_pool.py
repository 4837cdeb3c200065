"""The shared block pool and its hash index (``vllm/v1/core/block_pool.py``).

One pool of block ids serves every KV cache group. A block gets its hash
through one insertion path (:meth:`BlockPool.cache_position`, behind
:meth:`~BlockPool.cache` and :meth:`~BlockPool.cache_many`) and loses it
through one drop path (:meth:`BlockPool._evict`, when an allocation takes a
cached free block). Under a hash block size below the block size a block may hold
further keys (vLLM's partial entries): :meth:`~BlockPool.add_key` adds one,
:meth:`~BlockPool.drop_keys` removes a block's keys when it is keyed again under
a longer prefix, :meth:`~BlockPool.move_keys` hands them to a copy; eviction drops
them all. The free blocks wait in a
:class:`~vllm_admission.core.free_blocks.FreeBlocks`: uncached ones first, then
the cached ones in the eviction policy's order.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable, Sequence

from vllm_admission.core.eviction import EvictionPolicy
from vllm_admission.core.free_blocks import FreeBlocks

__all__ = ["NULL", "BlockPool", "PoolExhausted"]

NULL = 0  # vLLM's null block id: a placeholder in a state group's block table


class PoolExhausted(RuntimeError):
    """An allocation asked for more blocks than the pool can free."""


@functools.lru_cache(maxsize=8)
def _block_ids(num_blocks: int) -> tuple[int, ...]:
    """``1 .. num_blocks - 1``, built once per size: the pools of one process
    (the shadow caches of ``auto``) share the ``int`` objects."""
    return tuple(range(1, num_blocks))


class BlockPool:
    """The shared block pool (``vllm/v1/core/block_pool.py``), for hit purposes.

    Blocks are integer ids ``1 .. num_blocks - 1`` (id 0 is vLLM's null block).
    Per block it keeps the reference count and, while cached, its hash
    (``key``, ``None`` while uncached) and group (``group``): the block's
    ``(group, block_hash)`` key, kept as two lists so that no tuple is built
    per cached block. ``index[g]`` maps a hash to the first cached
    block of group ``g`` with that hash (``BlockHashToBlockMap.get_one_block``);
    later duplicates wait in ``_dups`` in insertion order.

    Free blocks without a hash sit on a stack and are reused first (vLLM
    prepends them to ``free_block_queue``); free cached blocks are ordered by
    the eviction policy. ``value`` and ``next_use`` are what the policy is told
    when a cached block becomes a candidate; they are kept (set by the caller
    before :meth:`free`, reset at eviction) only for a policy that reads them
    (:attr:`~EvictionPolicy.needs_values`, :attr:`~EvictionPolicy.needs_future`);
    ``value`` exists only where a policy may read it (a values policy or a
    switchable pool; :class:`~vllm_admission.core.cache.HybridPrefixCache` adds
    it with ``track_values``), ``next_use`` only for a policy that needs the
    future (else both are ``None``). Block ids are the same ``int`` objects in
    every pool of the process.

    What the eviction policy declares (``needs_keys``, ``needs_hits``,
    ``needs_values``, ``needs_future``) is read once, by :meth:`_bind`, when the
    pool is built and when :meth:`switch` installs another policy.

    Args:
        num_blocks: blocks in the pool, as vLLM reports ``num_gpu_blocks``.
        eviction: orders the cached free blocks.
        num_groups: KV cache groups sharing the pool.
        switchable: the eviction policy can be replaced mid-run (:meth:`switch`).

    Raises:
        ValueError: ``num_blocks < 2`` or ``num_groups < 1``.
    """

    def __init__(self, num_blocks: int, eviction: EvictionPolicy, num_groups: int = 1, *,
                 switchable: bool = False) -> None:
        if num_blocks < 2:
            raise ValueError(f"a block pool needs at least 2 blocks, got {num_blocks}")
        if num_groups < 1:
            raise ValueError(f"num_groups must be >= 1, got {num_groups}")
        self.num_blocks = num_blocks
        self.free_blocks = FreeBlocks(eviction, switchable=switchable)
        self._switchable = switchable
        self.free_blocks.push_uncached(_block_ids(num_blocks))
        self.key: list[Hashable | None] = [None] * num_blocks
        self.group: list[int] = [0] * num_blocks
        self.ref: list[int] = [0] * num_blocks
        self._bind(eviction)
        self.value: list[float] | None = [0.0] * num_blocks if self.keeps_values else None
        self.next_use: list[float] | None = (
            [math.inf] * num_blocks if self.keeps_next_use else None)
        self.index: list[dict[Hashable, int]] = [{} for _ in range(num_groups)]
        self._dups: dict[tuple[int, Hashable], list[int]] = {}
        self._num_dups: list[int] = [0] * num_groups  # entries waiting in _dups, per group
        #: Further keys of a block besides ``key`` (same group): the sub-block
        #: keys of a hash block size below the block size (``cached_block_hashes_by_block``).
        self._more: dict[int, list[Hashable]] = {}
        #: Blocks whose hash was dropped to make room (cumulative).
        self.evictions = 0
        #: Cached entries inserted (cumulative), per KV cache group index.
        self.insertions_by_group: list[int] = [0] * num_groups
        #: Entries removed other than by eviction (a block re-keyed or whose
        #: keys moved to another block), per group.
        self._removed_by_group: list[int] = [0] * num_groups

    def _bind(self, eviction: EvictionPolicy) -> None:
        """Read what the eviction policy needs from the pool, once."""
        #: The policy hears each cached block's key (``on_cache``).
        self.reports_keys = eviction.needs_keys
        #: The policy hears prefix hits (``on_hit``).
        self.reports_hits = eviction.needs_hits
        #: The policy hears each request's prompt hashes (``on_request``).
        self.reports_requests = eviction.needs_requests
        #: Freed blocks carry a value (the policy reads it, or may after a switch).
        self.keeps_values = eviction.needs_values or self._switchable
        #: Freed blocks carry the time of their next use (``belady``).
        self.keeps_next_use = eviction.needs_future

    @property
    def eviction(self) -> EvictionPolicy:
        """The policy that orders the cached free blocks."""
        return self.free_blocks.eviction

    def clone(self, eviction: EvictionPolicy) -> BlockPool:
        """An independent copy of this pool that uses ``eviction`` (a clone of ours)."""
        other = BlockPool.__new__(BlockPool)
        other.num_blocks = self.num_blocks
        other.free_blocks = self.free_blocks.clone(eviction)
        other._switchable = self._switchable
        other._bind(eviction)
        other.key = self.key[:]
        other.group = self.group[:]
        other.ref = self.ref[:]
        other.value = self.value[:] if self.value is not None else None
        other.next_use = self.next_use[:] if self.next_use is not None else None
        other.index = [d.copy() for d in self.index]
        other._dups = {k: v[:] for k, v in self._dups.items()}
        other._num_dups = self._num_dups[:]
        other._more = {b: v[:] for b, v in self._more.items()}
        other.evictions = self.evictions
        other.insertions_by_group = self.insertions_by_group[:]
        other._removed_by_group = self._removed_by_group[:]
        return other

    def switch(self, eviction: EvictionPolicy,
               demote: Callable[[int], bool] | None = None) -> None:
        """Hand the cached free blocks to ``eviction`` (a fresh policy) from now on
        (:meth:`FreeBlocks.switch <vllm_admission.core.free_blocks.FreeBlocks.switch>`,
        whose errors it raises)."""
        self.free_blocks.switch(eviction, demote)
        self._bind(eviction)

    # -- queries ---------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks an allocation can take now (uncached plus evictable)."""
        return len(self.free_blocks)

    @property
    def num_free_uncached(self) -> int:
        """Free blocks that hold no hash."""
        return len(self.free_blocks.uncached)

    @property
    def num_used(self) -> int:
        """Blocks referenced by running requests."""
        return self.num_blocks - 1 - self.num_free

    @property
    def num_cached_entries(self) -> int:
        """Cached (hashed) blocks, in use or free."""
        return sum(len(d) for d in self.index) + sum(len(v) for v in self._dups.values())

    @property
    def evictions_by_group(self) -> list[int]:
        """Evictions per KV cache group index (entries inserted less those still cached
        and those removed when a block was re-keyed or its keys moved)."""
        return [inserted - len(idx) - dups - removed for inserted, idx, dups, removed
                in zip(self.insertions_by_group, self.index, self._num_dups,
                       self._removed_by_group, strict=True)]

    def get_cached(self, key: tuple[int, Hashable]) -> int | None:
        """The first cached block for ``(group, block_hash)``, or None."""
        return self.index[key[0]].get(key[1])

    # -- references --------------------------------------------------------
    def allocate(self, n: int, now: float) -> list[int]:
        """Take ``n`` blocks: uncached ones first, then evict in policy order.

        Raises:
            PoolExhausted: fewer than ``n`` blocks are free.
        """
        free = self.free_blocks
        num_uncached, num_cached = len(free.uncached), free.num_cached
        if n > num_uncached + num_cached + len(free.last_resort):
            raise PoolExhausted(f"need {n} blocks, {len(free)} free of {self.num_blocks - 1}")
        out = free.take(n, now)
        if n > num_uncached:
            # After the uncached stack come the policy's victims (then the last-resort FIFO).
            self._evict(out[num_uncached:n if n - num_uncached < num_cached
                            else num_uncached + num_cached])
        ref = self.ref
        for b in out:
            ref[b] = 1
        return out

    def touch(self, blocks: Sequence[int], now: float) -> None:
        """A prefix hit takes references on cached blocks (``BlockPool.touch``);
        a policy that :attr:`~EvictionPolicy.needs_hits` hears each of them."""
        ref = self.ref
        free = self.free_blocks
        for b in blocks:
            if ref[b] == 0:
                free.remove_cached(b)
            ref[b] += 1
        if self.reports_hits:
            eviction = free.eviction
            for b in blocks:
                eviction.on_hit(b, now)

    def free(self, ordered: Sequence[int], now: float) -> None:
        """Drop one reference each, in eviction-priority order (``free_blocks``).

        Cached blocks that reach zero references become eviction candidates,
        appended in the given order; uncached ones go to the head of the free
        list (``prepend_n``).
        """
        self.free_each((ordered,), now)

    def free_each(self, lists: Sequence[Sequence[int]], now: float) -> None:
        """:meth:`free` of each list in turn (one request's groups), in one pass.

        The result is that of consecutive :meth:`free` calls: the cached blocks
        join the policy in the lists' order, and the uncached ones are pushed
        list after list (so the last list's are handed out first).
        """
        ref, keys = self.ref, self.key
        cached: list[int] = []
        uncached: list[int] = []
        for ordered in lists:
            released = []
            for b in ordered:
                r = ref[b] - 1
                ref[b] = r
                if r == 0:
                    if keys[b] is None:
                        released.append(b)
                    else:
                        cached.append(b)
            if released:
                uncached[:0] = released  # pushed after the earlier lists' blocks
        free = self.free_blocks
        if uncached:
            free.push_uncached(uncached)
        if cached:
            values: list[float] | None = None
            next_uses: list[float] | None = None
            if self.keeps_values:
                value = self.value
                assert value is not None  # kept while keeps_values (__init__, _bind)
                values = [value[b] for b in cached]
            if self.keeps_next_use:
                next_use = self.next_use
                assert next_use is not None  # kept while keeps_next_use (__init__, _bind)
                next_uses = [next_use[b] for b in cached]
            free.add_cached(cached, now, values, next_uses)

    # -- the hash index: one insertion path, one drop path -------------------
    def cache(self, block: int, key: tuple[int, Hashable], *, report: bool = True) -> None:
        """Give an in-use block its hash (``cache_full_blocks``): :meth:`cache_position`
        of one block.

        A policy that :attr:`~EvictionPolicy.needs_keys` hears
        :meth:`~EvictionPolicy.on_cache` unless ``report`` is False (a state a
        live engine caches only tentatively: see
        :meth:`StateGroups.cache_full <vllm_admission.core.cache.groups.StateGroups.cache_full>`).
        """
        self.cache_position(((key[0], block),), key[1], report=report)

    def cache_position(self, blocks: Sequence[tuple[int, int]], block_hash: Hashable, *,
                       report: bool = True, further: bool = False) -> None:
        """Give each in-use ``(group, block)`` of ``blocks`` the key ``(group,
        block_hash)``, in order (one position, every group of a kind): the one
        insertion path. A later duplicate of a key waits in ``_dups`` behind the
        first (``BlockHashToBlockMap.insert``); ``report`` as for :meth:`cache`.
        ``further``: the blocks already have a key and this one is added beside
        it (:meth:`add_key`; vLLM's ``cached_block_hashes_by_block``)."""
        keys, groups, index, inserted = self.key, self.group, self.index, self.insertions_by_group
        for g, b in blocks:
            if further:
                self._more.setdefault(b, []).append(block_hash)
            else:
                keys[b] = block_hash
                groups[b] = g
            idx = index[g]
            if block_hash in idx:
                self._dups.setdefault((g, block_hash), []).append(b)
                self._num_dups[g] += 1
            else:
                idx[block_hash] = b
            inserted[g] += 1
        if report and self.reports_keys:
            eviction = self.free_blocks.eviction
            for g, b in blocks:
                eviction.on_cache(b, (g, block_hash))

    def cache_many(self, group: int, blocks: Sequence[int], hashes: Sequence[Hashable]) -> None:
        """:meth:`cache` of ``blocks[i]`` under ``(group, hashes[i])``, in order
        (through the one insertion path)."""
        cache = self.cache
        for b, h in zip(blocks, hashes, strict=True):
            cache(b, (group, h))

    def _evict(self, victims: Sequence[int]) -> None:
        """Drop the hashes of cached blocks the policy just gave up (the only
        way a hash leaves the index) and reset their eviction metadata."""
        keys, groups, index, dups = self.key, self.group, self.index, self._dups
        if self._more:
            more = self._more
            for b in victims:
                if b in more:
                    g = groups[b]
                    for h in more.pop(b):
                        self._index_remove(g, b, h)
        if dups:
            # _index_remove of each victim's key, written out: this is the eviction
            # hot path (a call per victim costs the plain run about 3 %).
            for b in victims:
                key = (groups[b], keys[b])
                if key in dups:
                    self._drop_duplicated(b, key)
                else:
                    del index[key[0]][key[1]]
        else:
            for b in victims:
                del index[groups[b]][keys[b]]
        for b in victims:
            keys[b] = None
        self.evictions += len(victims)
        if self.keeps_values:
            values = self.value
            assert values is not None  # kept while keeps_values (__init__, _bind)
            for b in victims:
                values[b] = 0.0
        if self.keeps_next_use:
            next_use = self.next_use
            assert next_use is not None  # kept while keeps_next_use (__init__, _bind)
            for b in victims:
                next_use[b] = math.inf

    # -- sub-block keys (a hash block size below the block size) ---------------------
    def _index_remove(self, g: int, b: int, block_hash: Hashable) -> None:
        """Remove the entry ``(g, block_hash) -> b``; the first duplicate, if
        any, takes the index entry."""
        key = (g, block_hash)
        if key in self._dups:
            self._drop_duplicated(b, key)
        else:
            del self.index[g][block_hash]

    def _has_entry(self, g: int, b: int, block_hash: Hashable) -> bool:
        if self.index[g].get(block_hash) == b:
            return True
        return b in self._dups.get((g, block_hash), ())

    def add_key(self, group: int, block: int, block_hash: Hashable) -> None:
        """Make in-use ``block`` of ``group`` reachable under ``block_hash`` too
        (``BlockPool.cache_partial_block`` / ``_insert_block_hash``): its key if
        it has none, else one more key; nothing if it already has this one."""
        if self.key[block] is None:
            self.cache_position(((group, block),), block_hash)
        elif not self._has_entry(group, block, block_hash):
            self.cache_position(((group, block),), block_hash, report=False, further=True)

    def keys_of(self, block: int) -> list[Hashable]:
        """Every key of ``block``: its key first, then its further keys."""
        first = self.key[block]
        if first is None:
            return []
        return [first, *self._more.get(block, ())]

    def drop_keys(self, block: int) -> list[Hashable]:
        """Remove every key of in-use ``block`` (``_remove_cached_block_hashes``:
        a block about to be cached under a longer prefix) and return them."""
        hashes = self.keys_of(block)
        if hashes:
            g = self.group[block]
            self._more.pop(block, None)
            for h in hashes:
                self._index_remove(g, block, h)
            self.key[block] = None
            self._removed_by_group[g] += len(hashes)
        return hashes

    def move_keys(self, src: int, dst: int) -> None:
        """Re-point every key of in-use ``src`` to in-use, uncached ``dst``
        (``BlockPool.move_block_hashes``: the prefix cache keeps a copy of the
        block while its owner writes on): each entry leaves the index and
        enters again behind any duplicate."""
        g = self.group[src]
        for h in self.drop_keys(src):
            self.add_key(g, dst, h)

    def _drop_duplicated(self, block: int, key: tuple[int, Hashable]) -> None:
        """:meth:`_index_remove` of an entry whose key has waiting duplicates: the
        first duplicate takes the index entry if ``block`` held it."""
        g, h = key
        idx = self.index[g]
        dups = self._dups[key]
        if idx.get(h) == block:
            idx[h] = dups.pop(0)
        else:
            dups.remove(block)
        self._num_dups[g] -= 1
        if not dups:
            del self._dups[key]
