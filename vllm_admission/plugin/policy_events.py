"""vLLM's block events told to the eviction policy, and the values of the blocks it orders.

:class:`PolicyEvents` holds the engine's eviction policy (``None`` keeps vLLM's own
free-block queue, a policy in vLLM's order) and tells it what the simulator's cache
model tells it, at the same moments:

* a request's first prefix lookup: its prompt's block keys, to a policy that
  ``needs_requests`` (:meth:`PolicyEvents.on_request`);
* a block that got its first hash (``BlockPool.cache_full_blocks``,
  ``cache_partial_block``, ``move_block_hashes``): its key, to a policy that
  ``needs_keys`` (:meth:`PolicyEvents.on_cache`, :meth:`PolicyEvents.on_keys_moved`);
* a prefix hit (``BlockPool.touch``) and a hash dropped without an eviction: to a policy
  that ``needs_hits`` (:meth:`PolicyEvents.on_hit`, :meth:`PolicyEvents.on_hash_dropped`);
* blocks freed: their FLOP values per byte, from the request's
  :meth:`~vllm_admission.core.admission.RequestAdmission.block_value`, for a policy that
  ``needs_values`` (:meth:`PolicyEvents.free_stamp`, :meth:`PolicyEvents.stage_values`).

Time is the injected recency clock (:class:`RequestClock` by default). No vLLM import:
requests and blocks are read through their attributes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Container, Sequence
from typing import TYPE_CHECKING

from vllm_admission.core.admission import HOST, TENTATIVE, AdmissionDecision, SegmentCosts
from vllm_admission.core.eviction import EvictionPolicy
from vllm_admission.core.layout import CacheLayout
from vllm_admission.plugin import translate

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_utils import BlockHash, KVCacheBlock
    from vllm.v1.request import Request

    from vllm_admission.plugin.free_queue import PolicyFreeBlockQueue
    from vllm_admission.plugin.requests import RequestTrack

__all__ = ["PolicyEvents", "RequestClock"]

#: ``f(block) -> FLOPs per byte`` of a request's cached block.
BlockValueFn = Callable[["KVCacheBlock"], float]


class RequestClock:
    """The eviction policies' recency clock in the engine: the index of the latest request
    that arrived (0-based; 0.0 before any), as the simulator's ``now``. Wall seconds would
    make the utility's recency term, and so alpha, depend on engine speed."""

    def __init__(self) -> None:
        self.arrivals = 0

    def tick(self) -> None:
        """A request arrived (``Scheduler.add_request``)."""
        self.arrivals += 1

    def __call__(self) -> float:
        return float(max(self.arrivals - 1, 0))


class PolicyEvents:
    """The eviction policy's view of vLLM's prefix cache for one engine.

    Args:
        eviction_policy: the policy ordering free cached blocks, or ``None`` (vLLM's
            own queue: every event is then ignored).
        eviction: the eviction policy's name (also when ``eviction_policy`` is ``None``).
        layout: the engine's cache layout (block size, hash stride, groups, page bytes).
        prefill_flops: ``f(num_tokens, num_cached) -> FLOPs``; required for values.
        clock: the recency clock.
    """

    def __init__(self, eviction_policy: EvictionPolicy | None, eviction: str, *,
                 layout: CacheLayout, prefill_flops: Callable[[int, int], float] | None,
                 clock: Callable[[], float]) -> None:
        self.eviction_policy = eviction_policy
        self.eviction = eviction
        self.clock = clock
        pool = layout.pool
        self.B = pool.block_size
        self._hashes_per_block = pool.hashes_per_block
        self.first_state = pool.state_groups[0]
        self._state_set = frozenset(pool.state_groups)
        #: The values' FLOP model; ``None`` without ``prefill_flops`` (no policy reads values).
        self._segment_costs = None if prefill_flops is None else SegmentCosts(
            block_size=pool.block_size, num_attention_groups=len(pool.per_token_groups),
            num_state_groups=len(pool.state_groups), bytes_per_block=pool.bytes_per_block,
            segment_flops=prefill_flops)
        self._output_keys = itertools.count()  # keys of blocks holding generated tokens
        #: ``f(block_hash, group) -> bool``: whether vLLM's pool holds a state block for
        #: that hash in that group (for the values of states below a request's hit).
        self.is_cached_state: Callable[[BlockHash, int], bool] | None = None
        #: ``f(block) -> KV cache group index`` of a cached block.
        self.group_of: Callable[[KVCacheBlock], int] | None = None

    def bind_pool(self, is_cached_state: Callable[[BlockHash, int], bool] | None,
                  group_of: Callable[[KVCacheBlock], int] | None) -> None:
        """Read vLLM's block pool through these (the adapter binds them once the pool exists)."""
        self.is_cached_state = is_cached_state
        self.group_of = group_of

    # -- switching and tuning ------------------------------------------------
    def set_eviction(self, policy: EvictionPolicy) -> None:
        """Order free blocks by ``policy`` (fresh) from now on (``auto``)."""
        self.eviction_policy = policy
        self.eviction = policy.name

    def set_alpha(self, alpha: float) -> None:
        """Apply a tuned alpha to the (``tunable``) eviction policy."""
        assert self.eviction_policy is not None  # the tuner runs only for the plugin's own policy
        self.eviction_policy.alpha = alpha

    @property
    def alpha(self) -> float | None:
        """The eviction policy's alpha where it is ``tunable``, else ``None``."""
        policy = self.eviction_policy
        return policy.alpha if policy is not None and policy.tunable else None

    def unheld_by_shadow(self, held: Sequence[Container] | None) -> Callable[[KVCacheBlock], bool] | None:
        """``f(block) -> bool`` for the free queue's switch: whether a free cached
        block goes first (:func:`vllm_admission.plugin.translate.unheld_by_shadow`, with
        this engine's ``group_of``)."""
        group_of = self.group_of
        assert group_of is not None  # bound by hooks.install, before any switch
        return translate.unheld_by_shadow(held, group_of)

    # -- values for value-aware eviction (needs_values) -------------------
    def _is_cached_state(self, track: RequestTrack) -> Callable[[int], bool]:
        """``f(i)``: whether vLLM's pool holds the first state group's state after
        block ``i`` of the request's prompt (for the checkpoints below its hit)."""
        is_cached_state = self.is_cached_state
        if is_cached_state is None:
            return lambda i: False
        hashes = track.request.block_hashes
        stride = self._hashes_per_block
        g = self.first_state

        at = translate.block_hash_at

        def cached(i: int) -> bool:
            h = at(hashes, i, stride)
            return h is not None and is_cached_state(h, g)

        return cached

    def block_value_fn(self, track: RequestTrack | None) -> BlockValueFn:
        """``f(block) -> FLOPs per byte`` for the request's cached blocks (lazy);
        0 for every block when the policy does not use values."""
        policy = self.eviction_policy
        if track is None or policy is None or not policy.needs_values:
            return lambda block: 0.0
        cached = self._is_cached_state(track)
        costs, states, group_of = self._segment_costs, self._state_set, self.group_of
        assert costs is not None  # a policy that needs values runs with prefill_flops
        assert group_of is not None  # bound by hooks.install, before blocks are freed
        value_at = track.adm.block_value

        def value(block: KVCacheBlock) -> float:
            end = block.block_hash_num_tokens
            if end is None:
                return 0.0
            return value_at(end, group_of(block) in states, costs, cached)

        return value

    def free_stamp(self, track: RequestTrack | None) -> tuple[float, BlockValueFn]:
        """``(now, value_of)`` for the blocks of one request freed together."""
        return self.clock(), self.block_value_fn(track)

    def stage_values(self, queue_: PolicyFreeBlockQueue, track: RequestTrack | None,
                     blocks: Sequence[KVCacheBlock]) -> None:
        """Value blocks now that are returned to the pool later (deferred frees)."""
        policy = self.eviction_policy
        if policy is None or not policy.needs_values:
            return
        value = self.block_value_fn(track)
        for b in blocks:
            if not b.is_null and b.block_hash is not None:
                queue_.stage_value(b, value(b))

    # -- events --------------------------------------------------------------
    def on_hit(self, blocks: Sequence[KVCacheBlock]) -> None:
        """A prefix hit referenced ``blocks`` (``BlockPool.touch``): tell a policy
        that :attr:`~vllm_admission.core.eviction.EvictionPolicy.needs_hits`."""
        policy = self.eviction_policy
        if policy is None or not policy.needs_hits:
            return
        now = self.clock()
        for b in blocks:
            if not b.is_null and b.block_hash is not None:
                policy.on_hit(b.block_id, now)

    def on_request(self, request: Request) -> None:
        """A request's first prefix lookup: tell a policy that
        :attr:`~vllm_admission.core.eviction.EvictionPolicy.needs_requests` its
        prompt's full-block keys (:func:`~vllm_admission.plugin.translate.prompt_block_keys`),
        as the simulator does when it starts the request."""
        policy = self.eviction_policy
        if policy is None or not policy.needs_requests:
            return
        keys = translate.prompt_block_keys(request.block_hashes, request.num_prompt_tokens,
                                           self.B, self._hashes_per_block)
        policy.on_request(keys, self.clock())

    def wants_keys(self) -> bool:
        """Whether the eviction policy keeps history by block hash (``needs_keys``)."""
        policy = self.eviction_policy
        return policy is not None and policy.needs_keys

    def on_cache(self, request: Request, group: int, blocks: Sequence[KVCacheBlock],
                 decide: Callable[[int], AdmissionDecision] | None) -> None:
        """``blocks`` of KV cache group ``group`` of ``request`` just got their first
        hash (``BlockPool.cache_full_blocks``, or ``cache_partial_block`` with a hash
        unit finer than the block); tell a policy that ``needs_keys``.

        The keys are the simulator's (``core.cache.groups``, the parts' ``cache_full``), so both
        tell the policy the same thing at the same moment:

        * a block of prompt tokens only (its hash covers at most
          ``num_prompt_tokens``): ``(group, translate.hash_key(block hash))``;
        * a block holding generated tokens: a key of its own that never
          recurs. The simulator cannot know output tokens and counts them as
          new content; vLLM's hash would tie a resent prompt's identical
          greedy output to the first one's;
        * a state kept tentatively as the sequence end (``marconi``,
          :data:`~vllm_admission.core.admission.TENTATIVE`): no key. The
          simulator knows the length and caches only the last such state,
          without telling the policy either;
        * a state for the host tier only
          (:data:`~vllm_admission.core.admission.HOST`): no key; the simulator
          never caches it on the GPU.

        Args:
            decide: the request's admission decision by position where ``group`` may
                hold such states (:meth:`~vllm_admission.plugin.requests.RequestTracker.transient`),
                else ``None``.
        """
        policy = self.eviction_policy
        assert policy is not None  # called only where wants_keys()
        prompt_len = request.num_prompt_tokens
        for b in blocks:
            end = b.block_hash_num_tokens
            if decide is not None and decide(end) in (TENTATIVE, HOST):
                continue
            if end > prompt_len:
                key: object = ("out", next(self._output_keys))
            else:
                key = (group, translate.hash_key(b.block_hash))
            policy.on_cache(b.block_id, key)

    def on_keys_moved(self, block: KVCacheBlock) -> None:
        """``block`` just took over another block's hashes (``BlockPool.move_block_hashes``:
        the prefix cache keeps a copy of a block its request writes on: one keyed at a
        prompt's unit end, or a hit block); tell
        a policy that ``needs_keys`` its first one, as the simulator does
        (``BlockPool.move_keys`` in ``core/cache/block_pool.py``). Only prompt blocks
        move, so the key is the hash's."""
        policy, group_of = self.eviction_policy, self.group_of
        assert policy is not None  # called only where wants_keys()
        assert group_of is not None  # bound by hooks.install
        policy.on_cache(block.block_id, (group_of(block), translate.hash_key(block.block_hash)))

    def on_hash_dropped(self, block: KVCacheBlock) -> None:
        """``block`` lost its hash without an eviction (a superseded state)."""
        policy = self.eviction_policy
        if policy is not None and policy.needs_hits:
            policy.forget(block.block_id)
