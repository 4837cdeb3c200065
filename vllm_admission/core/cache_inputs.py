"""The cache model's inputs (requests as the cache sees them, the setup that builds it),
and serving a sequence of requests.

:class:`CacheRequest` reduces a request to what the cache needs: its prompt's block
hashes, prompt length and output length. :class:`CacheSetup` holds what builds a
:class:`HybridPrefixCache` (the layout and the policy names). :func:`replay_requests`
serves requests one at a time through one cache: the loop the simulator runs over a
whole trace, the alpha tuner runs over a window, and the plugin runs (on recorded
requests) to tune alpha inside the engine. Also the Bélády oracle
(:class:`NextUseOracle`) and the infinite-capacity bound.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from vllm_admission.core.admission import get_admission
from vllm_admission.core.cache import HybridPrefixCache, RequestOutcome
from vllm_admission.core.counters import CacheCounters
from vllm_admission.core.eviction import get_eviction
from vllm_admission.core.layout import CacheLayout
from vllm_admission.core.traces.trace import capacity_bound

__all__ = ["CacheRequest", "CacheSetup", "NextUseOracle", "ReplayTotals", "infinite_capacity_bound",
           "replay_requests"]


class CacheRequest(NamedTuple):
    """One request as the cache sees it (lengths in tokens).

    ``units``: the prompt's keys per hash block when the pool's ``hash_block_size`` is
    below its block size, else ``None``.
    """

    hashes: Sequence[int]
    prompt_len: int
    output_len: int
    units: Sequence[Hashable] | None = None


@dataclass(frozen=True)
class CacheSetup:
    """Everything needed to build a :class:`HybridPrefixCache` again.

    Attributes:
        layout: the cache's configuration (:class:`~vllm_admission.core.layout.CacheLayout`).
        admission: admission policy name.
        eviction: eviction policy name.
        segment_flops: FLOPs of computing ``[start, end)`` with ``start`` cached.
    """

    layout: CacheLayout
    admission: str
    eviction: str
    segment_flops: Callable[[int, int], float] | None = field(default=None, compare=False)

    def build(self, *, alpha: float | None = None,
              next_use: Callable[[Hashable, float], float] | None = None,
              switchable: bool = False, track_values: bool = False) -> HybridPrefixCache:
        """A fresh, empty cache with this setup (``alpha`` for a tunable eviction policy;
        ``switchable``, ``track_values``: see :class:`HybridPrefixCache`)."""
        options = {"alpha": alpha} if alpha is not None else {}
        return HybridPrefixCache(
            self.layout,
            admission=get_admission(self.admission,
                                    retention_interval=self.layout.pool.retention_interval),
            eviction=get_eviction(self.eviction, **options), segment_flops=self.segment_flops,
            next_use=next_use, switchable=switchable, track_values=track_values)


class NextUseOracle:
    """Future knowledge for Bélády: when is a block hash next in a prompt?

    Args:
        requests: the whole request sequence, in replay order.

    ``oracle(h, r)`` returns the index of the first request after ``r`` whose
    prompt contains ``h``, or infinity.
    """

    def __init__(self, requests: Sequence[CacheRequest]) -> None:
        where: dict[Hashable, list[int]] = {}
        for r, req in enumerate(requests):
            for h in req.hashes:
                where.setdefault(h, []).append(r)
        self._where = where

    def __call__(self, block_hash: Hashable, r: float) -> float:
        uses = self._where.get(block_hash)
        if not uses:
            return float("inf")
        k = bisect.bisect_right(uses, r)
        return float(uses[k]) if k < len(uses) else float("inf")


def infinite_capacity_bound(requests: Sequence[CacheRequest], block_size: int) -> tuple[int, int]:
    """:func:`vllm_admission.core.traces.trace.capacity_bound` of cache requests.

    Returns:
        ``(hit_tokens, prompt_tokens)`` summed over the requests.
    """
    return capacity_bound(((r.hashes, r.prompt_len, r.output_len) for r in requests), block_size)


@dataclass(kw_only=True)
class ReplayTotals(CacheCounters):
    """Sums over a replay: the request-side :class:`CacheCounters` (``junctions``,
    ``state_checkpoints`` and ``evictions`` stay 0 here: the cache counts them, over its
    whole life) plus what only a replay knows.

    Attributes:
        skipped_requests: requests that could not fit the cache and did not run.
        flops_total: prefill FLOPs of the requests that ran, without any cache.
        flops_saved: the part of ``flops_total`` their hits saved.
    """

    skipped_requests: int = 0
    flops_total: float = 0.0
    flops_saved: float = 0.0

    def add(self, out: RequestOutcome, flops_total: float, flops_saved: float) -> None:
        self.count_request(out.prompt_tokens, out.hit_tokens, out.state_miss_tokens)
        self.prefill_steps += out.prefill_steps
        self.host_hit_tokens += out.host_hit_tokens
        self.flops_total += flops_total
        self.flops_saved += flops_saved


def replay_requests(cache: HybridPrefixCache, requests: Iterable[CacheRequest], *,
                    prefill_flops: Callable[[int, int], float],
                    first_index: int = 0,
                    on_outcome: Callable[[int, CacheRequest, RequestOutcome | None], None]
                    | None = None,
                    ) -> ReplayTotals:
    """Serve ``requests`` one at a time; requests that cannot fit are skipped.

    Args:
        cache: the cache to run them through (mutated).
        requests: the requests, in order (any iterable: consumed once).
        prefill_flops: ``f(end, start)``: FLOPs of prefilling ``[start, end)``.
        first_index: logical time of ``requests[0]`` (request numbering).
        on_outcome: called with ``(index, request, outcome)`` after each request;
            ``outcome`` is ``None`` for a skipped request.
    """
    totals = ReplayTotals()
    for k, req in enumerate(requests):
        r = first_index + k
        if not cache.fits(req.prompt_len, req.output_len):
            totals.skipped_requests += 1
            if on_outcome:
                on_outcome(r, req, None)
            continue
        out = cache.serve(req.hashes, req.prompt_len, req.output_len, r, float(r), req.units)
        full = prefill_flops(req.prompt_len, 0)
        totals.add(out, full, full - prefill_flops(req.prompt_len, out.hit_tokens))
        if on_outcome:
            on_outcome(r, req, out)
    return totals
