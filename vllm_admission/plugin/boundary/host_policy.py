"""The project's eviction policies as vLLM host policies (the OffloadingConnector's host tier).

vLLM 0.32's ``CPUOffloadingManager`` (``v1/kv_offload/cpu/manager.py``) asks a
``CachePolicy`` (``v1/kv_offload/cpu/policies/base.py``) which host chunks to evict, and
loads one out of tree by class name: ``eviction_policy`` names the class,
``cache_policy_module_path`` the module (``CachePolicyFactory.get_cache_policy_cls``).
This module answers every host-capable registered eviction policy by its registry name::

    "kv_connector_extra_config": {"cpu_bytes_to_use": ..., "eviction_policy": "s3fifo",
        "cache_policy_module_path": "vllm_admission.plugin.boundary.host_policy"}

``getattr(module, "s3fifo")`` builds (once) a :class:`AdmissionHostPolicy` subclass whose
decisions are made by the core's
:class:`~vllm_admission.core.cache.host.HostEviction`, the object the simulator's host
tier runs. This class only keeps vLLM's ``ChunkStatus`` objects and the pins (a chunk
being written or read has a nonzero ``ref_cnt`` and is not evictable; it is protected
for the call, as vLLM's ``lru`` skips it). ``lru`` and ``arc`` are vLLM's own names and
are resolved by vLLM before this module is asked.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar

from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus, order_request_keys

from vllm_admission.core.cache.host import HostPolicy, check_host_tier, make_host_policy

__all__ = ["AdmissionHostPolicy", "host_policy_class"]


class AdmissionHostPolicy(CachePolicy):
    """A vLLM ``CachePolicy`` run by a registered eviction policy (:attr:`eviction`).

    Args:
        cache_capacity: host chunks (vLLM passes the tier's ``num_chunks``).
    """

    #: The registered eviction policy's name (set on each generated subclass).
    eviction: ClassVar[str]

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.chunks: dict[OffloadKey, ChunkStatus] = {}
        self._pinned: set[OffloadKey] = set()
        self.core: HostPolicy = make_host_policy(self.eviction)

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self.chunks.get(key)

    def insert(self, key: OffloadKey, chunk: ChunkStatus,
               req_context: ReqContext | None = None) -> None:
        # vLLM 0.33 passes the storing request's context too; the position is not needed.
        self.chunks[key] = chunk
        if chunk.ref_cnt != 0:
            self._pinned.add(key)
        self.core.insert(key)

    def remove(self, key: OffloadKey) -> None:
        del self.chunks[key]
        self._pinned.discard(key)
        self.core.discard(key)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        """Not called by vLLM 0.32's connector; use comes at request finish only."""

    def on_store_miss(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        """A miss is not a use (the chunk is inserted next)."""

    def on_request_finished(self, key_groups: Sequence[Sequence[OffloadKey]],
                            insertion_only_keys: set[OffloadKey],
                            reused_keys: set[OffloadKey], req_context: ReqContext) -> None:
        self.core.on_request_finished(order_request_keys(key_groups, req_context), reused_keys)

    def evict(self, n: int, protected: set[OffloadKey]
              ) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        victims = self.core.evict(n, protected | self._pinned)
        if victims is None:
            return None
        return [(key, self.chunks.pop(key)) for key in victims]

    def clear(self) -> None:
        self.chunks.clear()
        self._pinned.clear()
        self.core = make_host_policy(self.eviction)

    def mark_evictable(self, key: OffloadKey) -> None:
        self._pinned.discard(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._pinned.add(key)


_CLASSES: dict[str, type[AdmissionHostPolicy]] = {}


def host_policy_class(name: str) -> type[AdmissionHostPolicy]:
    """The ``CachePolicy`` class for the registered eviction policy ``name``.

    Raises:
        UserError: ``name`` is not a host policy (``check_host_tier`` says why).
    """
    cls = _CLASSES.get(name)
    if cls is None:
        check_host_tier(name)
        cls = type(f"AdmissionHostPolicy_{name}", (AdmissionHostPolicy,), {"eviction": name})
        _CLASSES[name] = cls
    return cls


def __getattr__(name: str):
    # vLLM's CachePolicyFactory resolves ``eviction_policy`` with getattr on this module.
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        return host_policy_class(name)
    except Exception as exc:
        raise AttributeError(f"{__name__} has no host policy {name!r}: {exc}") from None
