"""A block-level model of vLLM 0.32's prefix cache for hybrid models (align mode).

:class:`BlockPool` mirrors ``vllm/v1/core/block_pool.py`` where prefix hits are
concerned: one pool of blocks shared by every KV cache group; a block hash maps
to the cached blocks that hold it (duplicates allowed, the first inserted is
returned); blocks without a hash are reused first (vLLM prepends them to
``free_block_queue``); cached free blocks wait in the eviction policy's order.

:class:`HybridPrefixCache` runs one request at a time through the same steps as
vLLM's scheduler and KV cache manager, for a model with full-attention groups
and recurrent-state (Mamba / GDN) groups:

1. lookup (``HybridKVCacheCoordinator.find_longest_cache_hit``): the longest
   run of cached attention blocks, capped at ``prompt_len - 1`` tokens, then the
   longest prefix within it whose state is cached in every state group;
2. touch the hit blocks (``add_local_computed_blocks``);
3. prefill in chunks of at most ``chunk_size`` tokens. In ``split`` checkpoint
   mode (vLLM 0.32) each chunk is clipped by
   ``Scheduler._mamba_block_aligned_split`` (block-aligned chunk ends, a stop
   at the prompt's last reusable block boundary, the admission policy's
   stops); in ``inpass`` mode (see :data:`CHECKPOINT_MODES`) only the token
   budget and the prompt end end a chunk, and the states at those checkpoint
   positions are captured inside the chunk's forward pass;
4. per step: free retired state blocks (``MambaManager.remove_skipped_blocks``),
   allocate (``allocate_new_blocks``: one new state block per group per step,
   attention blocks for every new token), cache the now-full blocks
   (``cache_blocks``; a state block is cached only if the admission policy
   admits its position);
5. decode ``output_len - 1`` steps of one token;
6. free every block, group by group, each group's blocks in reverse
   (``SingleTypeKVCacheManager.free``).

The model assumes a Gated DeltaNet-like state group (no internal prefill
checkpoint blocks), no speculative decoding, and a hash block size equal to
the block size (vLLM's default for hybrid models). ``docs/simulator.md`` lists
these facts with their sources.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass

from vllm_admission.core.admission import (
    ADMIT,
    AdmissionPolicy,
    HitProbe,
    RequestAdmission,
    SegmentCosts,
)
from vllm_admission.core.eviction import EvictionPolicy
from vllm_admission.core.free_blocks import FreeBlocks
from vllm_admission.core.geometry import ATTENTION, STATE, blocks_needed, inpass_capture_limit

__all__ = ["ATTENTION", "CHECKPOINT_MODES", "STATE", "BlockPool", "HybridPrefixCache",
           "PoolExhausted", "RequestOutcome", "check_checkpoint_mode"]

NULL = 0  # vLLM's null block id: a placeholder in a state group's block table


def _is_output_key(block_hash: object) -> bool:
    """Whether a cached block's key names generated tokens: ``("out", rid, index)``
    (:meth:`HybridPrefixCache._cache_full`); a prompt block's key is its hash."""
    return type(block_hash) is tuple


#: How recurrent-state checkpoints are written during prefill:
#:
#: * ``"split"`` (default): vLLM 0.32. A state is written only where a forward
#:   pass ends, so a prefill chunk ends at every checkpoint position (the prompt
#:   checkpoint, the junction, the admission policy's stops) and every chunk end
#:   is block-aligned (``Scheduler._mamba_block_aligned_split``).
#: * ``"inpass"``: the model runner captures the state at the admitted
#:   block-aligned positions inside one forward pass (the plugin's
#:   ``VLLM_ADMISSION_CHECKPOINT=inpass``), so chunks end only at the token
#:   budget (floored to a block, as vLLM's align mode does) and at the prompt
#:   end. Every state ``split`` keeps is kept, in fewer prefill steps; ``last``
#:   keeps the same states too, since its chunk ends are the floored budget ends.
CHECKPOINT_MODES = ("split", "inpass")


def check_checkpoint_mode(mode: str) -> str:
    """Return ``mode`` if it is one of :data:`CHECKPOINT_MODES`.

    Raises:
        ValueError: an unknown mode; the message lists the valid ones.
    """
    if mode not in CHECKPOINT_MODES:
        raise ValueError(f"unknown checkpoint mode {mode!r}; valid: {', '.join(CHECKPOINT_MODES)}")
    return mode


class PoolExhausted(RuntimeError):
    """An allocation asked for more blocks than the pool can free."""


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
    switchable pool; :class:`HybridPrefixCache` adds it with ``track_values``),
    ``next_use`` only for a policy that needs the future (else both are ``None``).
    Block ids are the same ``int`` objects in every pool of the process.

    Args:
        num_blocks: blocks in the pool, as vLLM reports ``num_gpu_blocks``.
        eviction: orders the cached free blocks.
        num_groups: KV cache groups sharing the pool.
        switchable: the eviction policy can be replaced mid-run
            (:meth:`FreeBlocks.switch <vllm_admission.core.free_blocks.FreeBlocks.switch>`).

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
        self.key: list = [None] * num_blocks
        self.group: list[int] = [0] * num_blocks
        self.ref: list[int] = [0] * num_blocks
        self.value: list[float] | None = (
            [0.0] * num_blocks if eviction.needs_values or switchable else None)
        self.next_use: list[float] | None = (
            [math.inf] * num_blocks if eviction.needs_future else None)
        self.index: list[dict] = [{} for _ in range(num_groups)]
        self._dups: dict[tuple, list[int]] = {}
        self._num_dups: list[int] = [0] * num_groups  # entries waiting in _dups, per group
        #: Blocks whose hash was dropped to make room (cumulative).
        self.evictions = 0
        #: Cached entries inserted (cumulative), per KV cache group index.
        self.insertions_by_group: list[int] = [0] * num_groups

    @property
    def eviction(self) -> EvictionPolicy:
        """The policy that orders the cached free blocks."""
        return self.free_blocks.eviction

    def clone(self, eviction: EvictionPolicy) -> "BlockPool":
        """An independent copy of this pool that uses ``eviction`` (a clone of ours)."""
        other = BlockPool.__new__(BlockPool)
        other.num_blocks = self.num_blocks
        other.free_blocks = self.free_blocks.clone(eviction)
        other._switchable = self._switchable
        other.key = self.key[:]
        other.group = self.group[:]
        other.ref = self.ref[:]
        other.value = self.value[:] if self.value is not None else None
        other.next_use = self.next_use[:] if self.next_use is not None else None
        other.index = [d.copy() for d in self.index]
        other._dups = {k: v[:] for k, v in self._dups.items()}
        other._num_dups = self._num_dups[:]
        other.evictions = self.evictions
        other.insertions_by_group = self.insertions_by_group[:]
        return other

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

    def get_cached(self, key: tuple) -> int | None:
        """The first cached block for ``(group, block_hash)``, or None."""
        return self.index[key[0]].get(key[1])

    # -- mutations -------------------------------------------------------
    def allocate(self, n: int, now: float) -> list[int]:
        """Take ``n`` blocks: uncached ones first, then evict in policy order.

        Raises:
            PoolExhausted: fewer than ``n`` blocks are free.
        """
        free = self.free_blocks
        num_uncached, num_cached = len(free.uncached), free.num_cached
        if n > num_uncached + num_cached + len(free.tail):
            raise PoolExhausted(f"need {n} blocks, {len(free)} free of {self.num_blocks - 1}")
        out = free.take(n, now)
        if n > num_uncached:
            # After the uncached stack come the policy's victims (then the tail).
            self._evict(out[num_uncached:n if n - num_uncached < num_cached
                            else num_uncached + num_cached])
        ref = self.ref
        for b in out:
            ref[b] = 1
        return out

    def _evict(self, victims: Sequence[int]) -> None:
        """Drop the hashes of cached blocks the policy just gave up."""
        keys, groups, index, dups = self.key, self.group, self.index, self._dups
        if dups:
            for b in victims:
                key = (groups[b], keys[b])
                if key in dups:
                    self._drop_key(b, key)
                else:
                    del index[key[0]][key[1]]
        else:
            for b in victims:
                del index[groups[b]][keys[b]]
        for b in victims:
            keys[b] = None
        self.evictions += len(victims)
        free = self.free_blocks
        eviction = free.eviction
        if eviction.needs_values or self._switchable:
            values = self.value
            for b in victims:
                values[b] = 0.0
        if eviction.needs_future:
            next_use = self.next_use
            for b in victims:
                next_use[b] = math.inf

    @property
    def evictions_by_group(self) -> list[int]:
        """Evictions per KV cache group index (a hash leaves the pool only by
        eviction: the entries inserted less those still cached)."""
        return [inserted - len(idx) - dups for inserted, idx, dups
                in zip(self.insertions_by_group, self.index, self._num_dups)]

    def touch(self, blocks: Sequence[int], now: float) -> None:
        """A prefix hit takes references on cached blocks (``BlockPool.touch``);
        a policy that :attr:`~EvictionPolicy.needs_hits` hears each of them."""
        ref = self.ref
        free = self.free_blocks
        for b in blocks:
            if ref[b] == 0:
                free.remove_cached(b)
            ref[b] += 1
        eviction = free.eviction
        if eviction.needs_hits:
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
            eviction = free.eviction
            value, next_use = self.value, self.next_use
            free.add_cached(cached, now,
                            [value[b] for b in cached]
                            if eviction.needs_values or self._switchable else None,
                            [next_use[b] for b in cached] if eviction.needs_future else None)

    def cache(self, block: int, key: tuple, *, report: bool = True) -> None:
        """Give an in-use block its hash (``cache_full_blocks``).

        A policy that :attr:`~EvictionPolicy.needs_keys` hears
        :meth:`~EvictionPolicy.on_cache` unless ``report`` is False (a state a
        live engine caches only tentatively: see ``HybridPrefixCache._cache_full``).
        """
        g, h = key
        self.key[block] = h
        self.group[block] = g
        idx = self.index[g]
        if h in idx:
            self._dups.setdefault(key, []).append(block)
            self._num_dups[g] += 1
        else:
            idx[h] = block
        self.insertions_by_group[g] += 1
        if report:
            eviction = self.free_blocks.eviction
            if eviction.needs_keys:
                eviction.on_cache(block, key)

    def cache_position(self, blocks: Sequence[tuple[int, int]], block_hash, *,
                       report: bool = True) -> None:
        """:meth:`cache` of each ``(group, block)`` of ``blocks`` under
        ``(group, block_hash)``, in order (one state position, every state group)."""
        keys, groups, index, inserted = self.key, self.group, self.index, self.insertions_by_group
        eviction = self.free_blocks.eviction
        report = report and eviction.needs_keys
        for g, b in blocks:
            keys[b] = block_hash
            groups[b] = g
            idx = index[g]
            if block_hash in idx:
                self._dups.setdefault((g, block_hash), []).append(b)
                self._num_dups[g] += 1
            else:
                idx[block_hash] = b
            inserted[g] += 1
            if report:
                eviction.on_cache(b, (g, block_hash))

    def cache_many(self, group: int, blocks: Sequence[int], hashes: Sequence) -> None:
        """:meth:`cache` of ``blocks[i]`` under ``(group, hashes[i])``, in order.

        Hashes new to the group and distinct (the usual case) go into the index
        in one bulk insert; otherwise block by block.
        """
        idx = self.index[group]
        if self.free_blocks.eviction.needs_keys:
            cache = self.cache
            for b, h in zip(blocks, hashes):
                cache(b, (group, h))
            return
        new = dict(zip(hashes, blocks))
        if len(new) != len(blocks) or not idx.keys().isdisjoint(new):
            for b, h in zip(blocks, hashes):
                self.cache(b, (group, h))
            return
        idx.update(new)
        keys, groups = self.key, self.group
        for b, h in zip(blocks, hashes):
            keys[b] = h
            groups[b] = group
        self.insertions_by_group[group] += len(new)

    def _drop_key(self, block: int, key: tuple) -> None:
        g, h = key
        idx = self.index[g]
        if idx.get(h) == block:
            dups = self._dups.get(key)
            if dups:
                idx[h] = dups.pop(0)
                self._num_dups[g] -= 1
                if not dups:
                    del self._dups[key]
            else:
                del idx[h]
        else:
            dups = self._dups[key]
            dups.remove(block)
            self._num_dups[g] -= 1
            if not dups:
                del self._dups[key]


@functools.lru_cache(maxsize=8)
def _block_ids(num_blocks: int) -> tuple[int, ...]:
    """``1 .. num_blocks - 1``, built once per size: the pools of one process
    (the shadow caches of ``auto``) share the ``int`` objects."""
    return tuple(range(1, num_blocks))


@functools.lru_cache(maxsize=1 << 16)
def _decode_events(first: int, last: int, block_size: int) -> tuple[int, ...]:
    """The decode steps that change the cache: computing token ``first`` (the
    first output token), then the tokens next to each block boundary up to
    ``last`` (memoised: requests of equal lengths share them, as do shadow caches)."""
    if first > last:
        return ()
    B = block_size
    events = [first]
    m = first // B + 1
    while m * B - 1 <= last:
        for t in (m * B - 1, m * B, m * B + 1):
            if first < t <= last:
                events.append(t)
        m += 1
    return tuple(events)


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """What one request got from the cache. Lengths in tokens.

    ``hit_tokens`` is what vLLM reports as ``num_cached_tokens``.
    ``prefill_steps`` is the number of prefill chunks the request's prompt
    took (engine steps with prompt tokens scheduled when it runs alone): the
    chunks of ``[hit_tokens, prompt_tokens)`` after the token budget and, in
    ``split`` checkpoint mode, every chunk stop (block alignment, the prompt
    checkpoint, the junction, the admission policy's stops); in ``inpass``
    mode the budget alone.
    """

    prompt_tokens: int
    hit_tokens: int
    kv_hit_tokens: int
    junction: int
    checkpoints: int
    evictions: int
    prefill_steps: int = 0

    @property
    def state_miss_tokens(self) -> int:
        """Attention-KV hit tokens recomputed because no state was kept at
        their end (:attr:`HitProbe.state_miss
        <vllm_admission.core.admission.HitProbe.state_miss>`)."""
        return self.kv_hit_tokens - self.hit_tokens


@dataclass(slots=True)
class _Running:
    """Per-request bookkeeping while a request runs (the managers' dicts).

    Every group caches its full blocks at the same steps, and every state group
    holds its blocks at the same indexes, so both are kept once for all groups.
    """

    rid: int
    hashes: Sequence[int]
    prompt_len: int
    #: The request's admission decisions, stops, checkpoints and block values.
    adm: RequestAdmission
    #: Each group's block table (a state group's holds NULL where it has no block).
    blocks: list[list[int]]
    #: Leading blocks of every group already cached (``num_cached_block``).
    num_cached: int
    #: Ascending indexes where the state groups hold a block (not NULL).
    live: list[int]
    #: ``inpass`` mode: indexes ``i`` whose state block was written with the
    #: state at ``(i + 1) * B`` (a capture or a block-aligned step end); only
    #: those may be cached. ``None`` in ``split`` mode, where every step end is
    #: block-aligned (or followed by a stop at the next boundary).
    written: set[int] | None = None


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
        switchable: allow :meth:`switch` (the adaptive controller).
        track_values: compute block values whatever the eviction policy, so
            that a policy that ``needs_values`` can be switched to later.
        checkpoint: how prefill writes states, one of :data:`CHECKPOINT_MODES`
            (``"split"``: vLLM 0.32; ``"inpass"``: captured inside the pass).
        prompt_end_export: ``split`` mode with vLLM's one-checkpoint export
            (a ``MambaSpec`` with ``num_prefill_checkpoint_blocks=1``: vLLM
            0.33's Qwen GDN layers on FlashInfer, Mamba2 layers): when the
            prompt's last chunk can start at least one block below the prompt
            checkpoint and reach the prompt end in one step, no chunk ends at
            the checkpoint; that step allocates a state block at the
            checkpoint's index besides the running one and the kernel writes the
            checkpoint state into it (``v1/core/sched/scheduler.py``
            ``_mamba_block_aligned_split``, ``v1/core/single_type_kv_cache_manager.py``
            ``MambaManager._needs_internal_checkpoint``). Which states are kept
            does not change; when blocks are allocated does.

    Raises:
        ValueError: bad geometry, a missing callback for the chosen eviction,
            or an unknown checkpoint mode.
    """

    def __init__(self, *, num_blocks: int, block_size: int, group_kinds: Sequence[str],
                 admission: AdmissionPolicy, eviction: EvictionPolicy, chunk_size: int,
                 segment_flops: Callable[[int, int], float] | None = None,
                 bytes_per_block: int = 1,
                 next_use: Callable[[int, float], float] | None = None,
                 switchable: bool = False, track_values: bool = False,
                 checkpoint: str = "split", prompt_end_export: bool = False) -> None:
        check_checkpoint_mode(checkpoint)
        if prompt_end_export and checkpoint != "split":
            raise ValueError(f"prompt_end_export needs checkpoint='split', got {checkpoint!r}")
        if block_size < 1 or chunk_size < 1:
            raise ValueError(f"block_size and chunk_size must be >= 1, got {block_size}, {chunk_size}")
        kinds = tuple(group_kinds)
        if ATTENTION not in kinds or STATE not in kinds or set(kinds) - {ATTENTION, STATE}:
            raise ValueError(f"group_kinds must mix 'attention' and 'state' groups, got {kinds}")
        if (eviction.needs_values or track_values) and segment_flops is None:
            raise ValueError(f"eviction {eviction.name!r} needs segment_flops")
        if eviction.needs_future and next_use is None:
            raise ValueError(f"eviction {eviction.name!r} needs next_use")
        self.block_size = block_size
        self.chunk_size = chunk_size
        #: The checkpoint mode (:data:`CHECKPOINT_MODES`).
        self.checkpoint = checkpoint
        self._inpass = checkpoint == "inpass"
        #: vLLM exports the prompt-end state from inside the last chunk (``split`` mode).
        self.prompt_end_export = prompt_end_export
        self.group_kinds = kinds
        self.attn_groups = tuple(g for g, k in enumerate(kinds) if k == ATTENTION)
        self.state_groups = tuple(g for g, k in enumerate(kinds) if k == STATE)
        self._num_attn, self._num_state = len(self.attn_groups), len(self.state_groups)
        self.admission = admission
        self.eviction = eviction
        self.pool = BlockPool(num_blocks, eviction, len(kinds), switchable=switchable)
        self.segment_flops = segment_flops
        self.bytes_per_block = bytes_per_block
        self.next_use = next_use
        if eviction.needs_future:
            keys = self.pool.key
            eviction.bind_future(lambda b, now: next_use(keys[b], now))
        self._needs_values = eviction.needs_values or track_values
        if self._needs_values and self.pool.value is None:
            self.pool.value = [0.0] * num_blocks
        self._needs_meta = self._needs_values or eviction.needs_future
        self._segment_costs = SegmentCosts(
            block_size=block_size, num_attention_groups=len(self.attn_groups),
            num_state_groups=len(self.state_groups), bytes_per_block=bytes_per_block,
            segment_flops=segment_flops)
        #: State checkpoints admitted (cumulative, counted once per position).
        self.checkpoints = 0
        #: Requests whose KV hit ran past their state hit (shared prefixes seen).
        self.junctions = 0

    def clone(self, *, alpha: float | None = None) -> "HybridPrefixCache":
        """An independent copy between requests (for what-if replays).

        Args:
            alpha: set the copy's ``flop`` eviction weight.
        """
        other = HybridPrefixCache.__new__(HybridPrefixCache)
        other.__dict__.update(self.__dict__)
        other.eviction = self.eviction.clone()
        if alpha is not None:
            other.eviction.alpha = alpha
        other.pool = self.pool.clone(other.eviction)
        if other.eviction.needs_future:
            keys = other.pool.key
            next_use = self.next_use
            other.eviction.bind_future(lambda b, now: next_use(keys[b], now))
        return other

    def switch(self, *, admission: AdmissionPolicy | None = None,
               eviction: EvictionPolicy | None = None,
               held: Sequence[Container] | None = None) -> None:
        """Use another admission and/or eviction policy from the next request on.

        An admission policy decides per request, so it simply takes over. A new
        eviction policy (a fresh object) receives the current free cached
        blocks with the times and values they were freed with
        (:meth:`FreeBlocks.switch <vllm_admission.core.free_blocks.FreeBlocks.switch>`);
        no block changes hands, so nothing can leak.

        Args:
            admission, eviction: the new policies (``None``: keep the current one).
            held: per KV cache group, the prompt block hashes a cache that had
                run the new pair all along holds (:meth:`held_keys` of
                ``auto``'s shadow); free cached blocks whose hash is not among
                them, and blocks of generated tokens, go to the new eviction
                policy first (``FreeBlocks.switch``'s ``demote``). Needs ``eviction``.

        Raises:
            RuntimeError: the cache was not built ``switchable``.
            ValueError: ``eviction`` needs future knowledge, or values the cache
                does not compute (build it with ``track_values``); ``held``
                without ``eviction``.
        """
        if not self.pool.free_blocks.switchable:
            raise RuntimeError("this cache was not built switchable")
        if held is not None and eviction is None:
            raise ValueError("held keys need a new eviction policy to hand the candidates to")
        if admission is not None:
            self.admission = admission
        if eviction is not None:
            if eviction.needs_future:
                raise ValueError(f"cannot switch to {eviction.name!r}: it needs future knowledge")
            if eviction.needs_values and not self._needs_values:
                raise ValueError(f"cannot switch to {eviction.name!r}: this cache does not "
                                 f"compute block values (build it with track_values)")
            demote = None
            if held is not None:
                keys, groups = self.pool.key, self.pool.group

                def demote(b: int) -> bool:
                    return keys[b] not in held[groups[b]]
            self.pool.free_blocks.switch(eviction, demote)
            self.eviction = eviction

    def held_keys(self) -> tuple[frozenset, ...]:
        """Per KV cache group, the hashes of the prompt blocks this cache holds
        (free or in use; blocks of generated tokens, keyed by request, left
        out): what :meth:`switch` keeps in place when switching to this cache's pair."""
        return tuple(frozenset(h for h in idx if not _is_output_key(h)) for idx in self.pool.index)

    # -- sizing ----------------------------------------------------------
    def blocks_needed(self, prompt_len: int, output_len: int) -> int:
        """Most blocks a request holds at once (:func:`~vllm_admission.core.geometry.blocks_needed`).

        The same in both checkpoint modes: in ``inpass`` mode the states captured
        inside a step hold blocks of their own, but never more than
        :meth:`inpass_capture_limit` allows, which is what the pool has left.
        """
        return blocks_needed(prompt_len, output_len, block_size=self.block_size,
                             num_attention_groups=len(self.attn_groups),
                             num_state_groups=len(self.state_groups))

    def inpass_capture_limit(self, prompt_len: int, output_len: int) -> int:
        """``inpass`` mode: most states one prefill step of this request captures
        inside the pass (:func:`~vllm_admission.core.geometry.inpass_capture_limit`:
        what the pool holds beyond the request's own need). A chunk with more
        admitted positions ends at the first one past the limit, as in ``split``
        mode."""
        return inpass_capture_limit(prompt_len, output_len, num_blocks=self.pool.num_blocks,
                                    block_size=self.block_size,
                                    num_attention_groups=len(self.attn_groups),
                                    num_state_groups=len(self.state_groups))

    def fits(self, prompt_len: int, output_len: int) -> bool:
        """Whether the request can ever run alone in this pool."""
        return self.blocks_needed(prompt_len, output_len) <= self.pool.num_blocks - 1

    # -- lookup ----------------------------------------------------------
    def lookup(self, hashes: Sequence[int], prompt_len: int) -> HitProbe:
        """Attention-KV hit and hybrid hit of a prompt, without touching anything."""
        index = self.pool.index
        attn = [index[g] for g in self.attn_groups]
        state = [index[g] for g in self.state_groups]
        max_blocks = min((prompt_len - 1) // self.block_size, len(hashes))
        k = 0
        if len(attn) == 1:
            a0 = attn[0]
            while k < max_blocks and hashes[k] in a0:
                k += 1
        else:
            while k < max_blocks and all(hashes[k] in d for d in attn):
                k += 1
        hit = 0
        for i in range(k - 1, -1, -1):
            h = hashes[i]
            if all(h in d for d in state):
                hit = i + 1
                break
        return HitProbe(prompt_len, self.block_size, k * self.block_size, hit * self.block_size)

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
        if probe.junction:
            self.junctions += 1
        total = prompt_len + output_len
        adm = RequestAdmission(self.admission, probe, total_len=total)
        ngroups = len(self.group_kinds)
        run = _Running(rid=rid, hashes=hashes, prompt_len=prompt_len, adm=adm,
                       blocks=[[] for _ in range(ngroups)], num_cached=hit_blocks, live=[])
        if hit_blocks:
            self._touch_hit(run, hit_blocks, now)

        # Checkpoint positions (ascending): the policy's stops, then the prompt
        # checkpoint (every stop is a block boundary below the prompt end).
        ends = adm.stops
        if not ends or ends[-1] != adm.prompt_end:
            ends = (*ends, adm.prompt_end)
        inpass = self._inpass
        if inpass:
            # Captured inside the pass where admitted; no chunk ends there.
            captures = [p for p in ends if adm.decide(p) == ADMIT]
            ends = ()
            run.written = set()
        split = self._split
        step = self._step_inpass if inpass else self._step
        chunk_size = self.chunk_size
        computed = probe.state_hit
        steps = 0
        if not inpass and self.admission.every_block and B <= chunk_size:
            # split mode: every chunk up to the prompt checkpoint is one whole block.
            first, last = computed // B, adm.prompt_end // B
            if last > first:
                self._prefill_blockwise(run, first, last, now)
                computed, steps = last * B, last - first
        limit = self.inpass_capture_limit(prompt_len, output_len) if inpass else 0
        pe = adm.prompt_end
        # A policy stop at the prompt checkpoint (a junction there) still ends a chunk.
        export = self.prompt_end_export and 0 < pe < prompt_len and pe not in adm.stops
        if export:
            ends_export = tuple(p for p in ends if p != pe)
        while computed < prompt_len:
            n = split(run, computed, min(prompt_len - computed, chunk_size), ends)
            if export and computed % B == 0 and computed + B <= pe and computed + n == pe:
                # vLLM's export: the last chunk runs on to the prompt end if the
                # budget allows, and the pass writes the checkpoint's state.
                m = split(run, computed, min(prompt_len - computed, chunk_size), ends_export)
                if computed + m == prompt_len:
                    self._step_inpass(run, computed, m, prompt_len, now, (pe,))
                    computed += m
                    steps += 1
                    continue
            if inpass:
                inner = [p for p in captures if computed < p < computed + n]
                if len(inner) > limit:  # the pool cannot hold them all: end the chunk there
                    n = inner[limit] - computed
                    inner = inner[:limit]
                step(run, computed, n, prompt_len, now, inner)
            else:
                step(run, computed, n, prompt_len, now)
            computed += n
            steps += 1
        # Decode: the step computing token t has t + 1 tokens in the request; only
        # steps next to a block boundary change the cache, so only those run.
        for t in _decode_events(prompt_len, total - 2, B):
            step(run, t, 1, t + 1, now)
        self._finish(run, now)
        return RequestOutcome(prompt_tokens=prompt_len, hit_tokens=probe.state_hit,
                              kv_hit_tokens=probe.kv_hit, junction=probe.junction,
                              checkpoints=len(adm.admitted),
                              evictions=self.pool.evictions - evictions_before,
                              prefill_steps=steps)

    def _touch_hit(self, run: _Running, hit_blocks: int, now: float) -> None:
        index = self.pool.index
        h = run.hashes
        for g, kind in enumerate(self.group_kinds):
            d = index[g]
            if kind == ATTENTION:
                blocks = [d[h[i]] for i in range(hit_blocks)]
                self.pool.touch(blocks, now)
                run.blocks[g] = blocks
            else:
                b = d[h[hit_blocks - 1]]
                self.pool.touch((b,), now)
                run.blocks[g] = [NULL] * (hit_blocks - 1) + [b]
        run.live.append(hit_blocks - 1)

    def _split(self, run: _Running, start: int, n: int, ends: Sequence[int]) -> int:
        """Tokens of the prefill chunk that starts at ``start``, at most ``n``.

        ``ends``: ascending positions where a chunk must end (``split`` mode:
        the checkpoint positions; ``inpass`` mode: none). In ``split`` mode
        this is ``Scheduler._mamba_block_aligned_split`` for a fresh request
        (no EAGLE): chunk ends are also block-aligned before the prompt end,
        and a chunk starting mid-block stops at the next boundary. In
        ``inpass`` mode the same block alignment applies (the plugin's engine
        mode keeps vLLM's flooring), without the stops.
        """
        B, P = self.block_size, run.prompt_len
        stop = start + n
        if stop < P:
            aligned = stop // B * B
            if aligned > start or B <= self.chunk_size:
                stop = aligned
        if start % B:
            nb = (start // B + 1) * B
            if start < nb < stop:
                stop = nb
        k = bisect.bisect_right(ends, start)
        if k < len(ends) and ends[k] < stop:
            stop = ends[k]
        return max(stop - start, 0)

    def _step(self, run: _Running, start: int, n: int, num_tokens: int, now: float) -> None:
        """One scheduler step computing tokens ``[start, start + n)`` while the
        request has ``num_tokens`` tokens in ``split`` mode (step 4 of the module
        docstring; :meth:`_step_inpass` is the ``inpass`` mode's).

        Three parts, written out in one method (it runs for every step of every
        request): ``MambaManager.remove_skipped_blocks`` (a state group keeps only
        the block that holds the state of the last computed token: its blocks
        before that are freed, the latest first); ``allocate_new_blocks`` (every
        attention group grows to the blocks the tokens need, every state group
        gets one new block at the last index, if it has none there yet: one pool
        call for all groups, since which group gets which popped block changes
        neither hits nor the eviction order); ``cache_blocks`` of the now-full
        blocks. Attention groups all hold the same number of blocks, and state
        groups hold theirs at the same indexes (:class:`_Running`).
        """
        B = self.block_size
        tables = run.blocks
        live = run.live
        state_groups = self.state_groups
        if start > 0 and live and live[0] < (start - 1) // B:
            k = bisect.bisect_left(live, (start - 1) // B)
            retired = live[k - 1::-1]
            del live[:k]
            if self._needs_meta:
                lists = [self._freed(run, g, retired) for g in state_groups]
            elif k == 1:
                i = retired[0]
                lists = [[tables[g][i]] for g in state_groups]
            else:
                lists = [[tables[g][i] for i in retired] for g in state_groups]
            self.pool.free_each(lists, now)
            for g in state_groups:
                table = tables[g]
                for i in retired:
                    table[i] = NULL
        need = -(-(start + n) // B)
        attn_groups = self.attn_groups
        grow = need - len(tables[attn_groups[0]])
        if grow < 0:
            grow = 0
        state_len = len(tables[state_groups[0]])
        grow_state = need > state_len
        total = grow * self._num_attn + (self._num_state if grow_state else 0)
        if total:
            new = self.pool.allocate(total, now)
            k = 0
            if grow:
                for g in attn_groups:
                    tables[g] += new[k:k + grow]
                    k += grow
            if grow_state:
                pad = need - 1 - state_len
                for g in state_groups:
                    table = tables[g]
                    if pad > 0:
                        table += [NULL] * pad
                    table.append(new[k])
                    k += 1
                live.append(need - 1)
        full = (start + n if start + n < num_tokens else num_tokens) // B
        if full > run.num_cached:
            self._cache_full(run, full)

    def _prefill_blockwise(self, run: _Running, first: int, last: int, now: float) -> None:
        """The prefill steps of a policy that stops at every block boundary
        (``dense``) before the prompt checkpoint: step ``i`` computes block ``i``
        alone, for ``first <= i < last``. :meth:`_step` and :meth:`_cache_full`
        written out for that case (the pool is called the same way, in the same
        order): retire the state before block ``i - 1``, allocate block ``i`` in
        every group, cache the attention blocks and, where admitted, the state."""
        B = self.block_size
        pool = self.pool
        tables, live, hashes, adm = run.blocks, run.live, run.hashes, run.adm
        attn_groups, state_groups = self.attn_groups, self.state_groups
        total = self._num_attn + self._num_state
        keyed = pool.free_blocks.eviction.needs_keys
        needs_meta = self._needs_meta
        for i in range(first, last):
            if live and live[0] < i - 1:
                k = bisect.bisect_left(live, i - 1)
                retired = live[k - 1::-1]
                del live[:k]
                if needs_meta:
                    lists = [self._freed(run, g, retired) for g in state_groups]
                else:
                    lists = [[tables[g][j] for j in retired] for g in state_groups]
                pool.free_each(lists, now)
                for g in state_groups:
                    table = tables[g]
                    for j in retired:
                        table[j] = NULL
            new = pool.allocate(total, now)
            k = 0
            for g in attn_groups:
                tables[g].append(new[k])
                k += 1
            for g in state_groups:
                tables[g].append(new[k])
                k += 1
            live.append(i)
            run.num_cached = i + 1
            h = hashes[i]
            for g in attn_groups:
                pool.cache(tables[g][i], (g, h))
            pos = (i + 1) * B
            if adm.decide(pos) != ADMIT:
                continue
            adm.record(pos)
            self.checkpoints += 1
            report = not (keyed and adm.kept_as_sequence_end(pos))
            pool.cache_position([(g, tables[g][i]) for g in state_groups], h, report=report)

    def _step_inpass(self, run: _Running, start: int, n: int, num_tokens: int, now: float,
                     captures: Sequence[int] = ()) -> None:
        """One scheduler step computing tokens ``[start, start + n)`` while the
        request has ``num_tokens`` tokens in ``inpass`` mode (:meth:`_step` is
        the ``split`` mode's, written out in one method).

        ``captures``: ascending block-aligned positions inside
        ``(start, start + n)`` whose states the pass copies into state blocks
        of their own."""
        B = self.block_size
        if start > 0:
            self._retire_states(run, (start - 1) // B, now)
        end = start + n
        self._allocate(run, -(-end // B), now, [p // B - 1 for p in captures])
        written = run.written
        if written is not None:
            written.update(p // B - 1 for p in captures)
            if end % B == 0:
                written.add(end // B - 1)
        full = min(start + n, num_tokens) // B
        if full > run.num_cached:
            self._cache_full(run, full)

    def _retire_states(self, run: _Running, skipped: int, now: float) -> None:
        """``MambaManager.remove_skipped_blocks``: a state group keeps only the block
        that holds the state of the last computed token; its blocks before index
        ``skipped`` are freed, the latest first."""
        live = run.live
        if not live or live[0] >= skipped:
            return
        k = bisect.bisect_left(live, skipped)
        retired = live[k - 1::-1]
        del live[:k]
        self.pool.free_each([self._freed(run, g, retired) for g in self.state_groups], now)
        for g in self.state_groups:
            blocks = run.blocks[g]
            for i in retired:
                blocks[i] = NULL

    def _allocate(self, run: _Running, need: int, now: float,
                  extra: Sequence[int] = ()) -> None:
        """``allocate_new_blocks``: every attention group grows to ``need`` blocks,
        every state group gets one new block at index ``need - 1`` (if it has
        none there yet) and, in ``inpass`` mode, one at each ascending index in
        ``extra`` it has none at (the in-pass captures). One pool call for all
        groups: which group gets which popped block changes neither hits nor the
        eviction order."""
        blocks_by_group = run.blocks
        total = 0
        for g in self.attn_groups:
            have = len(blocks_by_group[g])
            if need > have:
                total += need - have
        have_state = len(blocks_by_group[self.state_groups[0]])
        if extra:
            grow = [i for i in extra if i >= have_state]
            if need - 1 >= have_state and (not grow or grow[-1] != need - 1):
                grow.append(need - 1)
        else:
            grow = [need - 1] if need > have_state else []
        total += len(grow) * len(self.state_groups)
        if not total:
            return
        new = self.pool.allocate(total, now)
        k = 0
        for g in self.attn_groups:
            blocks = blocks_by_group[g]
            have = len(blocks)
            if need > have:
                blocks.extend(new[k:k + need - have])
                k += need - have
        for g in self.state_groups:
            blocks = blocks_by_group[g]
            for i in grow:
                if i > len(blocks):
                    blocks.extend([NULL] * (i - len(blocks)))
                blocks.append(new[k])
                k += 1
        run.live.extend(grow)

    def _cache_full(self, run: _Running, full: int) -> None:
        """``cache_blocks`` up to the first ``full`` blocks: every new attention
        block, and a state block where the admission policy admits its position.

        Blocks holding generated tokens get keys of their own (``("out", rid,
        i)``): output is new content. A policy that ``needs_keys`` is not told
        the key of a state kept only as the sequence end
        (:meth:`RequestAdmission.kept_as_sequence_end`): the engine caches such
        a state tentatively, before it knows the request ends there, and
        reports only keys the simulator reports at the same moment.
        """
        nc, run.num_cached = run.num_cached, full
        hashes, pool = run.hashes, self.pool
        nh = len(hashes)
        prompt_end = full if full < nh else nh  # blocks past the hashes are output blocks
        for g in self.attn_groups:
            blocks = run.blocks[g]
            if nc < prompt_end:
                pool.cache_many(g, blocks[nc:prompt_end], hashes[nc:prompt_end])
            for i in range(max(nc, nh), full):
                pool.cache(blocks[i], (g, ("out", run.rid, i)))
        adm, B = run.adm, self.block_size
        keyed = pool.eviction.needs_keys
        written = run.written
        for i in run.live:
            if not nc <= i < full:
                continue
            if written is not None and i not in written:
                continue  # inpass: this block holds a mid-block state, not (i + 1) * B
            pos = (i + 1) * B
            # The length is known here, so a decision is never tentative.
            if adm.decide(pos) != ADMIT:
                continue
            adm.record(pos)
            self.checkpoints += 1
            h = hashes[i] if i < nh else ("out", run.rid, i)
            report = not (keyed and adm.kept_as_sequence_end(pos))
            pool.cache_position([(g, run.blocks[g][i]) for g in self.state_groups], h,
                                report=report)

    def _finish(self, run: _Running, now: float) -> None:
        """Free every block: group after group in vLLM's order, each group's
        latest first (``SingleTypeKVCacheManager.free``)."""
        held = run.live[::-1]
        lists = []
        for g, kind in enumerate(self.group_kinds):
            indexes = range(len(run.blocks[g]) - 1, -1, -1) if kind == ATTENTION else held
            lists.append(self._freed(run, g, indexes))
        self.pool.free_each(lists, now)
        run.blocks = [[] for _ in run.blocks]
        run.live = []

    def _freed(self, run: _Running, g: int, indexes: Sequence[int]) -> list[int]:
        """Group ``g``'s blocks at ``indexes``, in that order, with their eviction
        metadata attached: the list to free."""
        table = run.blocks[g]
        freed = [table[i] for i in indexes]
        if self._needs_meta:
            self._set_values(run, indexes, freed, g)
        return freed

    # -- eviction metadata ----------------------------------------------
    def _set_values(self, run: _Running, indexes: Sequence[int], blocks: Sequence[int],
                    g: int) -> None:
        """Attach FLOP efficiency / next use to group ``g``'s ``blocks`` (at
        ``indexes``) about to be freed."""
        if self._needs_values:
            self._set_flop_values(run, indexes, blocks, g)
        if self.eviction.needs_future:
            keys, next_use = self.pool.key, self.pool.next_use
            for b in blocks:
                block_hash = keys[b]
                if block_hash is not None:
                    next_use[b] = self.next_use(block_hash, run.rid)

    def _set_flop_values(self, run: _Running, indexes: Sequence[int], blocks: Sequence[int],
                         g: int) -> None:
        """Attach each freed block's segment FLOP efficiency (``RequestAdmission.segment_table``)."""
        B = self.block_size
        index, hashes = self.pool.index[self.state_groups[0]], run.hashes

        def is_cached_state(i: int) -> bool:
            return hashes[i] in index

        ckpts, values = run.adm.segment_table(self._segment_costs, is_cached_state)
        keys, out = self.pool.key, self.pool.value
        # block_value, written out for the two kinds of group.
        if self.group_kinds[g] == STATE:
            get = values.get
            for i, b in zip(indexes, blocks):
                if keys[b] is not None:
                    out[b] = get((i + 1) * B, 0.0)
        else:
            bisect_left, num = bisect.bisect_left, len(ckpts)
            for i, b in zip(indexes, blocks):
                if keys[b] is not None:
                    k = bisect_left(ckpts, (i + 1) * B)
                    out[b] = values[ckpts[k]] if k < num else 0.0
