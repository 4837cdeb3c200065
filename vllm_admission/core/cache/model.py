"""The cache model: vLLM 0.32's hybrid prefix cache run one request at a time.

:class:`HybridPrefixCache` composes the parts of this package the way vLLM's
``KVCacheManager`` composes a coordinator, one manager per KV cache group and the
block pool: a :class:`~vllm_admission.core.cache.block_pool.BlockPool`, one
group part per kind (:data:`~vllm_admission.core.cache.groups.GROUP_PARTS`), a
checkpoint-mode strategy (:data:`~vllm_admission.core.cache.checkpoint.CHECKPOINT_STRATEGIES`)
and, for eviction policies that read them, the freed blocks' values
(:class:`~vllm_admission.core.cache.values.FreedBlockMeta`). The steps of
:meth:`HybridPrefixCache.serve` are listed in the package docstring
(:mod:`vllm_admission.core.cache`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Container, Hashable, Sequence
from dataclasses import dataclass

from vllm_admission.core.admission import (
    AdmissionPolicy,
    HitProbe,
    RequestAdmission,
    SegmentCosts,
    get_admission,
)
from vllm_admission.core.cache.block_pool import NULL, BlockPool
from vllm_admission.core.cache.checkpoint import (
    CHECKPOINT_STRATEGIES,
    check_checkpoint_mode,
)
from vllm_admission.core.cache.groups import GROUP_PARTS, RunningRequest, StateGroups
from vllm_admission.core.cache.host import HostRequest, HostTier, check_host_tier
from vllm_admission.core.cache.values import FreedBlockMeta
from vllm_admission.core.errors import UserError
from vllm_admission.core.eviction import EvictionPolicy
from vllm_admission.core.geometry import blocks_needed, inpass_capture_limit
from vllm_admission.core.layout import ATTENTION, STATE, CacheLayout

__all__ = ["HybridPrefixCache", "RequestOutcome"]

#: The keys a hit ending inside a block found its last attention block and its state
#: under: ``(attention key, state key)`` (``None``: that block's hash).
_LastKeys = tuple[Hashable | None, Hashable | None]


def _is_output_key(block_hash: object) -> bool:
    """Whether a cached block's key names generated tokens: ``("out", rid, index)``
    (:meth:`AttentionGroups.cache_full <vllm_admission.core.cache.groups.AttentionGroups.cache_full>`);
    a prompt block's key is its hash."""
    return type(block_hash) is tuple


@functools.lru_cache(maxsize=1 << 16)
def _decode_events(first: int, last: int, block_size: int, spec: int = 0,
                   lookahead: int = 0, late: bool = False) -> tuple[int, ...]:
    """The decode steps that change the cache: computing token ``first`` (the
    first output token), then the tokens next to each block boundary up to
    ``last``. With ``spec`` draft tokens the step computing token ``t`` also
    verifies ``spec`` drafts, and holds ``lookahead`` more slots in the attention
    groups (EAGLE/MTP: ``spec``), so the state groups reach past a boundary
    ``spec`` tokens early and the attention groups ``spec + lookahead`` early.
    ``late``: state blocks retire a step after the boundary (async scheduling).
    Memoised: requests of equal lengths share them, as do shadow caches."""
    if first > last:
        return ()
    B = block_size
    events = {first}
    m = first // B + 1
    while m * B - max(spec + lookahead, 1) <= last:
        for t in (m * B - spec - lookahead, m * B - spec, m * B - 1, m * B, m * B + 1,
                  m * B + 1 + late):
            if first < t <= last:
                events.add(t)
        m += 1
    return tuple(sorted(events))

@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """What one request got from the cache. Lengths in tokens.

    ``hit_tokens`` is what vLLM reports as ``num_cached_tokens``: the engine's own
    hit plus ``host_hit_tokens``, the part loaded from a host tier.
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
    host_hit_tokens: int = 0

    @property
    def state_miss_tokens(self) -> int:
        """Attention-KV hit tokens recomputed because no state was kept at
        their end (:attr:`HitProbe.state_miss
        <vllm_admission.core.admission.HitProbe.state_miss>`)."""
        return self.kv_hit_tokens - self.hit_tokens


class HybridPrefixCache:
    """vLLM 0.32's hybrid prefix cache in align mode, one request at a time.

    The steps of :meth:`serve` are listed in :mod:`vllm_admission.core.cache`. What the
    layout turns on, as vLLM runs it (sources in docs/engine-facts.md):

    * ``pool.hash_block_size`` below ``block_size`` (``split`` mode only): a hit may end
      on a hash block boundary inside a block; the prompt's unit end ends a chunk
      and is keyed where the admission policy keeps its state
      (``_cache_partial_tail_block``); a hit inside a block takes a private copy of it
      (``_apply_cow``). :meth:`serve` then needs the prompt's keys per hash block.
    * ``speculation`` (``split`` mode, no ``prompt_end_export``): K more state blocks per
      request, never cached (``num_speculative_blocks``); under EAGLE/MTP also the last
      matched block dropped at a lookup, prompt checkpoints a block lower and K
      lookahead slots (``drop_eagle_block``, ``num_lookahead_tokens``). Decode accepts
      one token per step.
    * ``scheduling.prompt_end_export``: the prompt-end state written from inside the last
      chunk (``MambaManager._needs_internal_checkpoint``), no chunk ending there.
    * ``scheduling.async_scheduling``: a retired state block returns to the pool a step
      late (``allocate_slots`` frees on ``num_computed - num_in_flight``).
    * ``host``: a host tier (:class:`~vllm_admission.core.cache.host.HostTier`); with
      ``host.admission``, the states that policy keeps and ``admission`` does not go to
      the host tier only (:data:`~vllm_admission.core.admission.HOST`).

    Args:
        layout: the pool and its settings (:class:`~vllm_admission.core.layout.CacheLayout`);
            the groups must mix ``"attention"`` and ``"state"`` (``"hidden"`` groups are
            served with the attention ones, counted apart).
        admission: which states are checkpointed.
        eviction: which cached free blocks are evicted first.
        segment_flops: ``f(end, start) -> FLOPs`` of computing ``[start, end)`` with
            ``start`` cached; needed by eviction policies that read values (``flop``).
        next_use: ``f(block_hash, now) -> time`` of the next request needing the hash;
            needed by ``belady``.
        switchable: allow :meth:`switch` (the adaptive controller).
        track_values: compute block values whatever the eviction policy, so that one
            that ``needs_values`` can be switched to later.

    Raises:
        UserError: a block or chunk size below 1, an unknown checkpoint mode, speculative
            tokens below 0; a hash block size below the block size or speculative tokens
            with ``inpass`` or ``prompt_end_export``; a host tier beside either of those, or
            with an unknown policy; a host admission policy without a host tier.
        ValueError: group kinds that do not mix attention and state, or a missing
            callback for the eviction policy.
    """

    def __init__(self, layout: CacheLayout, *, admission: AdmissionPolicy,
                 eviction: EvictionPolicy,
                 segment_flops: Callable[[int, int], float] | None = None,
                 next_use: Callable[[Hashable, float], float] | None = None,
                 switchable: bool = False, track_values: bool = False) -> None:
        pool, sched, spec, host = layout.pool, layout.scheduling, layout.speculation, layout.host
        num_blocks, block_size, chunk_size = pool.num_blocks, pool.block_size, sched.chunk_size
        checkpoint, prompt_end_export = sched.checkpoint, sched.prompt_end_export
        num_speculative_tokens = spec.num_speculative_tokens
        check_checkpoint_mode(checkpoint)
        #: The configuration this cache was built with.
        self.layout = layout
        #: vLLM's async scheduling (the GPU default): a step is scheduled while the
        #: request's previous one is in flight, so state blocks retire a step late.
        self.async_scheduling = bool(sched.async_scheduling)
        #: Tokens per block hash (vLLM's ``hash_block_size``).
        hash_block_size = pool.hash_block_size
        assert hash_block_size is not None  # PoolSpec.__post_init__ stores block_size for None
        self.hash_block_size = hash_block_size
        #: Hits may end inside a block (``hash_block_size < block_size``).
        self.partial_hash_hits = pool.partial_hash_hits
        #: ``hash_block_size`` with partial hash hits, else ``None`` (what
        #: :class:`RequestAdmission` and :func:`blocks_needed` take).
        self._partial_hash_block_size = self.hash_block_size if self.partial_hash_hits else None
        if self.partial_hash_hits and (checkpoint != "split" or prompt_end_export):
            raise UserError("a hash block size below the block size is modelled in 'split' "
                            "checkpoint mode without prompt_end_export only")
        if (isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int)
                or num_speculative_tokens < 0):
            raise UserError(f"num_speculative_tokens must be an integer >= 0, got "
                            f"{num_speculative_tokens!r}")
        if num_speculative_tokens and (checkpoint != "split" or prompt_end_export):
            raise UserError("speculative decoding is modelled in 'split' checkpoint mode, "
                            "without prompt_end_export")
        #: Draft tokens per step (0: no speculative decoding).
        self.spec = num_speculative_tokens
        if host.chunks:
            check_host_tier(host.policy, partial_hash_hits=self.partial_hash_hits,
                            speculative_tokens=num_speculative_tokens)
        #: The host tier (vLLM's ``OffloadingConnector``), or ``None``.
        self.host = HostTier(host.chunks, host.policy, pool.bytes_per_block) if host.chunks else None
        if host.admission is not None and not host.chunks:
            raise UserError("a host admission policy needs a host tier")
        #: Per-tier admission: the states this policy keeps that ``admission`` does not
        #: go to the host tier only (:data:`~vllm_admission.core.admission.HOST`).
        self.host_admission = get_admission(host.admission) if host.admission else None
        #: vLLM's EAGLE rules apply (dropped block, lower checkpoints, K lookahead slots).
        self.eagle = spec.uses_eagle
        #: Attention slots held past the scheduled tokens (``num_lookahead_tokens``).
        self.lookahead = spec.lookahead_tokens
        #: The checkpoint mode's strategy: how prefill is cut into steps.
        self._mode = CHECKPOINT_STRATEGIES[checkpoint](prompt_end_export=prompt_end_export)
        if block_size < 1 or chunk_size < 1:
            raise UserError(f"block_size and chunk_size must be >= 1, got {block_size}, {chunk_size}")
        kinds = pool.group_kinds
        if ATTENTION not in kinds or STATE not in kinds or set(kinds) - set(GROUP_PARTS):
            raise ValueError(f"group_kinds must mix 'attention' and 'state' groups (and may "
                             f"have 'hidden' ones), got {kinds}")
        if (eviction.needs_values or track_values) and segment_flops is None:
            raise ValueError(f"eviction {eviction.name!r} needs segment_flops")
        if eviction.needs_future and next_use is None:
            raise ValueError(f"eviction {eviction.name!r} needs next_use")
        self.block_size = block_size
        self.chunk_size = chunk_size
        #: The checkpoint mode (:data:`CHECKPOINT_MODES`).
        self.checkpoint = checkpoint
        #: vLLM exports the prompt-end state from inside the last chunk (``split`` mode).
        self.prompt_end_export = prompt_end_export
        self.group_kinds = kinds
        #: The per-token groups (attention and hidden states), allocated and
        #: keyed alike.
        self.attn_groups = pool.per_token_groups
        self.state_groups = pool.state_groups
        self._num_attn, self._num_state = len(self.attn_groups), len(self.state_groups)
        self.admission = admission
        self.eviction = eviction
        self.pool = BlockPool(num_blocks, eviction, len(kinds), switchable=switchable)
        self.segment_flops = segment_flops
        self.bytes_per_block = pool.bytes_per_block
        self.next_use = next_use
        self._bind_future()
        #: Freed blocks get FLOP values (the policy reads them, or one switched to may).
        self._needs_values = eviction.needs_values or track_values
        if self._needs_values and self.pool.value is None:
            self.pool.value = [0.0] * num_blocks
        #: The segment cost model of the freed blocks' FLOP values (``None`` without
        #: ``segment_flops``: then no policy reading values can run, see above).
        self._segment_costs = None if segment_flops is None else SegmentCosts(
            block_size=block_size, num_attention_groups=len(self.attn_groups),
            num_state_groups=len(self.state_groups), bytes_per_block=self.bytes_per_block,
            segment_flops=segment_flops)
        self._wire()
        #: State checkpoints admitted (cumulative, counted once per position).
        self.state_checkpoints = 0
        #: Requests whose KV hit ran past their state hit (shared prefixes seen).
        self.junctions = 0

    def _bind_future(self) -> None:
        """Give a policy that needs the future its oracle, over this cache's pool."""
        if self.eviction.needs_future:
            keys, next_use = self.pool.key, self.next_use
            assert next_use is not None  # __init__ refuses a needs_future policy without it
            self.eviction.bind_future(lambda b, now: next_use(keys[b], now))

    def _wire(self) -> None:
        """Build the group parts over the current pool and eviction policy (at
        construction, :meth:`clone` and :meth:`switch`)."""
        needs_future = self.eviction.needs_future
        meta = None
        if self._needs_values or needs_future:
            meta = FreedBlockMeta(self.pool, self.state_groups[0], self.block_size,
                                  self._segment_costs if self._needs_values else None,
                                  self.next_use if needs_future else None)
        # One part per part class: attention and hidden-state groups share one.
        parts = {cls: cls([g for g, k in enumerate(self.group_kinds) if GROUP_PARTS[k] is cls],
                          self.pool, self.block_size, meta)
                 for cls in dict.fromkeys(GROUP_PARTS[k] for k in self.group_kinds)}
        #: The part serving the per-token groups, and the one serving the state groups.
        state = parts[GROUP_PARTS[STATE]]
        assert isinstance(state, StateGroups)  # GROUP_PARTS[STATE] is StateGroups
        self.attention, self.state = parts[GROUP_PARTS[ATTENTION]], state
        self._part_of = tuple(parts[GROUP_PARTS[kind]] for kind in self.group_kinds)


    def clone(self, *, alpha: float | None = None) -> HybridPrefixCache:
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
        if self.host is not None:
            other.host = self.host.clone()
        other._bind_future()
        other._wire()
        return other

    def switch(self, *, admission: AdmissionPolicy | None = None,
               eviction: EvictionPolicy | None = None,
               held: Sequence[Container[Hashable]] | None = None) -> None:
        """Use another admission and/or eviction policy from the next request on.

        An admission policy decides per request, so it simply takes over. A new
        eviction policy (a fresh object) receives the current free cached
        blocks with the times and values they were freed with
        (:meth:`BlockPool.switch <vllm_admission.core.cache.block_pool.BlockPool.switch>`);
        no block changes hands, so nothing can leak.

        Args:
            admission: the new admission policy (``None``: keep the current one).
            eviction: the new eviction policy (``None``: keep the current one).
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
            self.pool.switch(eviction, demote)
            self.eviction = eviction
            self._wire()

    def held_keys(self) -> tuple[frozenset[Hashable], ...]:
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
                             num_state_groups=len(self.state_groups),
                             hash_block_size=self._partial_hash_block_size,
                             num_speculative_tokens=self.spec, num_lookahead_tokens=self.lookahead,
                             async_scheduling=self.async_scheduling)

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
    def lookup(self, hashes: Sequence[int], prompt_len: int,
               units: Sequence[Hashable] | None = None) -> HitProbe:
        """Attention-KV hit and hybrid hit of a prompt, without touching anything
        (``HybridKVCacheCoordinator.find_longest_cache_hit``): the longest run of
        cached attention blocks, capped at ``prompt_len - 1`` tokens, then the
        longest prefix within it whose state is cached in every state group.
        With a hash block size below the block size, ``units`` (the prompt's keys per
        unit) extend both to unit boundaries (:class:`HybridPrefixCache`)."""
        return self._lookup(hashes, prompt_len, units)[0]

    def _lookup(self, hashes: Sequence[int], prompt_len: int, units: Sequence[Hashable] | None
                ) -> tuple[HitProbe, _LastKeys | None]:
        """:meth:`lookup`, and, when the hit ends inside a block, the keys its
        last attention block and its state were found under (else ``None``)."""
        B = self.block_size
        if self.eagle:
            # EAGLE: match up to the last full prompt block, then drop one block (with a
            # finer unit _lookup_units goes on by units and drops one unit instead).
            kv_blocks = self.attention.longest_hit(hashes, min(prompt_len // B, len(hashes)))
            if kv_blocks and not self.partial_hash_hits:
                kv_blocks -= 1
        else:
            kv_blocks = self.attention.longest_hit(hashes, min((prompt_len - 1) // B, len(hashes)))
        if self.partial_hash_hits:
            return self._lookup_units(hashes, prompt_len, units, kv_blocks)
        hit_blocks = self.state.longest_hit(hashes, kv_blocks)
        return HitProbe(prompt_len, B, kv_blocks * B, hit_blocks * B), None

    def _lookup_units(self, hashes: Sequence[int], prompt_len: int,
                      units: Sequence[Hashable] | None, kv_blocks: int
                      ) -> tuple[HitProbe, _LastKeys | None]:
        """:meth:`_lookup` with a hash block ``u`` finer than the block. Returns
        the probe and, when the hit ends inside a block, the keys its last
        attention block and its state were found under (else ``None``).

        Attention (``FullAttentionManager.find_longest_cache_hit``, phase 2):
        after ``kv_blocks`` cached blocks, the highest unit boundary inside the
        next block, below ``prompt_len``, that has a key. State
        (``MambaManager.find_longest_cache_hit``): the highest unit boundary at
        or below that with a cached state, a block hash at block boundaries.
        With EAGLE the units go up to ``prompt_len`` (no token is kept back for
        the logits) and the attention hit then drops one unit
        (``eagle_proof_margin``: one hash block for a fine-grained lookup); the
        block found stays the last one of the hit.
        """
        if units is None:
            raise ValueError("a hash block size below the block size needs the prompt's unit keys")
        B, u = self.block_size, self.hash_block_size
        per = B // u
        kv = kv_blocks * B
        first = kv_blocks * per
        last = min(first + per - 1, (prompt_len if self.eagle else prompt_len - 1) // u,
                   len(units))
        attn = self.attention.indexes
        kv_key = None
        for f in range(last - 1, first - 1, -1):
            h = units[f]
            if all(h in d for d in attn):
                kv, kv_key = (f + 1) * u, h
                break
        if self.eagle and kv:
            kv -= u
        state = self.state.indexes
        hit = 0
        state_key = None
        for f in range(kv // u - 1, -1, -1):
            end = f + 1
            h = hashes[end // per - 1] if end % per == 0 else units[f]
            if all(h in d for d in state):
                hit = end * u
                if end % per:
                    state_key = h
                break
        if hit % B == 0:
            return HitProbe(prompt_len, B, kv, hit), None
        # The attention block under the hit: a full block, or the one found inside it.
        last_attn = hashes[hit // B] if hit // B < kv_blocks else kv_key
        return HitProbe(prompt_len, B, kv, hit), (last_attn, state_key)

    # -- one request -----------------------------------------------------
    def serve(self, hashes: Sequence[int], prompt_len: int, output_len: int,
              rid: int, now: float, units: Sequence[Hashable] | None = None) -> RequestOutcome:
        """Run one request to completion and return what it hit.

        Args:
            hashes: chained block hashes of the prompt's full blocks
                (``prompt_len // block_size`` of them).
            prompt_len: prompt tokens (>= 1).
            output_len: tokens generated (>= 1).
            rid: a request number unique in this run (names output blocks).
            now: logical time of the request.
            units: with a hash block size below the block size, the prompt's chained
                keys per unit (``prompt_len // u`` of them, a chain of their own:
                only the ones inside a block are used); else ignored.

        Raises:
            PoolExhausted: the request does not fit (check :meth:`fits`).
            ValueError: a smaller hash block size and no ``units``.
        """
        B = self.block_size
        pool = self.pool
        evictions_before = pool.evictions
        if pool.reports_requests:
            # The prompt's full blocks only, as the engine can know them at the lookup
            # (``AdmissionControl.on_request``): ``hashes`` may run on through the output.
            pool.eviction.on_request(hashes[:prompt_len // B], now)
        probe, last_keys = self._lookup(hashes, prompt_len, units)
        if probe.junction:
            self.junctions += 1
        total = prompt_len + output_len
        adm = RequestAdmission(self.admission, probe, total_len=total,
                               hash_block_size=self._partial_hash_block_size, eagle=self.eagle,
                               host_policy=self.host_admission)
        run = RunningRequest(rid=rid, hashes=hashes, prompt_len=prompt_len, adm=adm,
                             blocks=[[] for _ in self.group_kinds],
                             num_cached=probe.state_hit // B, live=[])
        if self.partial_hash_hits:
            # The keys at the prompt's unit end (attention and state) only where the policy keeps
            # its state: without one, a hit there is impossible and the key would
            # only keep the block cached. The chunk still ends there (vLLM's stop).
            run.units = units
            keeps = adm.keeps_prompt_unit_end()
            run.state_sub_block_end = adm.state_sub_block_end if keeps else 0
            run.attn_sub_block_end = adm.attn_sub_block_end if keeps else 0
        start = end = probe.state_hit
        host = self.host
        if host is not None:
            run.host = HostRequest()
            end = host.hit_end(hashes, start, prompt_len, B, self.attn_groups, self.state_groups)
        if last_keys is not None:
            run.cow = probe.state_hit // B
            self._touch_hit(run, run.cow + 1, now, last_keys)
        elif run.num_cached:
            # A host load past the local hit makes the local state superfluous: vLLM
            # skips (never references) the state groups' hit blocks then
            # (``add_local_computed_blocks``, ``get_num_skipped_tokens`` of the total).
            self._touch_hit(run, run.num_cached, now, skip_states=end > start)
        if end > start:
            self._load(run, start, end, now)
            start = end
        run.prev_start = start
        steps = self._mode.prefill(self, run, start, output_len, now)
        # Decode: the step computing token t has t + 1 tokens in the request; only
        # steps next to a block boundary change the cache, so only those run. Under
        # EAGLE/MTP the step also verifies the K drafts (scheduled, never cached until
        # accepted; the model's drafts are taken as rejected, one token a step).
        step, width, late = self.step, 1 + self.spec, self.async_scheduling
        for t in _decode_events(prompt_len, total - 2, B, self.spec, self.lookahead, late):
            if late and t > prompt_len:
                run.prev_start = t - 1   # the decode step before, in flight
            step(run, t, width, t + 1, now)
        if host is not None:
            # Its last store pass and the use of its keys happen in the next request's
            # first step (HostTier.finish).
            if output_len > 1:
                host.settle()  # the decode steps: no stores, every transfer done
            assert run.host is not None  # set above with the host tier
            host.finish(run.host, hashes, min(prompt_len // B, len(hashes)), self.attn_groups, B)
        self._finish(run, now)
        return RequestOutcome(prompt_tokens=prompt_len, hit_tokens=start,
                              kv_hit_tokens=max(probe.kv_hit, start), junction=probe.junction,
                              checkpoints=len(adm.admitted),
                              evictions=self.pool.evictions - evictions_before,
                              prefill_steps=steps, host_hit_tokens=start - probe.state_hit)

    def _touch_hit(self, run: RunningRequest, hit_blocks: int, now: float,
                   last_keys: _LastKeys | None = None, skip_states: bool = False) -> None:
        """Reference the hit's blocks, group by group (``add_local_computed_blocks``).
        ``last_keys``: ``(attention key, state key)`` of the last block when the
        hit ends inside it. ``skip_states``: external tokens follow the hit (a host
        load), so the state groups reference none of it (null blocks only)."""
        for g, part in enumerate(self._part_of):
            if skip_states and part is self.state:
                run.blocks[g] = [NULL] * hit_blocks
                continue
            key = None if last_keys is None else last_keys[part is not self.attention]
            part.touch_hit(run, g, hit_blocks, now, key)
        if not skip_states:
            run.live.append(hit_blocks - 1)

    def step(self, run: RunningRequest, start: int, n: int, num_tokens: int, now: float,
             captures: Sequence[int] = ()) -> None:
        """One scheduler step computing tokens ``[start, start + n)`` while the
        request has ``num_tokens`` tokens, in either checkpoint mode.

        ``MambaManager.remove_skipped_blocks`` (:meth:`StateGroups.retire
        <vllm_admission.core.cache.groups.StateGroups.retire>`), then
        ``allocate_new_blocks`` (:meth:`_allocate`), then ``cache_blocks`` of the
        now-full blocks: every new attention block, then each state block whose
        position the admission policy admits (:meth:`AttentionGroups.cache_full
        <vllm_admission.core.cache.groups.AttentionGroups.cache_full>`,
        :meth:`StateGroups.cache_full <vllm_admission.core.cache.groups.StateGroups.cache_full>`).
        Each runs only when it has work.
        ``captures``: ascending block-aligned positions inside ``(start, start +
        n)`` whose states the pass copies into state blocks of their own
        (``inpass`` mode, and ``split`` mode's prompt-end export).
        """
        B = self.block_size
        host = self.host
        if run.host is not None:
            assert host is not None  # run.host is set only with a host tier (serve)
            host.next_step()
        live = run.live
        # vLLM retires on processed tokens (``allocate_slots``: computed minus in
        # flight): under async scheduling, the previous step's start.
        done = run.prev_start if self.async_scheduling else start
        run.prev_start = start
        if done > 0 and live and live[0] < (done - 1) // B:
            self.state.retire(run, (done - 1) // B, now)
        end = start + n
        need = -(-end // B)
        tables = run.blocks
        spec = self.spec
        # Attention holds the drafter's slots too (vLLM's num_lookahead_tokens).
        need_attn = -(-(end + self.lookahead) // B) if self.lookahead else need
        if (captures or need_attn > len(tables[self.attn_groups[0]])
                or need > len(tables[self.state_groups[0]]) or run.cow >= 0 or run.move_sub_block_state
                or (spec and run.spec_blocks is None)):
            self._allocate(run, need, now, [p // B - 1 for p in captures] if captures else (),
                           need_attn)
        written = run.written
        if written is not None:
            written.update(p // B - 1 for p in captures)
            if end % B == 0:
                written.add(end // B - 1)
        full = (end if end < num_tokens else num_tokens) // B
        if full > run.num_cached:
            nc, run.num_cached = run.num_cached, full
            at = run.attn_sub_block_end // B
            sub_block_index = at if run.attn_sub_block_keyed and nc <= at < full else -1
            if sub_block_index >= 0:
                # The block holding the sub-block key fills: it is keyed again under
                # its full hash, then the sub-block key is added back (``cache_full_blocks``'
                # partial-to-full promotion, then ``_cache_partial_tail_block``).
                for g in self.attn_groups:
                    self.pool.drop_keys(tables[g][sub_block_index])
            self.attention.cache_full(run, nc, full)
            if sub_block_index >= 0:
                self._key_sub_block(run, self.attn_groups, run.attn_sub_block_end)
            # A state block can be cached only if one is held in [nc, full).
            if live and live[-1] >= nc and live[0] < full:
                self.state_checkpoints += self.state.cache_full(run, nc, full)
        if run.state_sub_block_end and end == run.state_sub_block_end:
            # The chunk stop at the prompt's unit end (vLLM's tail_boundary): its state is keyed.
            self._key_sub_block(run, self.state_groups, run.state_sub_block_end)
            run.adm.record(run.state_sub_block_end)
            self.state_checkpoints += 1
            run.move_sub_block_state = True
        if run.attn_sub_block_end and end >= run.attn_sub_block_end and not run.attn_sub_block_keyed:
            self._key_sub_block(run, self.attn_groups, run.attn_sub_block_end)
            run.attn_sub_block_keyed = True
        if run.host is not None:
            # Every step offers the host what it has not taken yet (a hit's blocks in the
            # first one); the last request's deferred work follows (once).
            assert host is not None  # as above
            self._offload(run, full)
            host.flush()

    def _load(self, run: RunningRequest, start: int, end: int, now: float) -> None:
        """A host-tier hit ``[start, end)``: the load step. Blocks are allocated for the
        loaded tokens (every attention block, the state block at ``end``), the host
        chunks are loaded, and the blocks are cached as computed ones once the load
        is done (the scheduler's ``allocate_slots`` with external tokens, then
        ``cache_blocks`` in ``_update_waiting_for_remote_kv``); the state at ``end``
        only where the admission policy admits it. Stores to the host then begin at
        ``end`` (``update_state_after_alloc``)."""
        B, host, req = self.block_size, self.host, run.host
        # A load runs only past a host tier's hit, for a request serve gave a HostRequest.
        assert host is not None and req is not None
        host.next_step()
        self._allocate(run, end // B, now)
        host.load(req, run.hashes, start, end, B, self.attn_groups, self.state_groups)
        # The load step schedules nothing of this request: the last request's deferred
        # work runs now.
        host.flush()
        nc, full = run.num_cached, end // B
        run.num_cached = full
        self.attention.cache_full(run, nc, full)
        self.state_checkpoints += self.state.cache_full(run, nc, full)

    def _offload(self, run: RunningRequest, full: int) -> None:
        """The host stores of one step after which the request's first ``full`` blocks
        are computed (``build_connector_meta``, every step of a scheduled request):
        first each state cached since the last step inside the prompt, one call per
        state group (the Mamba manager's boundary hand-offs,
        ``_build_aligned_boundary_store_jobs``), then the prompt's attention chunks not
        stored yet, from the first one (a hit's too) unless a host load set the start
        (``_build_store_jobs``; output blocks are not offloaded)."""
        host, B, req = self.host, self.block_size, run.host
        assert host is not None and req is not None  # step calls it for a run.host only
        hashes = run.hashes
        top = min(full, run.prompt_len // B, len(hashes))
        states = run.cached_states
        if states:
            for g in self.state_groups:
                for i in states:
                    if i < top:
                        host.store(req, (((hashes[i], g), (i + 1) * B),))
            states.clear()
        host.store_chunks(req, hashes, top, self.attn_groups, B)

    def _key_sub_block(self, run: RunningRequest, groups: Sequence[int], position: int) -> None:
        """Give the block of each of ``groups`` holding the prompt's unit end
        boundary ``position`` that boundary's key (``BlockPool.cache_partial_block``)."""
        units = run.units
        assert units is not None  # a sub-block key comes with partial hash hits only (serve)
        i, key = position // self.block_size, units[position // self.hash_block_size - 1]
        tables, add_key = run.blocks, self.pool.add_key
        for g in groups:
            add_key(g, tables[g][i], key)

    def _allocate(self, run: RunningRequest, need: int, now: float,
                  captures: Sequence[int] = (), need_attn: int | None = None) -> None:
        """``allocate_new_blocks``: every attention group grows to ``need`` blocks,
        every state group gets one new block at index ``need - 1`` (if it has
        none there yet) and one at each ascending index in ``captures`` it has
        none at (NULL before them). One pool call for all groups, attention
        groups first: which group gets which popped block changes neither hits
        nor the eviction order. Attention groups all hold the same number of
        blocks, and state groups hold theirs at the same indexes
        (:class:`~vllm_admission.core.cache.groups.RunningRequest`)."""
        tables = run.blocks
        attn_groups, state_groups = self.attn_groups, self.state_groups
        grow = (need if need_attn is None else need_attn) - len(tables[attn_groups[0]])
        if grow < 0:
            grow = 0
        have = len(tables[state_groups[0]])
        indexes: list[int] | tuple[()]
        if captures:
            indexes = [i for i in captures if i >= have]
            if need - 1 >= have and (not indexes or indexes[-1] != need - 1):
                indexes.append(need - 1)
        else:
            indexes = [need - 1] if need > have else ()
        total = grow * self._num_attn + len(indexes) * self._num_state
        extra = (len(self.group_kinds) if run.cow >= 0 else 0) + (
            self._num_state if run.move_sub_block_state else 0)
        spec = self.spec * self._num_state if run.spec_blocks is None and self.spec else 0
        if not total + extra + spec:
            return
        new = self.pool.allocate(total + extra + spec, now)
        if spec:
            # EAGLE's speculative state blocks: held from the first allocation on.
            k = total + extra
            run.spec_blocks = [new[k + i * self.spec:k + (i + 1) * self.spec]
                               for i in range(self._num_state)]
        if extra:
            self._copy_blocks(run, new[total:total + extra], now)
        k = 0
        if grow:
            for g in attn_groups:
                tables[g] += new[k:k + grow]
                k += grow
        if indexes:
            for g in state_groups:
                table = tables[g]
                for i in indexes:
                    if i > len(table):
                        table += [NULL] * (i - len(table))
                    table.append(new[k])
                    k += 1
            run.live.extend(indexes)

    def _copy_blocks(self, run: RunningRequest, new: Sequence[int], now: float) -> None:
        """The block copies a smaller hash block size asks for at an allocation, with
        ``new``: one block per group for a hit inside a block (the request's
        private copy replaces the shared block, which is released:
        ``_apply_cow``), one per state group for a sub-block state just cached (its
        keys move to the new block, which is released: ``move_block_hashes``).
        The released blocks go back in group order, after the step's
        allocation (``Scheduler._free_cow_retained_blocks``), with no FLOP value."""
        tables, pool = run.blocks, self.pool
        released = []
        k = 0
        if run.cow >= 0:
            i = run.cow
            for table in tables:
                released.append([table[i]])
                table[i] = new[k]
                k += 1
            run.cow = -1
        if run.move_sub_block_state:
            i = run.state_sub_block_end // self.block_size
            for g in self.state_groups:
                pool.move_keys(tables[g][i], new[k])
                released.append([new[k]])
                k += 1
            run.move_sub_block_state = False
        if pool.value is not None:
            # Released outside the request's free path: no FLOP value (the
            # plugin's free queue values only the blocks a request frees).
            for (b,) in released:
                pool.value[b] = 0.0
        pool.free_each(released, now)

    def _finish(self, run: RunningRequest, now: float) -> None:
        """Free every block: group after group in vLLM's order, each group's
        latest first (``SingleTypeKVCacheManager.free``); a state group's
        speculative blocks (never cached) before its held ones."""
        lists = [part.release(run, g) for g, part in enumerate(self._part_of)]
        if run.spec_blocks:
            for i, g in enumerate(self.state_groups):
                lists[g] = run.spec_blocks[i][::-1] + lists[g]
        self.pool.free_each(lists, now)
        run.blocks = [[] for _ in run.blocks]
        run.live = []
