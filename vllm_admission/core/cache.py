"""A block-level model of vLLM 0.32's prefix cache for hybrid models (align mode).

:class:`BlockPool` mirrors ``vllm/v1/core/block_pool.py`` where prefix hits are
concerned: one pool of blocks shared by every KV cache group; a block hash maps
to the cached blocks that hold it (duplicates allowed, the first inserted is
returned); blocks without a hash are reused first (vLLM prepends them to
``free_block_queue``), cached free blocks wait in the eviction policy's order.
Block ids do not influence hits, so uncached free blocks are only counted.

:class:`HybridPrefixCache` runs one request at a time through the same steps as
vLLM's scheduler and KV cache manager, for a model with full-attention groups
and recurrent-state (Mamba / GDN) groups:

1. lookup (``HybridKVCacheCoordinator.find_longest_cache_hit``): the longest
   run of cached attention blocks, capped at ``prompt_len - 1`` tokens, then the
   longest prefix within it whose state is cached in every state group;
2. touch the hit blocks (``add_local_computed_blocks``);
3. prefill in chunks of at most ``chunk_size`` tokens, each clipped by
   ``Scheduler._mamba_block_aligned_split`` (block-aligned chunk ends, a stop
   at the prompt's last reusable block boundary, the admission policy's stops);
4. per step: free retired state blocks (``MambaManager.remove_skipped_blocks``),
   allocate (``allocate_new_blocks``: one new state block per group per step,
   attention blocks for every new token), cache the now-full blocks
   (``cache_blocks``; a state block is cached only if the admission policy
   admits its position);
5. decode ``output_len - 1`` steps of one token;
6. free every block, each group's blocks in reverse (``SingleTypeKVCacheManager.free``).

The model assumes a Gated DeltaNet-like state group (no internal prefill
checkpoint blocks), no speculative decoding, and a hash block size equal to
the block size (vLLM's default for hybrid models). ``docs/simulator.md`` lists
these facts with their sources.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from vllm_admission.core.admission import AdmissionPolicy, HitProbe, checkpoint_kinds
from vllm_admission.core.eviction import EvictionPolicy

__all__ = ["Block", "BlockPool", "HybridPrefixCache", "PoolExhausted", "RequestOutcome"]

ATTENTION = "attention"
STATE = "state"


class PoolExhausted(RuntimeError):
    """An allocation asked for more blocks than the pool can free."""


class Block:
    """One block of the pool: ``key`` is ``(group, block_hash)`` while cached."""

    __slots__ = ("bid", "key", "ref", "value", "next_use")

    def __init__(self, bid: int) -> None:
        self.bid = bid
        self.key: tuple | None = None
        self.ref = 0
        self.value = 0.0
        self.next_use = math.inf

    def __repr__(self) -> str:
        return f"Block({self.bid}, key={self.key}, ref={self.ref})"


class BlockPool:
    """The shared block pool (``vllm/v1/core/block_pool.py``), for hit purposes.

    Args:
        num_blocks: blocks in the pool, as vLLM reports ``num_gpu_blocks``; one
            is vLLM's null block, so ``num_blocks - 1`` are usable.
        eviction: orders the cached free blocks.

    Raises:
        ValueError: ``num_blocks < 2``.
    """

    def __init__(self, num_blocks: int, eviction: EvictionPolicy) -> None:
        if num_blocks < 2:
            raise ValueError(f"a block pool needs at least 2 blocks, got {num_blocks}")
        self.num_blocks = num_blocks
        self.eviction = eviction
        self.num_free_uncached = num_blocks - 1
        self.index: dict[tuple, list[Block]] = {}
        self._free_cached: dict[int, Block] = {}
        self._ids = itertools.count(1)
        #: Blocks whose hash was dropped to make room (cumulative).
        self.evictions = 0
        #: Evictions per KV cache group index.
        self.evictions_by_group: dict[int, int] = {}
        #: Cached entries inserted (cumulative), by group index.
        self.insertions_by_group: dict[int, int] = {}

    # -- queries ---------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks an allocation can take now (uncached plus evictable)."""
        return self.num_free_uncached + len(self._free_cached)

    @property
    def num_used(self) -> int:
        """Blocks referenced by running requests."""
        return self.num_blocks - 1 - self.num_free

    @property
    def num_cached_entries(self) -> int:
        """Cached (hashed) blocks, in use or free."""
        return sum(len(v) for v in self.index.values())

    def get_cached(self, key: tuple) -> Block | None:
        """The first cached block for ``key`` (``BlockHashToBlockMap.get_one_block``)."""
        blocks = self.index.get(key)
        return blocks[0] if blocks else None

    # -- mutations -------------------------------------------------------
    def allocate(self, n: int, now: float) -> list[Block]:
        """Take ``n`` blocks: uncached ones first, then evict in policy order.

        Raises:
            PoolExhausted: fewer than ``n`` blocks are free.
        """
        if n > self.num_free:
            raise PoolExhausted(f"need {n} blocks, {self.num_free} free of {self.num_blocks - 1}")
        out = []
        fresh = min(n, self.num_free_uncached)
        self.num_free_uncached -= fresh
        for _ in range(fresh):
            b = Block(next(self._ids))
            b.ref = 1
            out.append(b)
        for _ in range(n - fresh):
            b = self._free_cached.pop(self.eviction.pop(now))
            if b.key is not None:
                self._drop_key(b)
                self.evictions += 1
                g = b.key[0]
                self.evictions_by_group[g] = self.evictions_by_group.get(g, 0) + 1
                b.key = None
            b.ref = 1
            b.value, b.next_use = 0.0, math.inf
            out.append(b)
        return out

    def touch(self, blocks: Sequence[Block]) -> None:
        """A prefix hit takes references on cached blocks (``BlockPool.touch``)."""
        for b in blocks:
            if b.ref == 0:
                self.eviction.remove(b.bid)
                del self._free_cached[b.bid]
            b.ref += 1

    def free(self, ordered: Sequence[Block], now: float) -> None:
        """Drop one reference each, in eviction-priority order (``free_blocks``).

        Cached blocks that reach zero references become eviction candidates,
        appended in the given order; uncached ones return to the free count.
        """
        for b in ordered:
            b.ref -= 1
            if b.ref == 0:
                if b.key is None:
                    self.num_free_uncached += 1
                else:
                    self._free_cached[b.bid] = b
                    self.eviction.add(b.bid, now, b.value, b.next_use)

    def cache(self, block: Block, key: tuple) -> None:
        """Give an in-use block a hash (``cache_full_blocks``)."""
        assert block.key is None and block.ref > 0
        block.key = key
        self.index.setdefault(key, []).append(block)
        g = key[0]
        self.insertions_by_group[g] = self.insertions_by_group.get(g, 0) + 1

    def _drop_key(self, block: Block) -> None:
        blocks = self.index[block.key]
        blocks.remove(block)
        if not blocks:
            del self.index[block.key]


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """What one request got from the cache. Lengths in tokens.

    ``hit_tokens`` is what vLLM reports as ``num_cached_tokens``.
    """

    prompt_tokens: int
    hit_tokens: int
    kv_hit_tokens: int
    junction: int
    checkpoints: int
    evictions: int


@dataclass(slots=True)
class _Running:
    """Per-request bookkeeping while a request runs (the managers' dicts)."""

    rid: int
    hashes: Sequence[int]
    prompt_len: int
    total_len: int
    junction: int
    stops: tuple[int, ...]
    hit: int
    blocks: list[list[Block | None]]
    num_cached: list[int]
    retired: list[int]
    #: State positions this request admitted, ascending.
    admitted: list[int] = field(default_factory=list)
    #: Cached state positions at or below the hit (computed once, for values).
    below_hit: list[int] | None = None


class HybridPrefixCache:
    """vLLM 0.32's hybrid prefix cache in align mode, one request at a time.

    Args:
        num_blocks: blocks in the pool (vLLM's ``num_gpu_blocks``).
        block_size: tokens per block (attention and state groups alike).
        group_kinds: the KV cache groups in vLLM's order, each ``"attention"``
            or ``"state"``; at least one of each.
        admission: which states are checkpointed.
        eviction: which cached free blocks are evicted first.
        chunk_size: prefill token budget per step (``max_num_batched_tokens``).
        segment_flops: ``f(end, start) -> FLOPs`` of computing tokens
            ``[start, end)`` with ``start`` cached; needed by eviction policies
            that use values (``flop``).
        bytes_per_block: bytes one block id holds (for FLOP efficiency).
        next_use: ``f(block_hash, now) -> time`` of the next request needing the
            hash; needed by ``belady``.

    Raises:
        ValueError: bad geometry or a missing callback for the chosen eviction.
    """

    def __init__(self, *, num_blocks: int, block_size: int, group_kinds: Sequence[str],
                 admission: AdmissionPolicy, eviction: EvictionPolicy, chunk_size: int,
                 segment_flops: Callable[[int, int], float] | None = None,
                 bytes_per_block: int = 1,
                 next_use: Callable[[int, float], float] | None = None) -> None:
        if block_size < 1 or chunk_size < 1:
            raise ValueError(f"block_size and chunk_size must be >= 1, got {block_size}, {chunk_size}")
        kinds = tuple(group_kinds)
        if ATTENTION not in kinds or STATE not in kinds or set(kinds) - {ATTENTION, STATE}:
            raise ValueError(f"group_kinds must mix 'attention' and 'state' groups, got {kinds}")
        if eviction.needs_values and segment_flops is None:
            raise ValueError(f"eviction {eviction.name!r} needs segment_flops")
        if eviction.needs_future and next_use is None:
            raise ValueError(f"eviction {eviction.name!r} needs next_use")
        self.block_size = block_size
        self.chunk_size = chunk_size
        self.group_kinds = kinds
        self.attn_groups = tuple(g for g, k in enumerate(kinds) if k == ATTENTION)
        self.state_groups = tuple(g for g, k in enumerate(kinds) if k == STATE)
        self.admission = admission
        self.eviction = eviction
        self.pool = BlockPool(num_blocks, eviction)
        self.segment_flops = segment_flops
        self.bytes_per_block = bytes_per_block
        self.next_use = next_use
        #: State checkpoints admitted (cumulative, counted once per position).
        self.checkpoints = 0
        self.junctions = 0

    # -- sizing ----------------------------------------------------------
    def blocks_needed(self, prompt_len: int, output_len: int) -> int:
        """Most blocks a request holds at once (attention + 2 state blocks per group)."""
        last = prompt_len + output_len - 1
        return len(self.attn_groups) * -(-last // self.block_size) + 2 * len(self.state_groups)

    def fits(self, prompt_len: int, output_len: int) -> bool:
        """Whether the request can ever run alone in this pool."""
        return self.blocks_needed(prompt_len, output_len) <= self.pool.num_blocks - 1

    # -- lookup ----------------------------------------------------------
    def lookup(self, hashes: Sequence[int], prompt_len: int) -> HitProbe:
        """Attention-KV hit and hybrid hit of a prompt, without touching anything."""
        get = self.pool.get_cached
        max_blocks = min((prompt_len - 1) // self.block_size, len(hashes))
        k = 0
        while k < max_blocks:
            h = hashes[k]
            if any(get((g, h)) is None for g in self.attn_groups):
                break
            k += 1
        state = 0
        for i in range(k - 1, -1, -1):
            h = hashes[i]
            if all(get((g, h)) is not None for g in self.state_groups):
                state = i + 1
                break
        return HitProbe(prompt_len, self.block_size, k * self.block_size, state * self.block_size)

    # -- one request -----------------------------------------------------
    def serve(self, hashes: Sequence[int], prompt_len: int, output_len: int,
              rid: int, now: float) -> RequestOutcome:
        """Run one request to completion and return what it hit.

        Args:
            hashes: chained block hashes of the prompt's full blocks
                (``prompt_len // block_size`` of them).
            prompt_len: prompt tokens (>= 1).
            output_len: tokens generated (>= 1).
            rid: a request number unique in this run (names output blocks).
            now: logical time of the request.

        Raises:
            PoolExhausted: the request does not fit (check :meth:`fits`).
        """
        B = self.block_size
        evictions_before = self.pool.evictions
        probe = self.lookup(hashes, prompt_len)
        hit_blocks = probe.state_hit // B
        junction = probe.junction if self.admission.uses_junction else 0
        if probe.junction:
            self.junctions += 1
        ngroups = len(self.group_kinds)
        run = _Running(rid=rid, hashes=hashes, prompt_len=prompt_len,
                       total_len=prompt_len + output_len, junction=junction,
                       stops=self.admission.stops(probe), hit=probe.state_hit,
                       blocks=[[] for _ in range(ngroups)], num_cached=[hit_blocks] * ngroups,
                       retired=[0] * ngroups)
        if hit_blocks:
            self._touch_hit(run, hit_blocks)

        computed = probe.state_hit
        while computed < prompt_len:
            n = self._split(run, computed, min(prompt_len - computed, self.chunk_size))
            self._step(run, computed, n, num_tokens=prompt_len, now=now)
            computed += n
        # Decode: step j computes token prompt_len + j - 1; only steps next to a
        # block boundary change the cache, so only those are replayed.
        last = prompt_len + output_len - 2
        for t in self._decode_events(prompt_len, last):
            self._step(run, t, 1, num_tokens=t + 1, now=now)
        self._finish(run, now)
        return RequestOutcome(prompt_tokens=prompt_len, hit_tokens=probe.state_hit,
                              kv_hit_tokens=probe.kv_hit, junction=probe.junction,
                              checkpoints=len(run.admitted),
                              evictions=self.pool.evictions - evictions_before)

    def _decode_events(self, first: int, last: int):
        B = self.block_size
        if first > last:
            return
        yield first
        m = first // B + 1
        while m * B - 1 <= last:
            for t in (m * B - 1, m * B, m * B + 1):
                if first < t <= last:
                    yield t
            m += 1

    def _touch_hit(self, run: _Running, hit_blocks: int) -> None:
        get = self.pool.get_cached
        h = run.hashes
        for g, kind in enumerate(self.group_kinds):
            if kind == ATTENTION:
                blocks = [get((g, h[i])) for i in range(hit_blocks)]
                self.pool.touch(blocks)
                run.blocks[g] = blocks
            else:
                b = get((g, h[hit_blocks - 1]))
                self.pool.touch([b])
                run.blocks[g] = [None] * (hit_blocks - 1) + [b]

    def _split(self, run: _Running, start: int, n: int) -> int:
        """``Scheduler._mamba_block_aligned_split`` for a fresh request (no EAGLE)."""
        B, P = self.block_size, run.prompt_len
        end = start + n
        if end < P:
            aligned = end // B * B
            if aligned > start or B <= self.chunk_size:
                end = aligned
        last_cache_position = max((P - 1) // B * B, 0)
        candidates = [last_cache_position]
        if start % B:
            candidates.append((start // B + 1) * B)
        candidates.extend(run.stops)
        end = min((s for s in candidates if start < s < end), default=end)
        return max(end - start, 0)

    def _step(self, run: _Running, start: int, n: int, *, num_tokens: int, now: float) -> None:
        B = self.block_size
        pool = self.pool
        # 1. remove_skipped_blocks: state groups keep only the block holding the
        #    state of the last computed token.
        if start > 0:
            skipped = (start - 1) // B
            for g in self.state_groups:
                blocks = run.blocks[g]
                first, last = run.retired[g], min(skipped, len(blocks))
                if first >= last:
                    continue
                freed = []
                for i in range(last - 1, first - 1, -1):
                    b = blocks[i]
                    if b is not None:
                        freed.append((i, b))
                        blocks[i] = None
                run.retired[g] = last
                if freed:
                    self._set_values(run, freed, g)
                    pool.free([b for _, b in freed], now)
        # 2. allocate_new_blocks, group by group.
        need = -(-(start + n) // B)
        for g, kind in enumerate(self.group_kinds):
            blocks = run.blocks[g]
            if kind == ATTENTION:
                if need > len(blocks):
                    blocks.extend(pool.allocate(need - len(blocks), now))
            elif need > len(blocks):
                blocks.extend([None] * (need - 1 - len(blocks)))
                blocks.extend(pool.allocate(1, now))
        # 3. cache_blocks up to the finalized tokens.
        full = min(start + n, num_tokens) // B
        for g, kind in enumerate(self.group_kinds):
            nc = run.num_cached[g]
            if nc >= full:
                continue
            blocks = run.blocks[g]
            for i in range(nc, full):
                b = blocks[i]
                if b is None:
                    continue
                if kind == STATE:
                    pos = (i + 1) * B
                    kinds = checkpoint_kinds(pos, prompt_len=run.prompt_len, total_len=run.total_len,
                                             block_size=B, junction=run.junction)
                    if not self.admission.admit(kinds):
                        continue
                    if g == self.state_groups[0]:
                        run.admitted.append(pos)
                        self.checkpoints += 1
                pool.cache(b, (g, self._hash(run, i)))
            run.num_cached[g] = full

    def _hash(self, run: _Running, i: int):
        if i < len(run.hashes):
            return run.hashes[i]
        return ("out", run.rid, i)  # output tokens are never part of a later prompt

    def _finish(self, run: _Running, now: float) -> None:
        for g in range(len(self.group_kinds)):
            blocks = run.blocks[g]
            freed = [(i, blocks[i]) for i in range(len(blocks) - 1, -1, -1) if blocks[i] is not None]
            self._set_values(run, freed, g)
            self.pool.free([b for _, b in freed], now)
            run.blocks[g] = []

    # -- eviction metadata ----------------------------------------------
    def _set_values(self, run: _Running, freed: list[tuple[int, Block]], g: int) -> None:
        """Attach FLOP efficiency / next use to ``(index, block)`` pairs about to be freed."""
        if self.eviction.needs_values:
            self._set_flop_values(run, freed, g)
        if self.eviction.needs_future:
            for _, b in freed:
                if b.key is not None:
                    b.next_use = self.next_use(b.key[1], run.rid)

    def _set_flop_values(self, run: _Running, freed: list[tuple[int, Block]], g: int) -> None:
        """FLOP efficiency of each block's segment (Marconi 4.2, at block granularity).

        A segment runs from one cached state position ``q`` of this prefix to
        the next ``p``; its value is the FLOPs a hit at ``p`` saves over a hit at
        ``q`` (``segment_flops(p, q)``), divided by the bytes the segment holds
        (its attention blocks in every attention group, plus one state block per
        state group). Every block of the segment gets that value; attention
        blocks past the last state get 0 (no hybrid hit can use them).
        """
        B = self.block_size
        ckpts = self._known_checkpoints(run)
        values = {}
        prev = 0
        per_block = len(self.attn_groups) * self.bytes_per_block
        state_bytes = len(self.state_groups) * self.bytes_per_block
        for p in ckpts:
            values[p] = self.segment_flops(p, prev) / ((p - prev) // B * per_block + state_bytes)
            prev = p
        is_state = self.group_kinds[g] == STATE
        j = 0  # freed is in descending index order; walk checkpoints from the top
        ckpts_desc = ckpts[::-1]
        for i, b in freed:
            if b.key is None:
                continue
            end = (i + 1) * B
            if is_state:
                b.value = values.get(end, 0.0)
                continue
            # smallest checkpoint >= end
            while j < len(ckpts_desc) - 1 and ckpts_desc[j + 1] >= end:
                j += 1
            b.value = values[ckpts_desc[j]] if ckpts_desc and ckpts_desc[j] >= end else 0.0

    def _known_checkpoints(self, run: _Running) -> list[int]:
        """Ascending cached-state positions along this request's sequence."""
        if run.below_hit is None:
            get = self.pool.get_cached
            g0 = self.state_groups[0]
            B = self.block_size
            run.below_hit = [(i + 1) * B for i in range(run.hit // B)
                             if get((g0, run.hashes[i])) is not None]
            if run.hit and (not run.below_hit or run.below_hit[-1] != run.hit):
                run.below_hit.append(run.hit)
        return run.below_hit + run.admitted
