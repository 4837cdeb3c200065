"""A fleet of replicas behind a router, replayed: :func:`simulate_fleet`.

Each replica is one :class:`~vllm_admission.core.cache.HybridPrefixCache` with its own
admission and eviction (``auto`` included: a controller per replica), built as
:func:`~vllm_admission.sim.simulator.simulate` builds its one cache. The requests arrive at
the trace's timestamps; for each, the router (:mod:`vllm_admission.core.routing`) sees every
replica's attention-KV hit and hybrid hit for the prompt (the cache's own lookup, what the
replica's KV cache events predict) and its blocks in flight, and picks one; that replica's
cache serves the request.

Load and time to first token come from the cost model: a replica prefills one request at a
time, first come first served, at ``prefill_flops_per_s`` (the FLOPs
:meth:`~vllm_admission.core.costs.ModelCosts.prefill_flops` counts for the tokens it
computes); a request's time to first token is its wait plus its own prefill. It then holds
its KV blocks (prompt and output) for ``decode_s_per_token`` seconds per output token, the
"blocks in flight" the load-aware routers weigh. Decode does not slow prefill (a stated
simplification: disaggregated or chunked prefill at low decode load).
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_admission.core.cache_inputs import CacheRequest
from vllm_admission.core.costs import ModelCosts
from vllm_admission.core.errors import UserError
from vllm_admission.core.routing import ReplicaView, Router, RouteRequest, get_router
from vllm_admission.core.traces import Trace
from vllm_admission.sim.simulation_settings import SimulationSettings
from vllm_admission.sim.simulator import PolicyRun, cache_requests, cached_prefill_flops, run_plan

__all__ = ["DEFAULT_DECODE_S_PER_TOKEN", "DEFAULT_PREFILL_FLOPS_PER_S", "FleetResult",
           "FleetSettings", "simulate_fleet"]

#: A replica's prefill throughput unless stated: 40 % of an H100 SXM's dense BF16 peak
#: (989 TFLOP/s, NVIDIA H100 datasheet), FLOPs per second.
DEFAULT_PREFILL_FLOPS_PER_S = 0.4 * 989e12
#: Seconds per output token a request holds its blocks for unless stated (50 tokens/s).
DEFAULT_DECODE_S_PER_TOKEN = 0.02


@dataclass(frozen=True)
class FleetSettings:
    """The fleet around the replicas :class:`SimulationSettings` describe one of.

    Attributes:
        replicas: how many (>= 1), each with the pool and policies of the run's settings.
        router: a routing policy name (:data:`~vllm_admission.core.routing.ROUTERS`).
        prefill_flops_per_s: one replica's prefill throughput, FLOPs per second (> 0).
        decode_s_per_token: seconds a request holds its blocks per output token (>= 0).
        arrival_scale: the trace's arrival times are multiplied by this (> 0; below 1
            packs the same requests into less time: more load).
        overlap_weight: for the routers that weigh a prefix overlap against the load
            (``kv_prefix``, ``hybrid``: Dynamo's ``--kv-overlap-score-weight``), the weight
            of the blocks left to prefill; ``None`` keeps the router's own (1).
    """

    replicas: int
    router: str
    prefill_flops_per_s: float = DEFAULT_PREFILL_FLOPS_PER_S
    decode_s_per_token: float = DEFAULT_DECODE_S_PER_TOKEN
    arrival_scale: float = 1.0
    overlap_weight: float | None = None

    def make_router(self) -> Router:
        """A fresh instance of :attr:`router` with its options.

        Raises:
            UnknownPolicyError: an unknown router; UserError: an overlap weight for a router
                that takes none, or one that is not a finite number >= 0.
        """
        if self.overlap_weight is None:
            return get_router(self.router)
        try:
            return get_router(self.router, overlap_weight=self.overlap_weight)
        except TypeError:
            raise UserError(f"routing policy {self.router!r} weighs no prefix overlap; "
                            f"an overlap weight applies to kv_prefix and hybrid") from None
        except ValueError as exc:
            raise UserError(str(exc)) from None

    def check(self) -> None:
        """Raises:
            UserError: a number out of range; UnknownPolicyError: an unknown router."""
        if not (isinstance(self.replicas, int) and self.replicas >= 1):
            raise UserError(f"a fleet needs at least 1 replica, got {self.replicas!r}")
        if not (math.isfinite(self.prefill_flops_per_s) and self.prefill_flops_per_s > 0):
            raise UserError(f"the prefill throughput must be > 0 FLOP/s, got {self.prefill_flops_per_s!r}")
        if not (math.isfinite(self.decode_s_per_token) and self.decode_s_per_token >= 0):
            raise UserError(f"the decode time per token must be >= 0 s, got {self.decode_s_per_token!r}")
        if not (math.isfinite(self.arrival_scale) and self.arrival_scale > 0):
            raise UserError(f"the arrival scale must be > 0, got {self.arrival_scale!r}")
        self.make_router()   # an unknown name or a refused option, before any replay


@dataclass
class FleetResult:
    """One fleet replay.

    Attributes:
        router, replicas: as given.
        admission, eviction: the pair each replica ran (``auto`` included).
        requests, skipped_requests: requests served, and those no replica's pool can hold.
        prompt_tokens, hit_tokens: summed over the fleet; ``token_hit_rate`` their ratio.
        per_replica: per replica, ``requests``, ``prompt_tokens``, ``hit_tokens`` and
            ``busy_s`` (seconds of prefill it ran).
        load_spread: the largest replica's prefill seconds over the mean (1: even).
        ttft_p50_s, ttft_p99_s: time to first token, seconds (wait plus own prefill).
        routed_kv_hit, routed_hybrid_hit: prompt tokens of the attention-KV hit and of the
            hybrid hit the chosen replicas offered, summed (the hybrid one is what they gave).
    """

    router: str
    replicas: int
    admission: str
    eviction: str
    requests: int = 0
    skipped_requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    per_replica: list[dict[str, float]] = field(default_factory=list)
    load_spread: float = 1.0
    ttft_p50_s: float = 0.0
    ttft_p99_s: float = 0.0
    routed_kv_hit: int = 0
    routed_hybrid_hit: int = 0

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_record(self) -> dict[str, Any]:
        """The record written to ``fleet.json``."""
        return {"router": self.router, "replicas": self.replicas, "admission": self.admission,
                "eviction": self.eviction, "requests": self.requests,
                "skipped_requests": self.skipped_requests, "prompt_tokens": self.prompt_tokens,
                "hit_tokens": self.hit_tokens, "token_hit_rate": self.token_hit_rate,
                "load_spread": self.load_spread, "ttft_p50_s": self.ttft_p50_s,
                "ttft_p99_s": self.ttft_p99_s, "routed_kv_hit": self.routed_kv_hit,
                "routed_hybrid_hit": self.routed_hybrid_hit, "per_replica": self.per_replica}


class _Replica:
    """One replica: its cache and what adapts its policies (a
    :class:`~vllm_admission.sim.simulator.PolicyRun`), its prefill queue and its counts."""

    def __init__(self, run: PolicyRun) -> None:
        self.run = run
        self.free_at = 0.0          # when its prefill queue empties, seconds
        self.busy_s = 0.0
        self.in_flight: list[tuple[float, int]] = []   # (end time, blocks)
        self.active_blocks = 0
        self.requests = self.prompt_tokens = self.hit_tokens = 0

    def retire(self, now: float) -> None:
        while self.in_flight and self.in_flight[0][0] <= now:
            self.active_blocks -= heapq.heappop(self.in_flight)[1]

    def serve(self, index: int, req: CacheRequest) -> int:
        out = self.run.cache.serve(req.hashes, req.prompt_len, req.output_len, index, float(index),
                                   req.units)
        self.run.observe(index, req, out)
        self.requests += 1
        self.prompt_tokens += req.prompt_len
        self.hit_tokens += out.hit_tokens
        return out.hit_tokens


def simulate_fleet(trace: Trace, costs: ModelCosts, settings: SimulationSettings,
                   fleet: FleetSettings, *, requests: Sequence[CacheRequest] | None = None,
                   ) -> FleetResult:
    """Replay ``trace`` through ``fleet.replicas`` replicas of ``settings``'s cache behind
    ``fleet.router`` (module docstring).

    Args:
        trace: the requests, in arrival order (``arrival_s``; a trace without timestamps
            arrives one request a second).
        costs: the model's cost model (hybrid).
        settings: one replica's pool and policies, as :func:`simulate` takes them.
        fleet: the fleet.
        requests: the trace's cache requests at the replicas' block size (built when
            ``None``).

    Raises:
        UserError: a fleet setting out of range, what
            :func:`~vllm_admission.sim.simulator.simulate` refuses, or an eviction policy
            that needs the future.
        UnknownPolicyError: an unknown policy or router name.
    """
    fleet.check()
    pol = settings.policy
    plan, geo, layout = run_plan(costs, settings)
    if plan.eviction_cls.needs_future:
        raise UserError(f"eviction {pol.eviction!r} needs the future of each replica's "
                        f"requests, which routing decides: not in a fleet")
    if requests is None:
        requests = cache_requests(trace, geo.block_size, settings.outputs, settings.hash_block_size)
    flops = cached_prefill_flops(costs)
    replicas = [_Replica(PolicyRun(plan, settings, layout, flops)) for _ in range(fleet.replicas)]
    router = fleet.make_router()
    result = FleetResult(router=fleet.router, replicas=fleet.replicas, admission=pol.admission,
                         eviction=pol.eviction)
    ttfts: list[float] = []
    B = geo.block_size
    for index, (req, treq) in enumerate(zip(requests, trace.requests, strict=True)):
        now = (treq.arrival_s if treq.arrival_s is not None else float(index)) * fleet.arrival_scale
        if not replicas[0].run.cache.fits(req.prompt_len, req.output_len):
            result.skipped_requests += 1
            continue
        route = RouteRequest(index=index, prompt_len=req.prompt_len, output_len=req.output_len,
                             block_size=B)
        views = []
        for i, rep in enumerate(replicas):
            rep.retire(now)
            probe = rep.run.cache.lookup(req.hashes, req.prompt_len, req.units)
            views.append(ReplicaView(index=i, kv_hit=probe.kv_hit, hybrid_hit=probe.state_hit,
                                     active_blocks=rep.active_blocks,
                                     queued_s=max(0.0, rep.free_at - now)))
        chosen = router.choose(route, views)
        rep = replicas[chosen]
        hit = rep.serve(index, req)
        result.routed_kv_hit += views[chosen].kv_hit
        result.routed_hybrid_hit += views[chosen].hybrid_hit
        prefill_s = flops(req.prompt_len, hit) / fleet.prefill_flops_per_s
        start = max(now, rep.free_at)
        rep.free_at = start + prefill_s
        rep.busy_s += prefill_s
        ttfts.append(rep.free_at - now)
        heapq.heappush(rep.in_flight, (rep.free_at + req.output_len * fleet.decode_s_per_token,
                                       route.blocks))
        rep.active_blocks += route.blocks
        result.requests += 1
        result.prompt_tokens += req.prompt_len
        result.hit_tokens += hit
    result.per_replica = [{"requests": r.requests, "prompt_tokens": r.prompt_tokens,
                           "hit_tokens": r.hit_tokens, "busy_s": r.busy_s} for r in replicas]
    busy = [r.busy_s for r in replicas]
    mean = sum(busy) / len(busy)
    result.load_spread = max(busy) / mean if mean > 0 else 1.0
    if ttfts:
        result.ttft_p50_s = statistics.median(ttfts)
        result.ttft_p99_s = (statistics.quantiles(ttfts, n=100, method="inclusive")[98]
                             if len(ttfts) > 1 else ttfts[0])
    return result
