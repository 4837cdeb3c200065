"""Thin subclasses of vLLM 0.32's KV cache classes that call :class:`AdmissionControl`.

vLLM builds its KV cache objects inside ``KVCacheManager.__init__``
(``vllm/v1/core/kv_cache_manager.py``: ``get_kv_cache_coordinator`` picks the
coordinator, which builds the ``BlockPool`` and one manager per KV cache group).
:func:`vllm_admission.plugin.boundary.hooks.install` turns those live, still empty
objects into the subclasses below (by re-typing them, so every field vLLM set
up stays as it is):

* :class:`AdmissionCoordinator` (``HybridKVCacheCoordinator``,
  ``vllm/v1/core/kv_cache_coordinator.py``), with an eviction policy that
  ``needs_values`` (or an ``auto`` that may switch to one): ``free``,
  ``remove_skipped_blocks`` and ``pop_blocks_for_free`` give the blocks a
  request returns to the pool one time stamp and their FLOP efficiency;
* :class:`PolicyMambaManager` (``MambaManager``,
  ``vllm/v1/core/single_type_kv_cache_manager.py``), every policy but ``vllm`` (which keeps
  vLLM's own manager): ``cache_blocks`` gives a recurrent state a block hash only where the
  admission policy admits it (it hands vLLM's own mask code those positions as the "reachable
  boundaries", with ``retention_interval=0``); ``_cache_partial_tail_block`` is switched off,
  because with one hash per block it can only re-register the prompt-end state the policy just
  decided about;
* :class:`AdmissionBlockPool` (``BlockPool``, ``vllm/v1/core/block_pool.py``):
  ``cache_full_blocks`` records which states of the first state group got a
  hash (checkpoint metrics, block values) and reports every block that got a
  hash to an eviction policy that ``needs_keys``
  (:meth:`AdmissionControl.on_cache`), ``get_new_blocks`` counts evictions
  per KV cache group, ``touch`` reports prefix hits to a policy that
  ``needs_hits``, ``reset_prefix_cache`` re-orders the policy's free queue.

With an eviction policy not in vLLM's order (``flop``, or any other
registered policy whose ``vllm_order`` is false and that needs no future)
``block_pool.free_block_queue`` is replaced by
:class:`~vllm_admission.plugin.free_queue.PolicyFreeBlockQueue` running that
policy; with ``lru`` vLLM's ``FreeKVCacheBlockQueue`` stays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator
from vllm.v1.core.kv_cache_utils import KVCacheBlock, get_group_id
from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager, MambaManager
from vllm.v1.kv_cache_interface import HiddenStateCacheSpec, MambaSpec

from vllm_admission.core.layout import ATTENTION, HIDDEN, STATE
from vllm_admission.plugin.control import AdmissionControl
from vllm_admission.plugin.free_queue import PolicyFreeBlockQueue

__all__ = ["AdmissionBlockPool", "AdmissionCoordinator", "PolicyMambaManager",
           "exports_prompt_end_state", "group_kinds", "smallest_cacheable_prefix"]


def exports_prompt_end_state(kv_cache_config: Any, cache_config: Any) -> bool:
    """Whether vLLM writes the prompt-end state from inside the last prefill chunk
    instead of ending a chunk there.

    vLLM's scheduler does so in ``align`` mode when every Mamba group's spec declares
    ``num_prefill_checkpoint_blocks`` (``vllm/v1/core/sched/scheduler.py``,
    ``mamba_has_prefill_checkpoint_blocks``). vLLM 0.32 and 0.33 declare it for Mamba2
    layers (``mamba_mixer2.py``), 0.33 also for Qwen GDN layers on the FlashInfer prefill
    backend; vLLM's CPU platform cannot write it, and this package's CPU repair takes the
    declaration back there (:mod:`vllm_admission.plugin.repairs.cpu_mamba2`).

    Args:
        kv_cache_config: the engine's ``KVCacheConfig``.
        cache_config: the engine's ``CacheConfig`` (its ``mamba_cache_mode``).
    """
    specs = [g.kv_cache_spec for g in kv_cache_config.kv_cache_groups
             if isinstance(g.kv_cache_spec, MambaSpec)]
    return (bool(specs) and getattr(cache_config, "mamba_cache_mode", None) == "align"
            and all(s.num_prefill_checkpoint_blocks > 0 for s in specs))


def group_kinds(managers: Sequence[Any]) -> tuple[str, ...]:
    """The core's kind of each KV cache group, from the vLLM manager that runs it.

    What decides how a group is reused is its manager, not its spec class
    (vLLM's ``KVCacheSpecRegistry`` in
    ``vllm/v1/core/single_type_kv_cache_manager.py`` maps several specs to one
    manager): a group run by ``FullAttentionManager`` (full attention, and also
    MLA specs) is ``"attention"``, reusable at any cached block
    (``PolicyAttentionManager`` too), or ``"hidden"`` when its spec is a
    ``HiddenStateCacheSpec`` (reused alike, named apart); one run by
    ``MambaManager`` (or this module's subclass) is
    ``"state"``, reusable only where a state was saved. Any other manager
    (sliding window, chunked local attention, ...) is named by its class, which
    the plugin then treats as unsupported.

    Args:
        managers: ``coordinator.single_type_managers``, in group order.
    """
    kinds = []
    for m in managers:
        cls = type(m)
        if cls is MambaManager or cls is PolicyMambaManager:
            kinds.append(STATE)
        elif cls is FullAttentionManager or cls is PolicyAttentionManager:
            hidden = isinstance(getattr(m, "kv_cache_spec", None), HiddenStateCacheSpec)
            kinds.append(HIDDEN if hidden else ATTENTION)
        else:
            kinds.append(cls.__name__)
    return tuple(kinds)


def smallest_cacheable_prefix(managers: Sequence[Any], *, scheduler_block_size: int,
                              hash_block_size: int, partial_hash_hits: bool = False,
                              ) -> tuple[int, tuple[int, ...]]:
    """The shortest prefix a prompt can hit, in tokens, overall and per KV cache group.

    A group reports a hit in whole units of its own: a full-attention group in whole KV blocks
    (its manager's ``block_size``), a Mamba/GDN group in align mode only where a state was
    written, which is at its block boundaries. With partial hash hits on, a manager that
    supports fine-grained lookup reports in hash blocks (``hash_block_size``) instead
    (``vllm/v1/core/single_type_kv_cache_manager.py``, each manager's
    ``find_longest_cache_hit``). The hybrid hit is one length that every group
    hits and that is a multiple of the coordinator's alignment (the scheduler
    block size, or the hash block size with partial hash hits:
    ``HybridKVCacheCoordinator._cache_hit_alignment_tokens``,
    ``vllm/v1/core/kv_cache_coordinator.py``), so its shortest value is the
    least common multiple of all of them.

    vLLM never hits a whole prompt: ``KVCacheManager.get_computed_blocks``
    caps the hit at ``num_tokens - 1`` so that the last token is recomputed for
    its logits. A prompt therefore needs at least one token more than the
    returned prefix to get a nonzero hit.

    Args:
        managers: ``coordinator.single_type_managers``, in group order.
        scheduler_block_size: the scheduler's ``block_size`` (tokens).
        hash_block_size: the pool's ``hash_block_size`` (tokens).
        partial_hash_hits: the coordinator's ``enable_partial_hash_hits``.

    Returns:
        ``(hybrid, per_group)``: the shortest nonzero hybrid hit, and each
        group's shortest nonzero hit of its own (tokens).
    """
    alignment = hash_block_size if partial_hash_hits else scheduler_block_size
    per_group = []
    for m in managers:
        fine = partial_hash_hits and getattr(m, "supports_fine_grained_hash_lookup", False)
        # The manager's block_size is its spec's times the decode-context-parallel ranks.
        per_group.append(int(hash_block_size if fine else m.block_size))
    return math.lcm(alignment, *per_group), tuple(per_group)


class AdmissionBlockPool(BlockPool):
    """vLLM's block pool, counting evictions per KV cache group.

    Only ``get_new_blocks`` evictions count (a free cached block handed out
    again loses its hash); hashes dropped for other reasons do not.
    """

    # Set by _init_admission (hooks.install re-types vLLM's pool, then calls it).
    admission_evictions: list[int]
    _admission_allocating: bool
    _admission: AdmissionControl
    _admission_group: int = -1

    def _init_admission(self, num_groups: int, control: AdmissionControl, watch_group: int) -> None:
        self.admission_evictions = [0] * num_groups
        self._admission_allocating = False
        self._admission = control
        self._admission_group = watch_group

    def cache_full_blocks(self, request: Any, blocks: list[KVCacheBlock], num_cached_blocks: int,
                          num_full_blocks: int, block_size: int, kv_cache_group_id: int,
                          block_mask: list[bool] | None = None) -> None:
        ctl = self._admission
        keyed = ctl.wants_keys() and num_full_blocks > num_cached_blocks
        if keyed:
            before = [b.block_hash for b in blocks[num_cached_blocks:num_full_blocks]]
        super().cache_full_blocks(request, blocks, num_cached_blocks, num_full_blocks, block_size,
                                  kv_cache_group_id, block_mask)
        if keyed:
            # Report the blocks that got a hash here (not null, not masked out).
            new = [b for b, old in zip(blocks[num_cached_blocks:num_full_blocks], before, strict=True)
                   if b.block_hash is not None and b.block_hash != old]
            if new:
                ctl.on_cache(request, kv_cache_group_id, new)
        if kv_cache_group_id == self._admission_group and num_full_blocks > num_cached_blocks:
            # The first state group: record the states that just got a hash.
            ctl.observe_cached(ctl.track(request), blocks, num_cached_blocks, num_full_blocks)

    def cache_partial_block(self, request: Any, block: KVCacheBlock, num_tokens: int,
                            kv_cache_group_id: int, block_size: int,
                            replace_existing_hashes: bool = False) -> Any:
        before = block.block_hash
        key = super().cache_partial_block(request, block, num_tokens, kv_cache_group_id,
                                          block_size, replace_existing_hashes)
        if block.block_hash is not None and block.block_hash != before \
                and self._admission.wants_keys():
            # A first key (a further one leaves the policy's key as it is).
            self._admission.on_cache(request, kv_cache_group_id, [block])
        return key

    def move_block_hashes(self, src_block: KVCacheBlock, dst_block: KVCacheBlock) -> None:
        super().move_block_hashes(src_block, dst_block)
        if dst_block.block_hash is not None and self._admission.wants_keys():
            self._admission.on_keys_moved(dst_block)

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        super().touch(blocks)
        self._admission.on_hit(blocks)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        self._admission_allocating = True
        try:
            return super().get_new_blocks(num_blocks)
        finally:
            self._admission_allocating = False

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        if self._admission_allocating:
            key = block.block_hash
            if key is not None:
                self.admission_evictions[get_group_id(key)] += 1
        return super()._maybe_evict_cached_block(block)

    def drop_hash(self, block: KVCacheBlock) -> None:
        """Remove a block's hashes (it stays where it is) and, if it is free,
        move it to the head of the free queue, where vLLM keeps uncached blocks."""
        BlockPool._maybe_evict_cached_block(self, block)
        self._admission.on_hash_dropped(block)
        if block.ref_cnt == 0 and not block.is_null:
            self.free_block_queue.remove(block)
            self.free_block_queue.prepend_n([block])

    def reset_prefix_cache(self) -> bool:
        ok = super().reset_prefix_cache()
        if ok and isinstance(self.free_block_queue, PolicyFreeBlockQueue):
            self.free_block_queue.forget_hashes()
        return ok


class PolicyMambaManager(MambaManager):
    """A recurrent-state (Mamba / GDN) group whose states are cached where the
    admission policy says (every policy but ``vllm``, which keeps ``MambaManager``)."""

    #: Set by hooks.use_policy_managers when it re-types vLLM's manager.
    _admission: AdmissionControl

    def cache_blocks(self, request: Any, num_tokens: int, retention_interval: int | None = None,
                     *, replay_boundaries: Sequence[int]) -> None:
        rid = request.request_id
        first = self.num_cached_block.get(rid, 0)
        last = num_tokens // self.block_size
        if last <= first:
            # No full block to decide about; vLLM's own path may still key the
            # state at the prompt's unit end (_cache_partial_tail_block).
            super().cache_blocks(request, num_tokens, 0, replay_boundaries=())
            return
        ctl = self._admission
        track = ctl.track(request)
        blocks = self.req_to_blocks[rid]
        admitted, tentative, host = ctl.decide(track, first, last, blocks)
        # vLLM's sparse-retention mask (retention_interval=0) keeps exactly the
        # "reachable boundaries"; request.shared_prefix_boundary is added to
        # them by vLLM and is either 0 or the admitted junction here. A state for
        # the host tier only is cached too (that is what hands it to the connector),
        # then dropped.
        super().cache_blocks(request, num_tokens, 0,
                             replay_boundaries=[*admitted, *tentative, *host])
        if tentative:
            ctl.supersede(track, self.kv_cache_group_id, tentative, blocks,
                          self.block_pool.drop_hash)
        if host:
            ctl.hand_off_only(track, self.kv_cache_group_id, host, blocks,
                              self.block_pool.drop_hash)

    def supersede_ahead(self, request: Any) -> None:
        """Async scheduling: drop the request's previous tentative state when a step
        in flight computes the next one (see :meth:`AdmissionControl.supersede_ahead`)."""
        blocks = self.req_to_blocks.get(request.request_id)
        if blocks:
            self._admission.supersede_ahead(
                self._admission.track(request), self.kv_cache_group_id, request.num_tokens,
                request.num_computed_tokens, blocks, self.block_pool.drop_hash)

    def _cache_partial_tail_block(self, request: Any, num_tokens: int,
                                  retention_interval: int | None) -> Any:
        # vLLM keys the state at the prompt's unit end here. With a hash block
        # finer than the block that position is a checkpoint of its own (inside a block),
        # kept where the policy keeps prompt ends; at a block boundary it is the
        # prompt-end state, which the policy has just decided about in cache_blocks.
        ctl = self._admission
        track = ctl.track(request)
        if num_tokens != track.adm.state_sub_block_end or not track.adm.keeps_prompt_unit_end():
            return None
        key = super()._cache_partial_tail_block(request, num_tokens, retention_interval)
        if key is not None and self.kv_cache_group_id == ctl.first_state:
            ctl.observe_sub_block_state(track)
        return key


class PolicyAttentionManager(FullAttentionManager):
    """A full-attention group that keys a prompt's unit end (a hash block finer
    than the block) only where the admission policy keeps the state there (every
    policy but ``vllm``, which keeps ``FullAttentionManager``): without that state a
    hit at the unit end cannot happen, and the key would only keep the block cached."""

    #: Set by hooks.use_policy_managers when it re-types vLLM's manager.
    _admission: AdmissionControl

    def _cache_partial_tail_block(self, request: Any, num_tokens: int) -> None:
        if self._admission.track(request).adm.keeps_prompt_unit_end():
            super()._cache_partial_tail_block(request, num_tokens)


class AdmissionCoordinator(HybridKVCacheCoordinator):
    """vLLM's hybrid coordinator; time-stamps (and values) the blocks a request frees."""

    # Set by hooks.install when it re-types vLLM's coordinator.
    _admission: AdmissionControl
    _admission_queue: PolicyFreeBlockQueue

    def free(self, request_id: str) -> None:
        queue = self._admission_queue
        queue.open_free_batch(request_id)
        try:
            super().free(request_id)
        finally:
            queue.close_free_batch()

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        queue = self._admission_queue
        queue.open_free_batch(request_id)
        try:
            super().remove_skipped_blocks(request_id, processed_computed_tokens,
                                          num_prompt_tokens)
        finally:
            queue.close_free_batch()

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        blocks = super().pop_blocks_for_free(request_id)
        self._admission.stage_values(self._admission_queue, request_id, blocks)
        return blocks
