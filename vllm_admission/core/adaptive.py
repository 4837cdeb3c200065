"""``auto``: choose the admission and eviction policy online, by shadow replay.

No fixed policy pair wins everywhere (``docs/results.md``): which admission
serves a workload best depends on the model's state size and on the pressure
on the cache, and which eviction wins depends on the traffic. The
:class:`PolicyController` finds out while it serves, with no knowledge of the
future and no constant fitted to a trace:

* **the cache it watches** is a switchable
  :class:`~vllm_admission.core.cache.HybridPrefixCache`: in the simulator that
  cache *is* the run; in the vLLM plugin it is a twin of the engine's cache,
  fed the same requests (the simulator predicts the engine request for
  request, ``docs/fidelity.md``), and each switch is applied to the engine too;
* **windows**: at the start of each window the controller snapshots the cache
  (``HybridPrefixCache.clone``), then records the window's requests and the
  prefill FLOPs they saved live. A window holds about one pool's worth of
  traffic (the requests whose prompt and output tokens first fill the pool's
  blocks), between ``min_window`` and ``max_window`` requests: shorter windows
  cannot show what eviction keeps, longer ones react late;
* **candidates**: at the end of a window it replays the window from the
  snapshot under the neighbours of the live pair: the live admission with
  every other eviction, and the live eviction with every other admission
  (a coordinate search: ``(A - 1) + (E - 1)`` replays instead of
  ``A x E - 1``). The live pair's score is what it really saved from the
  same snapshot, so every score starts from the same warm cache;
* **score**: prefill FLOPs saved, the quantity time to first token pays for
  and the one Marconi's alpha tuner maximises (Marconi section 4.2); token
  hits would weigh a hit on a 100-token prefix like one on a 100-token tail
  of a 30,000-token prompt, which costs far more to recompute;
* **switch**: to the best candidate when it saved more than the live pair by
  the relative margin ``min_gain`` (1 % by default: smaller differences are
  within what the choice of window moves). Switching is safe mid-run: a new
  admission policy decides from the next request on, a new eviction policy
  receives the free cached blocks with the times and values they were freed
  with (:meth:`HybridPrefixCache.switch
  <vllm_admission.core.cache.HybridPrefixCache.switch>`); no block changes
  hands.

The controller starts from vLLM's own pair (``vllm`` + ``lru``), so it begins
exactly as stock vLLM does. Every decision is kept as a :class:`Decision`
(request index, window, scores, the pair before and after).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_admission.core.admission import ADMISSION_POLICIES, get_admission
from vllm_admission.core.cache import HybridPrefixCache
from vllm_admission.core.eviction import ENGINE_EVICTION_POLICIES, eviction_class, get_eviction
from vllm_admission.core.replay import CacheRequest, replay_requests

__all__ = ["AUTO", "AUTO_ADMISSIONS", "AUTO_EVICTIONS", "Decision", "Pair", "PolicyController",
           "candidate_policies"]

#: The name that asks for online selection, for admission and eviction alike.
AUTO = "auto"

#: Admission policies ``auto`` chooses among: every registered one that
#: checkpoints at all (``none`` keeps no state, so it never hits).
AUTO_ADMISSIONS: tuple[str, ...] = tuple(n for n in ADMISSION_POLICIES if n != "none")

#: Eviction policies ``auto`` chooses among: every one an engine can run, except
#: those with a tuned parameter (``flop``: it has its own alpha tuner, and at
#: alpha 0, where that tuner ends on the Mooncake trace, it orders like ``lru``).
AUTO_EVICTIONS: tuple[str, ...] = tuple(n for n in ENGINE_EVICTION_POLICIES
                                        if not eviction_class(n).tunable)


@dataclass(frozen=True)
class Pair:
    """An (admission, eviction) policy pair, by registered name."""

    admission: str
    eviction: str

    def __str__(self) -> str:
        return f"{self.admission}+{self.eviction}"


@dataclass(frozen=True)
class Decision:
    """One end-of-window decision.

    Attributes:
        at: index of the last request of the window (0-based, in serving order);
            a switch takes effect from request ``at + 1``.
        window: requests in the window.
        before, after: the live pair before and after (equal: no switch).
        scores: prefill FLOPs saved over the window, per pair tried.
    """

    at: int
    window: int
    before: Pair
    after: Pair
    scores: dict[str, float]

    @property
    def switched(self) -> bool:
        return self.before != self.after

    def as_dict(self) -> dict[str, Any]:
        """The record written to ``results.json`` (``policy_switches``)."""
        return {"at": self.at, "window": self.window, "from": str(self.before),
                "to": str(self.after), "scores": dict(self.scores)}


def candidate_policies(admission: str, eviction: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The admission and eviction names a run chooses among: every ``auto`` candidate
    where the name is ``"auto"``, else just that name.

    Raises:
        UnknownPolicyError: an unknown name.
        ValueError: a fixed eviction policy that needs future knowledge
            together with ``auto`` admission (the controller could not replay it
            from a snapshot).
    """
    admissions = AUTO_ADMISSIONS if admission == AUTO else (get_admission(admission).name,)
    if eviction == AUTO:
        evictions = AUTO_EVICTIONS
    else:
        if admission == AUTO and eviction_class(eviction).needs_future:
            raise ValueError(f"eviction {eviction!r} needs future knowledge; "
                             f"it cannot be combined with admission 'auto'")
        evictions = (eviction,)
    return admissions, evictions


@dataclass
class PolicyController:
    """Serves as one policy pair and switches to a better one when a shadow replay shows it.

    Args:
        cache: the cache whose policies it controls; built ``switchable``
            (``CacheSetup.build(switchable=True)``) and serving as ``start``.
        admissions, evictions: the names it chooses among (at least one each).
        prefill_flops: ``f(end, start) -> FLOPs`` of prefilling ``[start, end)``
            (the score's unit).
        start: the pair ``cache`` serves as now (default ``vllm`` + ``lru`` when
            both are candidates, else the first of each).
        min_window, max_window: bounds on a window's length, in requests.
        min_gain: relative margin a candidate must beat the live pair by.

    Use: after serving each request on ``cache``, call :meth:`observe` with the
    request, its index and the FLOPs its hit saved. It returns the
    :class:`Decision` when a window ends with a switch (already applied to
    ``cache``), else ``None``.

    Raises:
        ValueError: no candidates, or bad window bounds.
    """

    cache: HybridPrefixCache
    admissions: Sequence[str]
    evictions: Sequence[str]
    prefill_flops: Callable[[int, int], float]
    start: Pair | None = None
    min_window: int = 50
    max_window: int = 1000
    min_gain: float = 0.01
    decisions: list[Decision] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.admissions or not self.evictions:
            raise ValueError("the controller needs at least one admission and one eviction policy")
        if not 1 <= self.min_window <= self.max_window:
            raise ValueError(f"need 1 <= min_window <= max_window, got {self.min_window}, "
                             f"{self.max_window}")
        self.admissions = tuple(self.admissions)
        self.evictions = tuple(self.evictions)
        if self.start is None:
            self.start = Pair("vllm" if "vllm" in self.admissions else self.admissions[0],
                              "lru" if "lru" in self.evictions else self.evictions[0])
        self.pair = self.start
        self._pool_tokens = (self.cache.pool.num_blocks - 1) * self.cache.block_size
        self._tokens_seen = 0
        self.window_len: int | None = None     # fixed once one pool's worth of traffic was seen
        self._window: list[tuple[int, CacheRequest]] = []
        self._window_saved = 0.0
        # Nothing to choose: no snapshots, no replays.
        fixed = len(self.admissions) == 1 and len(self.evictions) == 1
        self._snapshot = None if fixed else self.cache.clone()

    # -- what the controller decides among -------------------------------------
    def neighbours(self) -> list[Pair]:
        """The pairs tried at the end of a window: one policy changed at a time."""
        live = self.pair
        out = [Pair(a, live.eviction) for a in self.admissions if a != live.admission]
        out += [Pair(live.admission, e) for e in self.evictions if e != live.eviction]
        return out

    @property
    def switches(self) -> list[Decision]:
        """The decisions that changed the pair."""
        return [d for d in self.decisions if d.switched]

    # -- serving -----------------------------------------------------------------
    def observe(self, index: int, request: CacheRequest, saved: float) -> Decision | None:
        """Record a request just served on :attr:`cache` (``saved``: FLOPs its hit saved)."""
        if self._snapshot is None:
            return None
        self._window.append((index, request))
        self._window_saved += saved
        if self.window_len is None:
            self._tokens_seen += request.prompt_len + request.output_len
            n = len(self._window)
            if n >= self.max_window or (n >= self.min_window
                                        and self._tokens_seen >= self._pool_tokens):
                self.window_len = n
            else:
                return None
        elif len(self._window) < self.window_len:
            return None
        decision = self._decide(index)
        self._window, self._window_saved = [], 0.0
        self._snapshot = self.cache.clone()
        return decision if decision.switched else None

    def _replay(self, pair: Pair) -> float:
        start = self._snapshot.clone()
        start.switch(admission=get_admission(pair.admission),
                     eviction=get_eviction(pair.eviction)
                     if pair.eviction != self.pair.eviction else None)
        first = self._window[0][0]
        return replay_requests(start, [req for _, req in self._window],
                               prefill_flops=self.prefill_flops, first_index=first).flops_saved

    def _decide(self, index: int) -> Decision:
        live = self.pair
        scores = {str(live): self._window_saved}
        best, best_score = live, self._window_saved
        for pair in self.neighbours():
            score = self._replay(pair)
            scores[str(pair)] = score
            if score > best_score:
                best, best_score = pair, score
        live_score = self._window_saved
        gain = (best_score - live_score) / live_score if live_score > 0 else math.inf
        after = best if best != live and best_score > live_score and gain > self.min_gain else live
        decision = Decision(at=index, window=len(self._window), before=live, after=after,
                            scores=scores)
        self.decisions.append(decision)
        if after != live:
            self.cache.switch(
                admission=get_admission(after.admission) if after.admission != live.admission else None,
                eviction=get_eviction(after.eviction) if after.eviction != live.eviction else None)
            self.pair = after
        return decision
