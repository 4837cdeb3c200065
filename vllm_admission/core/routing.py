"""Routing policies for a fleet of replicas: which replica serves a request.

A prefix-aware router sends a request where its prompt is cached. For a hybrid model the
attention-KV overlap a replica holds is not the hit it gives: a recurrent state is reused
only where one was saved, so a replica with 30 KV blocks of a prompt and no state past
block 4 gives a 4-block hit, and one with 12 blocks and a state at block 12 gives 12. The
routers here see, per replica, both numbers (:class:`ReplicaView`: the attention-KV hit and
the hybrid hit, which the replica's KV cache events predict exactly, and the blocks of its
requests in flight) and choose one:

* ``round_robin``: in turn;
* ``least_loaded``: the fewest blocks in flight;
* ``kv_prefix``: what prefix-aware routers do today, Dynamo's KV router cost
  (``overlap_weight`` x blocks to prefill + blocks in flight, the lowest wins; NVIDIA Dynamo,
  "Router Design": potential prefill blocks from the KV overlap, potential active blocks)
  with the attention-KV hit as the overlap;
* ``hybrid``: the same cost with the hybrid hit as the overlap.

One registry, the same objects in the fleet simulator (``sim/fleet.py``) and in a real
router; another package registers its own in the entry-point group :data:`ENTRY_POINT_GROUP`,
as it does cache policies. Pure Python.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from vllm_admission.core.registry import PolicyClass, PolicyRegistry

__all__ = ["ENTRY_POINT_GROUP", "ROUTERS", "ReplicaView", "RouteRequest", "Router", "get_router",
           "register_router"]

#: Where other packages declare routing policies
#: (``[project.entry-points."vllm_admission.routing_policies"]``: ``name = "module:Class"``).
ENTRY_POINT_GROUP = "vllm_admission.routing_policies"


@dataclass(frozen=True)
class RouteRequest:
    """The request being routed.

    Attributes:
        index: its number in arrival order (0-based).
        prompt_len: prompt tokens.
        output_len: tokens to generate.
        block_size: tokens per KV cache block of the replicas.
    """

    index: int
    prompt_len: int
    output_len: int
    block_size: int

    @property
    def blocks(self) -> int:
        """KV blocks the request holds while it runs (prompt and output)."""
        return math.ceil((self.prompt_len + self.output_len) / self.block_size)


@dataclass(frozen=True)
class ReplicaView:
    """What a router knows of one replica when a request arrives.

    Attributes:
        index: the replica's number (0-based).
        kv_hit: tokens of the prompt whose attention-KV blocks the replica holds (the
            longest such prefix, at most ``prompt_len - 1``).
        hybrid_hit: the prefix hit the replica would give: the longest prefix within
            ``kv_hit`` with a saved recurrent state at its end, tokens.
        active_blocks: KV blocks of the requests routed to it and not finished.
        queued_s: seconds of prefill queued ahead of a request sent there now.
    """

    index: int
    kv_hit: int
    hybrid_hit: int
    active_blocks: int
    queued_s: float = 0.0


class Router(PolicyClass, abc.ABC):
    """A routing policy. Subclasses set ``name`` and ``summary`` and implement
    :meth:`choose`; one instance routes one fleet's requests in arrival order."""

    OWN_DECLARATIONS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **options: Any) -> None:
        if options:
            raise TypeError(f"routing policy {self.name!r} takes no options, got {sorted(options)}")

    @abc.abstractmethod
    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> int:
        """The index of the replica that serves ``request`` (one of ``replicas``)."""


ROUTERS: PolicyRegistry[Router] = PolicyRegistry("routing", Router, ENTRY_POINT_GROUP)


def register_router(cls: type[Router]) -> type[Router]:
    """Add a routing policy class to :data:`ROUTERS` (a class decorator)."""
    return ROUTERS.register(cls)


def get_router(name: str, **options: Any) -> Router:
    """A fresh routing policy ``name`` built with ``options``.

    Raises:
        UnknownPolicyError: an unknown name (the message lists the valid ones).
        TypeError: options the policy does not take.
    """
    return ROUTERS.policy_class(name)(**options)


class RoundRobin(Router):
    """Each replica in turn."""

    name = "round_robin"
    summary = "each replica in turn"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> int:
        choice = replicas[self._next % len(replicas)].index
        self._next += 1
        return choice


class LeastLoaded(Router):
    """The replica with the fewest KV blocks in flight (the lowest index among equals)."""

    name = "least_loaded"
    summary = "the fewest KV blocks in flight"

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> int:
        return min(replicas, key=lambda r: (r.active_blocks, r.index)).index


class KVPrefix(Router):
    """Dynamo's KV router cost with the attention-KV overlap: ``overlap_weight`` x the
    blocks left to prefill plus the blocks in flight once the request joins, the lowest
    cost wins (the lowest index among equals; Dynamo's temperature 0). Source: NVIDIA
    Dynamo, "Router Design" (potential prefill blocks = (input tokens - overlap blocks x
    block size) / block size; potential active blocks) and the router guide's
    ``--kv-overlap-score-weight`` (default 1).

    Args:
        overlap_weight: the weight of the prefill blocks against the blocks in flight.
    """

    name = "kv_prefix"
    summary = "Dynamo's KV router cost on the attention-KV overlap (blind to states)"

    def __init__(self, overlap_weight: float = 1.0) -> None:
        if not (math.isfinite(overlap_weight) and overlap_weight >= 0):
            raise ValueError(f"overlap_weight must be a finite number >= 0, got {overlap_weight!r}")
        self.overlap_weight = overlap_weight

    def overlap(self, replica: ReplicaView) -> int:
        """The prefix tokens the cost treats as already computed on ``replica``."""
        return replica.kv_hit

    def cost(self, request: RouteRequest, replica: ReplicaView) -> float:
        """The cost of sending ``request`` to ``replica``, in blocks."""
        prefill = (request.prompt_len - self.overlap(replica)) / request.block_size
        return self.overlap_weight * prefill + replica.active_blocks + request.blocks

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> int:
        return min(replicas, key=lambda r: (self.cost(request, r), r.index)).index


class HybridPrefix(KVPrefix):
    """:class:`KVPrefix`'s cost with the hybrid hit as the overlap: what the replica would
    really reuse (attention KV and a saved state at its end)."""

    name = "hybrid"
    summary = "Dynamo's cost on the hybrid hit (KV blocks and a saved state at their end)"

    def overlap(self, replica: ReplicaView) -> int:
        return replica.hybrid_hit


ROUTERS.register_all(RoundRobin, LeastLoaded, KVPrefix, HybridPrefix)
