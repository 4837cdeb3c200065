"""Eviction policies: the order in which free cached blocks give up their hashes.

One module per policy family, the base class with its hooks, and the registry:

=================  ===================================================================
module             contents
=================  ===================================================================
``base``           :class:`EvictionPolicy`: the hooks the cache calls, the attributes
                   derived from them, the few declarations (read its docstring first)
``fifo``           the O(1) block queue that ``lru`` and ``reuse`` keep
``lru``            :class:`LRUEviction` (``lru``): vLLM's own order, block for block
``flop``           :class:`FlopEviction` (``flop``): Marconi's utility, recency +
                   alpha x FLOP efficiency, min-max normalised (Marconi section 4.2)
``frequency``      :class:`LFUEviction` (``lfu``): fewest prefix hits since cached
                   first, least recently freed among equals (a baseline)
``reuse``          :class:`ReuseEviction` (``reuse``): LRU in which blocks whose hash
                   was used again may grow ``r`` times older, ``r`` learned by hash
``conversation``   :class:`ConversationEviction` (``conversation``): ``reuse``, and the
                   blocks of a prompt that continues an earlier prompt (found from
                   the chained hashes) count as reused from the start
``s3fifo``         :class:`S3FifoEviction` (``s3fifo``): S3-FIFO (SOSP 2023): new
                   blocks in a small FIFO, blocks hit there or remembered by a ghost
                   hash in a main FIFO with second chances
``mix``            :class:`ExpertMixEviction` (``mix``): LeCaR / Cacheus-style expert
                   mix: each victim from one of several orders (``lru``, ``lfu``,
                   ``reuse``, ``s3fifo``), weighted down by regrets on ghost hashes
``learned``        :class:`LearnedEviction` (``learned``): free-order queues by the
                   reuse probability a LightGBM classifier trained online gives each
                   freed block, the head with the largest age over probability evicted
                   (after LRB, NSDI 2020); ``learning`` holds its features, labels and
                   training schedule
``history``        :class:`ReuseHistory` (what ``reuse`` learns, by hash)
``keeper``         :class:`HistoryKeeper` (keeps that history up to date around
                   another policy)
``belady``         :class:`BeladyEviction` (``belady``): offline reference, evicts the
                   block next needed farthest ahead; needs the future (simulator only)
``registry``       :data:`EVICTION_POLICIES`, :func:`engine_eviction_policies`,
                   :func:`get_eviction`, :func:`eviction_class`, :func:`stock_eviction`
=================  ===================================================================

A new policy is one subclass plus one :func:`register_eviction` entry, or, from
another package, one entry point in the group ``vllm_admission.eviction_policies``
(:data:`ENTRY_POINT_GROUP`); nothing outside the registries branches on a policy's
name, and every consumer asks the registry when it needs it.
"""

from vllm_admission.core.eviction.base import EvictionPolicy
from vllm_admission.core.eviction.belady import BeladyEviction
from vllm_admission.core.eviction.conversation import ConversationEviction
from vllm_admission.core.eviction.flop import FlopEviction
from vllm_admission.core.eviction.frequency import LFUEviction
from vllm_admission.core.eviction.history import ReuseHistory
from vllm_admission.core.eviction.keeper import HistoryKeeper
from vllm_admission.core.eviction.learned import LearnedEviction
from vllm_admission.core.eviction.lru import LRUEviction
from vllm_admission.core.eviction.mix import ExpertMixEviction
from vllm_admission.core.eviction.registry import (
    ENTRY_POINT_GROUP,
    EVICTION_POLICIES,
    engine_eviction_policies,
    eviction_class,
    get_eviction,
    load_entry_points,
    register_eviction,
    stock_eviction,
)
from vllm_admission.core.eviction.reuse import ReuseEviction
from vllm_admission.core.eviction.s3fifo import S3FifoEviction

__all__ = [
    "ENGINE_EVICTION_POLICIES",
    "ENTRY_POINT_GROUP",
    "EVICTION_POLICIES",
    "BeladyEviction",
    "ConversationEviction",
    "EvictionPolicy",
    "ExpertMixEviction",
    "FlopEviction",
    "HistoryKeeper",
    "LFUEviction",
    "LRUEviction",
    "LearnedEviction",
    "ReuseEviction",
    "ReuseHistory",
    "S3FifoEviction",
    "eviction_class",
    "engine_eviction_policies",
    "get_eviction",
    "load_entry_points",
    "register_eviction",
    "stock_eviction",
]


def __getattr__(name: str) -> tuple[str, ...]:
    # Read from the registry at each access: no copy goes stale when a policy registers.
    if name == "ENGINE_EVICTION_POLICIES":
        return engine_eviction_policies()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
