"""Thin subclasses of vLLM 0.32's KV cache classes that call :class:`AdmissionControl`.

vLLM builds its KV cache objects inside ``KVCacheManager.__init__``
(``vllm/v1/core/kv_cache_manager.py``: ``get_kv_cache_coordinator`` picks the
coordinator, which builds the ``BlockPool`` and one manager per KV cache group).
:func:`install` turns those live, still empty objects into the subclasses below
(by re-typing them, so every field vLLM set up stays as it is):

* :class:`AdmissionCoordinator` (``HybridKVCacheCoordinator``,
  ``vllm/v1/core/kv_cache_coordinator.py``): ``free``,
  ``remove_skipped_blocks`` and ``pop_blocks_for_free`` give the blocks a
  request returns to the pool their FLOP efficiency (``flop`` eviction only);
* :class:`AdmissionMambaManager` (``MambaManager``,
  ``vllm/v1/core/single_type_kv_cache_manager.py``): ``cache_blocks`` gives a
  recurrent state a block hash only where the admission policy admits it (it
  hands vLLM's own mask code those positions as the "reachable boundaries",
  with ``retention_interval=0``); ``_cache_partial_tail_block`` is switched off
  for non-stock policies, because with one hash per block it can only
  re-register the prompt-end state the policy just decided about;
* :class:`AdmissionBlockPool` (``BlockPool``, ``vllm/v1/core/block_pool.py``):
  counts evictions per KV cache group in ``get_new_blocks`` and re-orders the
  FLOP-aware free queue after ``reset_prefix_cache``.

With ``flop`` eviction ``block_pool.free_block_queue`` is replaced by
:class:`~vllm_admission.plugin.free_queue.FlopFreeBlockQueue`; with ``lru``
vLLM's ``FreeKVCacheBlockQueue`` stays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator
from vllm.v1.core.kv_cache_utils import KVCacheBlock, get_group_id, make_block_hash_with_group_id
from vllm.v1.core.single_type_kv_cache_manager import MambaManager

from vllm_admission.plugin.control import AdmissionControl
from vllm_admission.plugin.free_queue import FlopFreeBlockQueue

__all__ = ["AdmissionBlockPool", "AdmissionCoordinator", "AdmissionMambaManager", "install"]


class AdmissionBlockPool(BlockPool):
    """vLLM's block pool, counting evictions per KV cache group.

    Only ``get_new_blocks`` evictions count (a free cached block handed out
    again loses its hash); hashes dropped for other reasons do not.
    """

    admission_evictions: list[int]
    _admission_allocating: bool

    def _init_admission(self, num_groups: int) -> None:
        self.admission_evictions = [0] * num_groups
        self._admission_allocating = False

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
        if block.ref_cnt == 0 and not block.is_null:
            self.free_block_queue.remove(block)
            self.free_block_queue.prepend_n([block])

    def reset_prefix_cache(self) -> bool:
        ok = super().reset_prefix_cache()
        if ok and isinstance(self.free_block_queue, FlopFreeBlockQueue):
            self.free_block_queue.forget_hashes()
        return ok


class AdmissionMambaManager(MambaManager):
    """A recurrent-state (Mamba / GDN) group whose states are cached by policy."""

    _admission: AdmissionControl | None = None

    def cache_blocks(self, request: Any, num_tokens: int, retention_interval: int | None = None,
                     *, replay_boundaries: Sequence[int]) -> None:
        ctl = self._admission
        if ctl is None:
            return super().cache_blocks(request, num_tokens, retention_interval,
                                        replay_boundaries=replay_boundaries)
        rid = request.request_id
        first = self.num_cached_block.get(rid, 0)
        last = num_tokens // self.block_size
        if ctl.stock:
            super().cache_blocks(request, num_tokens, retention_interval,
                                 replay_boundaries=replay_boundaries)
            if last > first:
                ctl.observe_cached(ctl.track(request), self.kv_cache_group_id, first, last,
                                   self.req_to_blocks[rid])
            return
        if last <= first:
            return
        track = ctl.track(request)
        blocks = self.req_to_blocks[rid]
        admitted, tentative = ctl.decide(track, first, last, blocks)
        # vLLM's sparse-retention mask (retention_interval=0) keeps exactly the
        # "reachable boundaries"; request.shared_prefix_boundary is added to
        # them by vLLM and is either 0 or the admitted junction here.
        super().cache_blocks(request, num_tokens, 0,
                             replay_boundaries=[*admitted, *tentative])
        if admitted or tentative:
            ctl.after_cache(track, self.kv_cache_group_id, admitted, tentative, blocks,
                            self.block_pool.drop_hash)

    def _cache_partial_tail_block(self, request: Any, num_tokens: int,
                                  retention_interval: int | None) -> Any:
        ctl = self._admission
        if ctl is not None and not ctl.stock:
            return None
        return super()._cache_partial_tail_block(request, num_tokens, retention_interval)


class AdmissionCoordinator(HybridKVCacheCoordinator):
    """vLLM's hybrid coordinator; values freed blocks for ``flop`` eviction."""

    _admission: AdmissionControl | None = None
    _admission_queue: FlopFreeBlockQueue | None = None

    def free(self, request_id: str) -> None:
        queue = self._admission_queue
        if queue is None:
            return super().free(request_id)
        with self._admission.free_scope(queue, request_id):
            super().free(request_id)

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        queue = self._admission_queue
        if queue is None:
            return super().remove_skipped_blocks(request_id, processed_computed_tokens,
                                                 num_prompt_tokens)
        with self._admission.free_scope(queue, request_id):
            super().remove_skipped_blocks(request_id, processed_computed_tokens,
                                          num_prompt_tokens)

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        blocks = super().pop_blocks_for_free(request_id)
        queue = self._admission_queue
        if queue is not None:
            self._admission.stage_values(queue, request_id, blocks)
        return blocks


def _retype(obj: Any, base: type, cls: type) -> None:
    if type(obj) is not base:
        raise TypeError(f"vllm_admission expected vLLM's {base.__name__}, found "
                        f"{type(obj).__module__}.{type(obj).__name__}")
    obj.__class__ = cls


def install(kv_cache_manager: Any, control: AdmissionControl) -> AdmissionCoordinator:
    """Attach ``control`` to a freshly built ``KVCacheManager`` (no request seen yet).

    Re-types the hybrid coordinator, its block pool and its Mamba managers
    into the subclasses above and, for ``flop`` eviction, swaps the pool's
    free queue for a :class:`FlopFreeBlockQueue` holding the same blocks in
    the same order.

    Raises:
        TypeError: the objects are not vLLM's own classes (another plugin
            replaced them).
    """
    coordinator = kv_cache_manager.coordinator
    _retype(coordinator, HybridKVCacheCoordinator, AdmissionCoordinator)
    pool = coordinator.block_pool
    _retype(pool, BlockPool, AdmissionBlockPool)
    pool._init_admission(len(coordinator.single_type_managers))
    for manager in coordinator.single_type_managers:
        if isinstance(manager, MambaManager):
            _retype(manager, MambaManager, AdmissionMambaManager)
            manager._admission = control
    coordinator._admission = control
    if control.flop is not None:
        queue = FlopFreeBlockQueue(pool.free_block_queue.get_all_free_blocks(), control.flop,
                                   clock=control.clock)
        pool.free_block_queue = queue
        coordinator._admission_queue = queue

    def is_cached_state(block_hash: Any, group: int) -> bool:
        return pool.cached_block_hash_to_block.get_one_block(
            make_block_hash_with_group_id(block_hash, group)) is not None

    control.is_cached_state = is_cached_state
    return coordinator
