"""What each replica of a fleet caches, from its KV cache events: :class:`FleetIndex`.

vLLM publishes each engine's KV cache changes as numbered batches of events
(``--kv-events-config``; ``vllm/distributed/kv_events.py``): ``BlockStored`` and
``BlockRemoved`` carry block hashes with their KV cache group (``group_idx``),
``AllBlocksCleared`` empties the cache. Under the plugin a state group's block gets a hash
only where the admission policy keeps the state, so the events describe a replica's hybrid
cache exactly, and the index answers, for a prompt's block hashes, each replica's
attention-KV hit and its hybrid hit: the longest prefix of whole blocks, at most
``prompt_len - 1`` tokens, whose blocks every attention group holds, and within it the
longest one whose last block every state group holds (vLLM's
``HybridKVCacheCoordinator.find_longest_cache_hit``).

A hash is counted, not just noted: vLLM can cache two blocks under one hash (two requests
computing the same block at once) and says ``BlockStored`` for each and ``BlockRemoved``
when either goes, so a hash is held while its count is above zero.

Batches arrive with a sequence number per publisher. The index applies them in order: a
batch past a gap is held back and :meth:`FleetIndex.apply` returns the first missing number,
which the subscriber asks vLLM's replay socket for (``ZmqEventPublisher``: a ROUTER socket
that resends its buffered batches from a number on); a batch already applied is ignored; a
batch numbered 0 after others is a restarted replica, whose cache starts empty.

Events are read by their class name and attributes (``block_hashes``, ``group_idx``), so the
index takes vLLM's decoded ``msgspec`` structs and needs no vLLM import. Whole blocks only: a
hash block size below the block size (vLLM's ``prefix_match_unit``) is not modelled here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_admission.core.layout import ATTENTION, STATE

__all__ = ["FleetIndex", "ReplicaCache"]


@dataclass
class ReplicaCache:
    """The blocks one replica holds, per KV cache group, as its events say.

    Attributes:
        held: per KV cache group index, how many cached blocks hold each hash.
        next_seq: the sequence number of the next batch to apply (0 before any).
        pending: batches received past a gap, by sequence number, until the gap fills.
        restarts: how many times the replica was seen restarting.
    """

    held: dict[int, Counter[Any]] = field(default_factory=dict)
    next_seq: int = 0
    pending: dict[int, list[Any]] = field(default_factory=dict)
    restarts: int = 0

    def holds(self, group: int, block_hash: Any) -> bool:
        counts = self.held.get(group)
        return counts is not None and counts[block_hash] > 0

    def apply_events(self, events: Iterable[Any]) -> None:
        """Apply one batch's events in order."""
        for event in events:
            kind = type(event).__name__
            if kind == "AllBlocksCleared":
                self.held.clear()
                continue
            group = getattr(event, "group_idx", None) or 0
            counts = self.held.setdefault(group, Counter())
            if kind == "BlockStored":
                counts.update(event.block_hashes)
            elif kind == "BlockRemoved":
                counts.subtract(event.block_hashes)
                for h in event.block_hashes:
                    if counts[h] <= 0:
                        del counts[h]


class FleetIndex:
    """Every replica's cache, from its event stream (module docstring).

    Args:
        block_size: tokens per block of the replicas.
        group_kinds: each KV cache group's kind, ``"attention"`` or ``"state"``, in vLLM's
            group order (``kv_cache_config.kv_cache_groups``; other kinds such as a
            hidden-state group are left out of the hit).

    Raises:
        ValueError: a block size below 1, or no attention or no state group.
    """

    def __init__(self, block_size: int, group_kinds: Sequence[str]) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.attention = [g for g, k in enumerate(group_kinds) if k == ATTENTION]
        self.state = [g for g, k in enumerate(group_kinds) if k == STATE]
        if not self.attention or not self.state:
            raise ValueError(f"a hybrid model has attention and state groups, got {list(group_kinds)}")
        #: Per replica name, what it caches.
        self.replicas: dict[str, ReplicaCache] = {}

    def apply(self, replica: str, seq: int, events: Sequence[Any]) -> int | None:
        """Apply batch ``seq`` of ``replica``'s events, in sequence order.

        Returns:
            ``None`` when every batch up to the latest is applied; else the first missing
            sequence number (ask the replica's replay socket from there).
        """
        cache = self.replicas.setdefault(replica, ReplicaCache())
        if seq == 0 and cache.next_seq > 0:
            # A publisher numbers from 0 when it starts: the replica restarted, empty.
            self.replicas[replica] = cache = ReplicaCache(restarts=cache.restarts + 1)
        if seq < cache.next_seq:
            return None                       # applied already (a replayed duplicate)
        cache.pending[seq] = list(events)
        while cache.next_seq in cache.pending:
            cache.apply_events(cache.pending.pop(cache.next_seq))
            cache.next_seq += 1
        return cache.next_seq if cache.pending else None

    def forget(self, replica: str) -> None:
        """Drop a replica that left the fleet (a restart needs no call: see :meth:`apply`)."""
        self.replicas.pop(replica, None)

    def hits(self, replica: str, hashes: Sequence[Any], prompt_len: int) -> tuple[int, int]:
        """``(attention-KV hit, hybrid hit)`` in tokens of a prompt of ``prompt_len`` tokens
        whose full blocks hash to ``hashes`` (vLLM's block hashes, in order), on
        ``replica`` (0, 0 for a replica not heard from)."""
        cache = self.replicas.get(replica)
        if cache is None:
            return 0, 0
        B = self.block_size
        limit = min(len(hashes), (prompt_len - 1) // B)
        n = 0
        while n < limit and all(cache.holds(g, hashes[n]) for g in self.attention):
            n += 1
        for end in range(n, 0, -1):
            if all(cache.holds(g, hashes[end - 1]) for g in self.state):
                return n * B, end * B
        return n * B, 0
