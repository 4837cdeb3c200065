"""``auto``: choose the admission and eviction policy online, by shadow replay.

A :class:`PolicyController` serves a switchable
:class:`~vllm_admission.core.cache.HybridPrefixCache` (the simulator's run; in the vLLM
plugin a twin of the engine's cache, each switch applied to the engine too) as one
(admission, eviction) :class:`Pair`, and switches by this rule:

* **shadows**: one simulated cache per candidate pair (:func:`candidate_policies`), each
  fed every request from the start, or the requests of sampled prefix subtrees on a pool
  scaled alike (:class:`~vllm_admission.core.sampling.PrefixSampler`);
* **score**: the prefill FLOPs each shadow saved (the quantity Marconi's alpha tuner
  maximises, Marconi section 4.2), each request's saving halved every ``half_life`` pool
  turnovers (a turnover: the requests whose tokens first fill the pool, clipped to
  ``[min_window, max_window]``); the scores restart from zero when a shadow first evicts
  (:attr:`PolicyController.pressure_at`);
* **decision**: every ``min_window`` requests (:data:`DEFAULT_INTERVAL`); switch to the
  best-scoring pair when its lead over the live pair's shadow exceeds the relative margin
  ``min_gain`` and, with sampled shadows, ``min_lead_errors`` standard errors of the
  sampling (Horvitz-Thompson over a Bernoulli sample of units);
* **margin over stock** (``stock_margin``, off by default): leaving stock's pair
  (:func:`stock_pair`; the start pair where stock's is no candidate) costs a margin, and
  no pair behind stock's is served. While ``auto`` serves stock's pair, it switches only
  once the shadows have evicted for a pool turnover, and only to a pair whose score is
  above ``1 + stock_margin`` times stock's (less ``min_lead_errors`` standard errors of
  the sampling). While it serves another pair, it may switch, by the plain rule, to any
  pair whose score is above stock's (less that error); the first decision the live
  pair's score is behind stock's (by more than that error: with sampled shadows a dip
  within the noise is no evidence), it serves the best pair still allowed, stock's if no
  other is. A start other than stock (``dense`` + ``lru`` with in-pass checkpoints) is
  kept while it is not behind stock;
* **elimination**: a candidate whose score stays below ``drop_below`` times the best
  one's (less ``min_lead_errors`` standard errors of the sampling) at every decision for
  ``drop_after`` pool turnovers, counted from the first eviction under pressure, loses
  its shadow; the live pair never does, nor, with a margin, stock's (successive
  elimination: Even-Dar, Mannor and Mansour, "Action Elimination and Stopping Conditions
  for the Multi-Armed Bandit and Reinforcement Learning Problems", JMLR 7, 2006,
  section 3, with a fixed margin in place of their confidence radius);
* **settling**: once the live pair's shadow is the only one left, nothing is left to
  compare: the shadows stop and ``auto`` serves that pair for the rest of the run at no
  further cost (:attr:`PolicyController.settled_at`; successive elimination's stopping
  condition, one arm left);
* **start**: stock vLLM's pair (:func:`stock_pair`: ``vllm`` + ``lru``); in ``inpass``
  checkpoint mode the candidate admission with a state at every block (``dense``) with
  ``lru`` (:meth:`PolicyController.default_start`);
* **switch**: a new admission policy decides from the next request on; a new eviction
  policy receives the free cached blocks with the times and values they were freed with,
  those the new pair's shadow does not hold first (:meth:`HybridPrefixCache.switch
  <vllm_admission.core.cache.HybridPrefixCache.switch>`, :meth:`HybridPrefixCache.held_keys
  <vllm_admission.core.cache.HybridPrefixCache.held_keys>`, carried by the
  :class:`Decision`); a policy that learns by block hash (``reuse``) finds the history the
  live cache kept all along (:class:`LiveEvictions`).

Every decision is a :class:`Decision`; the controller keeps every switch and the latest
:data:`DECISIONS_KEPT` decisions. Cost: one cache-model run and one block pool per
candidate pair still in the running beside the live one.

Designs tried and measurements: ``research-log/2026-11-adaptive.md``; the behaviour in full:
``docs/simulator.md``.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_admission.core.admission import (
    ADMISSION_POLICIES,
    AdmissionPolicy,
    get_admission,
    stock_admission,
)
from vllm_admission.core.cache import HybridPrefixCache
from vllm_admission.core.cache_inputs import CacheRequest, CacheSetup
from vllm_admission.core.errors import UserError
from vllm_admission.core.eviction import (
    EvictionPolicy,
    HistoryKeeper,
    ReuseHistory,
    engine_eviction_policies,
    eviction_class,
    get_eviction,
    stock_eviction,
)
from vllm_admission.core.layout import DEFAULT_CHECKPOINT
from vllm_admission.core.sampling import PrefixSampler

__all__ = ["AUTO", "AUTO_ADMISSIONS", "AUTO_EVICTIONS", "DEFAULT_INTERVAL", "DEFAULT_MIN_SAMPLES",  # noqa: F822 - two names come from __getattr__
           "DECISIONS_KEPT", "DEFAULT_MARGIN",
           "MARGIN_ADMISSIONS", "MARGIN_SETTING", "MIN_SHADOW_REQUESTS", "auto_admissions",
           "check_stock_margin", "parse_auto_admissions",
           "parse_shadow_rate",
           "auto_evictions",
           "Decision", "LiveEvictions", "Pair", "PolicyController", "candidate_policies",
           "stock_pair"]

#: The name that asks for online selection, for admission and eviction alike.
AUTO = "auto"

#: Requests between two decisions (``PolicyController.min_window``), unless the
#: user sets another (``--auto-interval``, ``VLLM_ADMISSION_AUTO_INTERVAL``).
DEFAULT_INTERVAL = 50

#: The margin over stock unless the user sets one (``stock_margin``): off.
DEFAULT_MARGIN = 0.0

#: Decisions a controller keeps (``PolicyController.decisions``); every switch is kept.
DECISIONS_KEPT = 1000

#: With sampled shadows: sampled requests the compared scores rest on, at least
#: (``PolicyController.min_samples``).
DEFAULT_MIN_SAMPLES = 256

#: With sampled shadows: mean-sized requests a scaled shadow pool holds, at least (a
#: miniature cache of a few requests no longer behaves like the full one;
#: ``research-log/2026-11-adaptive.md``).
MIN_SHADOW_REQUESTS = 64

#: The margin setting ``docs/results.md`` 5.6 measured (the README's setting to leave on):
#: ``stock_margin`` (``VLLM_ADMISSION_AUTO_MARGIN``) and the admission candidates
#: (``VLLM_ADMISSION_AUTO_ADMISSIONS``), ``written`` among them. Not the default.
MARGIN_SETTING = 0.3
MARGIN_ADMISSIONS = ("last", "vllm", "marconi", "dense", "written")


def check_stock_margin(margin: object) -> float:
    """``margin`` as a margin over stock (:attr:`PolicyController.stock_margin`): a
    finite number >= 0.

    Raises:
        UserError: anything else.
    """
    value = float(margin) if isinstance(margin, (int, float)) and not isinstance(margin, bool) else math.nan
    if not (value >= 0.0 and math.isfinite(value)):
        raise UserError(f"auto's margin over stock's pair must be a finite number >= 0 "
                        f"(0.3: a 30 % lead), got {margin!r}")
    return value


def parse_shadow_rate(text: str | float | None) -> float | None:
    """A shadow sample rate as the user gives it: ``"auto"`` (or ``None``) for the
    rate chosen from the trace (``None``), else a number in ``(0, 1]`` (1: full
    shadows).

    Raises:
        UserError: anything else.
    """
    if text is None or (isinstance(text, str) and text.strip().lower() == AUTO):
        return None
    try:
        rate = float(text)
    except (TypeError, ValueError):
        rate = math.nan
    if not 0.0 < rate <= 1.0:
        raise UserError(f"the shadow sample rate must be 'auto' or a number in (0, 1], got {text!r}")
    return rate


def auto_admissions(sub_block: bool = False) -> tuple[str, ...]:
    """Admission policies ``auto`` chooses among: every one registered now that declares
    ``auto_candidate`` (all built-ins but ``none``, which keeps no state, so it never
    hits), less, unless ``sub_block`` (the engine hashes in units finer than the block,
    vLLM's ``prefix_match_unit``), those that differ from the others only there
    (``sub_block_only``: ``block``). ``AUTO_ADMISSIONS`` is ``auto_admissions()``, read as
    an attribute."""
    return tuple(n for n, c in ADMISSION_POLICIES.items()
                 if c.auto_candidate and (sub_block or not c.sub_block_only))


def auto_evictions() -> tuple[str, ...]:
    """Eviction policies ``auto`` chooses among, asked of the registry now: every one an
    engine can run that declares ``auto_candidate`` (``lru``, ``reuse``).
    ``AUTO_EVICTIONS`` is the same, read as an attribute.

    Left out of the built-ins: ``flop`` (it has its own alpha tuner, which ends at
    alpha 0, ``lru``'s order, on the Mooncake trace) and the baseline ``lfu`` (transient
    leads drew ``auto`` into it; ``research-log/2026-11-adaptive.md``). With a policy that
    keeps a hash history among them (``reuse``), every live policy keeps that history
    (:class:`LiveEvictions`).
    """
    return tuple(n for n in engine_eviction_policies() if eviction_class(n).auto_candidate)


def __getattr__(name: str) -> tuple[str, ...]:
    # Read from the registries at each access: no copy goes stale when a policy registers.
    if name == "AUTO_ADMISSIONS":
        return auto_admissions()
    if name == "AUTO_EVICTIONS":
        return auto_evictions()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Pair:
    """An (admission, eviction) policy pair, by registered name."""

    admission: str
    eviction: str

    def __str__(self) -> str:
        return f"{self.admission}+{self.eviction}"


def stock_pair() -> Pair:
    """Stock vLLM's pair: the admission policy that declares itself vLLM's own
    behaviour (``vllm_native``) and the eviction policy in vLLM's own order
    (``vllm_order``): ``vllm`` + ``lru``. The reference of every comparison
    against stock (fidelity, reports, the plugin's defaults) and ``auto``'s start.

    Raises:
        LookupError: not exactly one registered policy of each declares it.
    """
    return Pair(stock_admission(), stock_eviction())


@dataclass(frozen=True)
class Decision:
    """One decision (every ``min_window`` requests).

    Attributes:
        at: index of the last request before the decision (0-based, in serving order);
            a switch takes effect from request ``at + 1``.
        window: requests since the previous decision.
        before, after: the live pair before and after (equal: no switch).
        scores: per candidate pair whose shadow still runs (elimination drops
            the others), the prefill FLOPs its shadow saved so far,
            each request's saving weighed down by half every ``half_life`` pool
            turnovers (what the decision compared).
        held: for a switch, per KV cache group, the prompt block hashes the new
            pair's shadow holds (``None`` otherwise, and in the controller's records
            ``decisions`` and ``switches``: only the decision ``observe`` returns
            carries them; not in :meth:`as_dict`).
        error: the sampling error (one standard error, in the scores' unit) of
            the best pair's score minus the live pair's; 0 with full shadows.
    """

    at: int
    window: int
    before: Pair
    after: Pair
    scores: dict[str, float]
    error: float = 0.0
    # From HybridPrefixCache.held_keys: the live cache hands its other free
    # cached blocks to the new eviction policy first.
    held: tuple[frozenset[Hashable], ...] | None = field(default=None, compare=False, repr=False)

    @property
    def switched(self) -> bool:
        return self.before != self.after

    def as_dict(self) -> dict[str, Any]:
        """The record written to ``results.json`` (``policy_switches``)."""
        return {"at": self.at, "window": self.window, "from": str(self.before),
                "to": str(self.after), "scores": dict(self.scores), "error": self.error}


def parse_auto_admissions(text: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """``auto``'s admission candidates as the user gives them: a comma-separated list of
    registered admission names (or a sequence of them), in the user's order; ``None`` or
    an empty text for the default (:func:`auto_admissions`).

    Raises:
        UnknownPolicyError: a name that is not registered (the message lists the valid ones).
        UserError: ``auto`` among them, a name given twice, or no name at all.
    """
    if text is None:
        return None
    names = [n.strip() for n in text.split(",")] if isinstance(text, str) else list(text)
    if isinstance(text, str) and not text.strip():
        return None
    if not names or any(not n for n in names):
        raise UserError(f"auto's admission candidates must be a comma-separated list of "
                        f"admission policies, got {text!r}")
    if AUTO in names:
        raise UserError(f"auto's admission candidates are policies to choose among; "
                        f"{AUTO!r} is not one, got {text!r}")
    for n in names:
        get_admission(n)
    if len(set(names)) != len(names):
        raise UserError(f"auto's admission candidates name a policy twice: {text!r}")
    return tuple(names)


def candidate_policies(admission: str, eviction: str, *, sub_block: bool = False,
                       admissions: Sequence[str] | None = None,
                       ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The admission and eviction names a run chooses among: every ``auto`` candidate
    where the name is ``"auto"``, else just that name. ``sub_block``: the engine
    hashes in units finer than the block (vLLM's ``prefix_match_unit``); without it
    the admissions that differ from the others only there
    (:attr:`~vllm_admission.core.admission.AdmissionPolicy.sub_block_only`) are left out.
    ``admissions``: with ``auto`` admission, the candidates to choose among instead of
    the registered ones (:func:`parse_auto_admissions`; taken as given).

    Raises:
        UnknownPolicyError: an unknown name.
        UserError: a fixed eviction policy that needs future knowledge
            together with ``auto`` admission (the controller could not replay it
            from a snapshot); ``admissions`` with a fixed admission policy.
    """
    if admissions is not None and admission != AUTO:
        raise UserError(f"auto's admission candidates ({', '.join(admissions)}) were given, "
                        f"but the admission policy is {admission!r}, not {AUTO!r}")
    if admission == AUTO:
        chosen = parse_auto_admissions(admissions) if admissions is not None else None
        names = chosen if chosen is not None else auto_admissions(sub_block)
    else:
        names = (get_admission(admission).name,)
    if eviction == AUTO:
        evictions = auto_evictions()
    else:
        if admission == AUTO and eviction_class(eviction).needs_future:
            raise UserError(f"eviction {eviction!r} needs future knowledge; "
                            f"it cannot be combined with admission 'auto'")
        evictions = (eviction,)
    return names, evictions


class LiveEvictions:
    """Builds the eviction policies the live cache serves with under ``auto``.

    A policy that keeps history by block hash (``reuse``) learns which hashes
    come back from what the cache caches, hits and evicts; switched in mid-run
    with a fresh history it would take every cached block for a first-time
    one. So when ``reuse`` is a candidate, every policy
    built here shares one :class:`~vllm_admission.core.eviction.ReuseHistory`, kept up to date from
    the first request on: ``reuse`` itself, and every other policy wrapped in a
    :class:`~vllm_admission.core.eviction.HistoryKeeper` that orders as the
    policy does. The simulator's live cache and the plugin's block pool both
    take their policies from here, so they hear the same history.

    Args:
        evictions: the eviction names ``auto`` chooses among.
    """

    def __init__(self, evictions: Sequence[str]) -> None:
        keeps = any(eviction_class(e).keeps_history for e in evictions)
        #: The shared history, or ``None`` when no candidate keeps one.
        self.history: ReuseHistory | None = ReuseHistory() if keeps else None

    def make(self, name: str, **options: Any) -> EvictionPolicy:
        """A fresh policy ``name`` (registered, needing no future), built with
        ``options`` (:func:`~vllm_admission.core.eviction.get_eviction`) and bound
        to the shared history.

        Raises:
            UnknownPolicyError: an unknown name.
            ValueError: a policy that needs the future, with a shared history.
        """
        if self.history is None:
            return get_eviction(name, **options)
        cls = eviction_class(name)
        if cls.keeps_history:
            return cls.with_history(self.history, **options)
        return HistoryKeeper(cls(**options), self.history)


class _ShadowSet:
    """One shadow cache per candidate pair, fed the requests its sampler keeps, on pools
    scaled by the same rate, and the savings they score (``PolicyController``)."""

    def __init__(self, setup: CacheSetup, pairs: Sequence[Pair], rate: float) -> None:
        lay = setup.layout
        if rate < 1.0:
            pool, host = lay.pool, lay.host
            lay = dataclasses.replace(
                lay, pool=dataclasses.replace(pool, num_blocks=max(1, round(rate * (pool.num_blocks - 1))) + 1),
                host=dataclasses.replace(host, chunks=max(1, round(rate * host.chunks)) if host.chunks else 0))
        setup = dataclasses.replace(setup, layout=lay)
        self.rate = rate
        self.sampler = PrefixSampler(rate, max_nodes=max(1 << 16, 8 * (lay.pool.num_blocks - 1)))
        self.pairs = tuple(pairs)
        # One cache per pair, in the order of ``pairs``; ``None`` once the pair is dropped.
        self.caches: list[HybridPrefixCache | None] = [
            dataclasses.replace(setup, admission=p.admission, eviction=p.eviction).build()
            for p in pairs]
        self.reset()

    @property
    def shadows(self) -> dict[Pair, HybridPrefixCache]:
        """The caches still served, per pair."""
        return {p: c for p, c in zip(self.pairs, self.caches, strict=True) if c is not None}

    def drop(self, j: int) -> None:
        """Stop serving pair ``j``'s shadow and free its cache; it saves nothing from now on."""
        self.caches[j] = None

    def reset(self) -> None:
        """Forget every saving (at the first eviction under pressure)."""
        n = len(self.caches)
        self.scores = [0.0] * n             # this window's savings, per pair
        self.history = [0.0] * n            # decayed savings, per pair
        self.units: dict[int, list[float]] = {}          # this window's savings per unit
        self.moments = [[0.0] * n for _ in range(n)]     # decayed sum over units of x_p * x_q
        self.count = 0                      # sampled requests this window
        self.weight = 0.0                   # decayed sampled requests

    @property
    def evicted(self) -> bool:
        return any(c.pool.evictions for c in self.caches if c is not None)

    def serve(self, index: int, request: CacheRequest,
              flops: Callable[[int, int], float]) -> None:
        """Serve ``request`` on every shadow if the sampler keeps it; score the savings."""
        unit = self.sampler.sampled(request.hashes, index)
        if unit is None:
            return
        prompt_len, output_len, hashes = request.prompt_len, request.output_len, request.hashes
        # The shadows share one layout: a request fits all of them or none.
        if not next(c for c in self.caches if c is not None).fits(prompt_len, output_len):
            return
        full = flops(prompt_len, 0)
        now = float(index)
        saved = [0.0 if shadow is None else
                 full - flops(prompt_len, shadow.serve(hashes, prompt_len, output_len, index, now,
                                                       request.units).hit_tokens)
                 for shadow in self.caches]
        scores = self.scores
        for j, v in enumerate(saved):
            scores[j] += v
        self.count += 1
        if self.rate < 1.0:
            acc = self.units.get(unit)
            if acc is None:
                self.units[unit] = saved
            else:
                for j, v in enumerate(saved):
                    acc[j] += v

    def fold(self, decay: float) -> None:
        """End a decision window: its savings join the history, which fades by ``decay``."""
        history = self.history
        for j, v in enumerate(self.scores):
            history[j] = history[j] * decay + v
        self.weight = self.weight * decay + self.count
        if self.rate < 1.0:
            # Each unit's savings enter with its weight squared (the decay applies to both).
            moments, d2 = self.moments, decay * decay
            for row in moments:
                for q in range(len(row)):
                    row[q] *= d2
            for x in self.units.values():
                for p, xp in enumerate(x):
                    if xp:
                        row = moments[p]
                        for q, xq in enumerate(x):
                            row[q] += xp * xq
        self.scores = [0.0] * len(history)
        self.units = {}
        self.count = 0

    def error(self, p: int, q: int) -> float:
        """One standard error of ``history[p] - history[q]`` from sampling (0 at rate 1):
        Horvitz-Thompson over a Bernoulli sample of units, ``(1 - rate) * sum (x_p - x_q)^2``."""
        if self.rate >= 1.0:
            return 0.0
        m = self.moments
        return math.sqrt(max(0.0, (1.0 - self.rate) * (m[p][p] - 2.0 * m[p][q] + m[q][q])))


@dataclass
class PolicyController:
    """Serves as one policy pair and switches to the pair its shadow caches show is better.

    Args:
        live: the cache whose policies it controls, built ``switchable`` and
            serving as :attr:`pair` (in the simulator the run's own cache; in the
            plugin a twin of the engine's, or ``None`` when the caller applies
            :attr:`pair` itself).
        setup: builds the shadow caches (layout, FLOP costs); its policy names
            are ignored.
        admissions, evictions: the names it chooses among (at least one each).
        prefill_flops: ``f(end, start) -> FLOPs`` of prefilling ``[start, end)``
            (the score's unit).
        start: the pair served first (default :meth:`default_start`).
        min_window: requests between two decisions (the *decision interval*),
            and the shortest pool turnover assumed.
        max_window: the longest pool turnover assumed, in requests (raised
            to ``min_window`` when smaller).
        min_gain: relative margin a candidate must beat the live pair by.
        half_life: in pool turnovers, how long until a request's saving counts
            half in the scores compared; 0 compares the last ``min_window``
            requests alone.
        shadow_rate: the fraction of requests the shadows serve
            (:class:`~vllm_admission.core.sampling.PrefixSampler`), on pools
            scaled by the same fraction; 1 runs full shadows; ``None`` (default)
            chooses it from the trace (:meth:`sample_rate`).
        min_samples: with ``shadow_rate=None``: the sampled requests the
            compared scores should rest on (the rate is raised until the score
            horizon holds that many).
        min_lead_errors: with sampled shadows, a switch also needs the best
            pair's lead over the live pair to exceed this many standard errors of
            its sampling error (:meth:`_ShadowSet.error`; 0: the margin
            ``min_gain`` alone).
        stock_margin: the relative lead over stock's score a pair's score needs for
            ``auto`` to leave stock's pair for it; off stock's pair, no pair behind
            stock's is served (module docstring, "margin over stock"); 0 (default)
            leaves the choice to ``min_gain`` alone.
        drop_below, drop_after: elimination (module docstring): a pair's shadow is
            dropped once its score stayed below ``drop_below`` times the best
            pair's for ``drop_after`` pool turnovers of decisions in a row;
            ``drop_below=0`` keeps every shadow.

    The controller serves ``live`` with its own policy objects
    (:class:`LiveEvictions`), from the start on.

    Use: after serving each request on ``live``, call :meth:`observe` with the
    request's index and the request. It serves the request on every shadow and
    returns the :class:`Decision` when a decision switches the pair (already
    applied to ``live``), else ``None``.

    **Sampled shadows** (miniature simulation, ``core/sampling.py``): a set of
    shadows, each a cache of ``rate`` times the live pool's blocks, serves only
    the requests of the sampled prefix subtrees, so it costs about ``rate``
    times what full shadows cost, in time and memory. The main cache is never
    sampled. A sampled switch also needs a lead larger than ``min_lead_errors``
    standard errors: the error of a sum over a Bernoulli sample of sampling units
    (Horvitz-Thompson; each unit's savings summed within a decision window).

    With ``shadow_rate=None`` the run starts on full shadows. The first
    ``min_window`` requests are kept aside; from their mean length the
    controller estimates the requests one pool turnover takes (at least
    ``min_window``, at most ``max_window``) and sets the rate so that
    ``half_life`` turnovers hold ``min_samples`` sampled requests (but a scaled
    pool holds at least :data:`MIN_SHADOW_REQUESTS` requests of that mean
    length). Below 1, it builds the sampled shadows beside the full ones and
    serves them the requests kept aside. The full shadows decide until the
    sampled ones have scored ``min_samples`` requests (decayed as the scores
    are, counted from the first eviction under pressure), then stop
    (:attr:`handover_at`): a short trace is decided as on full shadows, a long
    one costs the rate. With a fixed ``shadow_rate`` below 1 the sampled
    shadows decide from the start.

    Raises:
        UserError: a decision interval that is not an integer >= 1, a
            ``shadow_rate`` outside ``(0, 1]``, or a ``stock_margin`` that is not
            a finite number >= 0.
        ValueError: no candidates.
    """

    live: HybridPrefixCache | None
    setup: CacheSetup
    admissions: Sequence[str]
    evictions: Sequence[str]
    prefill_flops: Callable[[int, int], float]
    start: Pair | None = None
    min_window: int = DEFAULT_INTERVAL
    max_window: int = 1000
    min_gain: float = 0.01
    half_life: float = 4.0
    shadow_rate: float | None = None
    min_samples: int = DEFAULT_MIN_SAMPLES
    min_lead_errors: float = 1.0
    drop_below: float = 0.8
    drop_after: float = 4.0
    stock_margin: float = DEFAULT_MARGIN

    def __post_init__(self) -> None:
        if not self.admissions or not self.evictions:
            raise ValueError("the controller needs at least one admission and one eviction policy")
        if not (isinstance(self.min_window, int) and self.min_window >= 1):
            raise UserError(f"the decision interval must be an integer >= 1 request, "
                            f"got {self.min_window!r}")
        if self.shadow_rate is not None and not (
                isinstance(self.shadow_rate, (int, float)) and 0.0 < self.shadow_rate <= 1.0):
            raise UserError(f"the shadow sample rate must be in (0, 1], got {self.shadow_rate!r}")
        self.stock_margin = check_stock_margin(self.stock_margin)
        self.max_window = max(self.max_window, self.min_window)
        #: The latest :data:`DECISIONS_KEPT` decisions (memory must not grow with the trace).
        self.decisions: deque[Decision] = deque(maxlen=DECISIONS_KEPT)
        #: Every decision that changed the pair, in order.
        self.switches: list[Decision] = []
        #: Decisions made in all.
        self.num_decisions = 0
        self.admissions = tuple(self.admissions)
        self.evictions = tuple(self.evictions)
        if self.start is None:
            self.start = self.default_start(self.admissions, self.evictions,
                                            self.setup.layout.scheduling.checkpoint)
        self.pair = self.start
        self.live_evictions = LiveEvictions(self.evictions)
        if self.live is not None:
            # Serve as the start pair whatever the live cache was built with.
            fresh = (self.live_evictions.history is not None
                     or self.live.eviction.name != self.pair.eviction)
            self.live.switch(admission=self._admission(self.pair.admission),
                             eviction=self.live_evictions.make(self.pair.eviction) if fresh else None)
        self.pairs = tuple(Pair(a, e) for a in self.admissions for e in self.evictions)
        #: The pair the margin over stock measures leads against (``stock_margin``):
        #: stock's where it is a candidate, else the start.
        self.anchor = stock_pair() if stock_pair() in self.pairs else self.start
        lay = self.setup.layout
        self._pool_tokens = (lay.pool.num_blocks - 1) * lay.pool.block_size
        self._tokens_seen = 0
        #: Requests per pool turnover, fixed once one pool's worth of traffic was seen.
        self.window_len: int | None = None
        self._count = 0          # requests seen
        self._since = 0          # requests since the last decision
        #: Pairs whose shadows were dropped (elimination), each with the index of the
        #: request after which the decision that dropped it was made.
        self.dropped: dict[Pair, int] = {}
        self._behind = [0] * len(self.pairs)   # decisions in a row each pair stayed behind
        #: Index of the request after which the shadows stopped, the live pair's being the
        #: only one left (settling; ``None``: they run).
        self.settled_at: int | None = None
        #: Index of the request after which a shadow first evicted (``None``: not yet).
        self.pressure_at: int | None = None
        #: The sample rate chosen (1: full shadows only; ``None`` until chosen).
        self.rate: float | None = None
        #: Index of the decision after which the sampled shadows took over from the
        #: full ones (``None``: not, or not yet).
        self.handover_at: int | None = None
        self._full: _ShadowSet | None = None        # full shadows
        self._sampled: _ShadowSet | None = None     # sampled shadows
        # Requests kept aside until the rate is chosen (shadow_rate=None).
        self._kept: list[tuple[int, CacheRequest]] | None = None
        if len(self.pairs) == 1:
            return               # nothing to choose with one pair: no shadows at all
        if self.shadow_rate is None:
            self._full = _ShadowSet(self.setup, self.pairs, 1.0)
            self._kept = []
        elif self.shadow_rate >= 1.0:
            self._full = _ShadowSet(self.setup, self.pairs, 1.0)
            self.rate = 1.0
        else:
            self._sampled = _ShadowSet(self.setup, self.pairs, float(self.shadow_rate))
            self.rate = float(self.shadow_rate)

    @staticmethod
    def default_start(admissions: Sequence[str], evictions: Sequence[str],
                      checkpoint: str = DEFAULT_CHECKPOINT) -> Pair:
        """The pair served first (see the module docstring).

        Args:
            admissions, evictions: the candidate names.
            checkpoint: the cache's checkpoint mode
                (:data:`~vllm_admission.core.cache.CHECKPOINT_MODES`).

        Returns:
            With ``checkpoint="inpass"`` the candidate admission that keeps a
            state at every block (``every_block``: ``dense``) if there is one;
            otherwise the stock admission (:func:`stock_pair`: ``vllm``) if it
            is a candidate, else the first name. The stock eviction (``lru``)
            where it is a candidate, else the first name.
        """
        stock = stock_pair()
        dense = [a for a in admissions if get_admission(a).every_block]
        if checkpoint == "inpass" and dense:
            admission = dense[0]
        else:
            admission = stock.admission if stock.admission in admissions else admissions[0]
        return Pair(admission, stock.eviction if stock.eviction in evictions else evictions[0])

    def _admission(self, name: str) -> AdmissionPolicy:
        """The admission policy ``name`` on this run's engine settings."""
        return get_admission(name, retention_interval=self.setup.layout.pool.retention_interval)

    # -- sampling ------------------------------------------------------------
    def sample_rate(self, mean_tokens: float) -> float:
        """The rate ``shadow_rate=None`` chooses, from the mean prompt + output
        tokens of the requests seen so far.

        A pool turnover is estimated as ``pool tokens / mean_tokens`` requests,
        clipped to ``[min_window, max_window]``; the scores remember about
        ``half_life`` turnovers (``min_window`` requests when ``half_life`` is
        0). The rate is ``min_samples`` over that horizon, raised so that a
        scaled pool holds :data:`MIN_SHADOW_REQUESTS` requests of
        ``mean_tokens``, and at most 1.
        """
        mean_tokens = max(mean_tokens, 1.0)
        turnover = self._pool_tokens / mean_tokens
        turnover = min(max(turnover, self.min_window), self.max_window)
        horizon = self.half_life * turnover if self.half_life > 0 else self.min_window
        rate = self.min_samples / horizon
        lay = self.setup.layout
        request_blocks = math.ceil(mean_tokens / lay.pool.block_size) + len(lay.pool.group_kinds)
        floor = MIN_SHADOW_REQUESTS * request_blocks / (lay.pool.num_blocks - 1)
        return min(1.0, max(rate, floor))

    @property
    def _deciding(self) -> _ShadowSet | None:
        """The shadows decisions are made on: the full ones while they run."""
        return self._full if self._full is not None else self._sampled

    @property
    def shadows(self) -> dict[Pair, HybridPrefixCache]:
        """The shadow caches decisions are made on, per candidate pair (empty with one pair)."""
        deciding = self._deciding
        return {} if deciding is None else deciding.shadows

    @property
    def sampler(self) -> PrefixSampler | None:
        """The sampler of the sampled shadows (``None`` without them)."""
        return None if self._sampled is None else self._sampled.sampler

    # -- serving -----------------------------------------------------------------
    def observe(self, index: int, request: CacheRequest) -> Decision | None:
        """Serve ``request`` (number ``index``) on every shadow; decide every ``min_window``.
        Once settled (:attr:`settled_at`) it does nothing and returns ``None``."""
        if len(self.pairs) == 1:
            return None
        if self.settled_at is not None:
            return None
        flops = self.prefill_flops
        if self._full is not None:
            self._full.serve(index, request, flops)
        if self._kept is not None:
            self._kept.append((index, request))
        elif self._sampled is not None:
            self._sampled.serve(index, request, flops)
        self._count += 1
        self._since += 1
        if self.window_len is None:
            self._tokens_seen += request.prompt_len + request.output_len
            n = self._count
            if n >= self.max_window or (n >= self.min_window
                                        and self._tokens_seen >= self._pool_tokens):
                self.window_len = n
        decision = None
        if self._since >= self.min_window:
            if self._kept is not None:
                self._start_sampled()
            decision = self._decide(index)
            self._since = 0
        deciding = self._deciding
        assert deciding is not None  # with two pairs or more, full or sampled shadows run
        if self.pressure_at is None and deciding.evicted:
            # Savings so far were made by caches that never had to evict: they say
            # which pair hits most in unbounded memory, not under this pool's pressure.
            self.pressure_at = index
            for shadows in (self._full, self._sampled):
                if shadows is not None:
                    shadows.reset()
        if decision is not None and len(deciding.shadows) == 1:
            # One shadow left, the live pair's: nothing to compare, the shadows stop.
            self._full = self._sampled = None
            self.settled_at = index
        return decision if decision is not None and decision.switched else None

    def _start_sampled(self) -> None:
        """Choose the rate from the requests kept aside; below 1, build the sampled
        shadows and serve them those requests, as if they had been there all along."""
        kept, self._kept = self._kept, None
        assert kept is not None  # called while requests are kept aside (observe)
        mean = sum(r.prompt_len + r.output_len for _, r in kept) / len(kept)
        self.rate = self.sample_rate(mean)
        if self.rate < 1.0:
            self._sampled = _ShadowSet(self.setup, self.pairs, self.rate)
            for i, req in kept:
                self._sampled.serve(i, req, self.prefill_flops)

    def _decide(self, index: int) -> Decision:
        live = self.pair
        pairs = self.pairs
        # Until one pool's worth of traffic was seen, nothing is old: no decay.
        if self.half_life <= 0:
            decay = 0.0
        elif self.window_len is None:
            decay = 1.0
        else:
            decay = 0.5 ** (self._since / (self.half_life * self.window_len))
        for shadows in (self._full, self._sampled):
            if shadows is not None:
                shadows.fold(decay)
        deciding = self._deciding
        assert deciding is not None  # with two pairs or more, full or sampled shadows run
        history, rate = deciding.history, deciding.rate
        li = pairs.index(live)
        active = [j for j, c in enumerate(deciding.caches) if c is not None]
        allowed = self._allowed(index, deciding, active, li)
        bi = max(allowed, key=lambda j: (history[j], j == li))
        gain = (history[bi] - history[li]) / history[li] if history[li] > 0 else math.inf
        error = deciding.error(bi, li)
        lead = history[bi] - history[li]
        switch = li not in allowed or (
            lead > 0 and gain > self.min_gain and lead > self.min_lead_errors * error)
        after = pairs[bi] if switch else live
        held = deciding.shadows[after].held_keys() if after != live else None
        decision = Decision(at=index, window=self._since, before=live, after=after,
                            scores={str(pairs[j]): history[j] / rate for j in active},
                            error=error / rate, held=held)
        # The records leave out the held hashes (a set per group, as large as the shadow's
        # pool): only the switch being applied needs them.
        record = dataclasses.replace(decision, held=None) if held is not None else decision
        self.decisions.append(record)
        self.num_decisions += 1
        if after != live:
            self.switches.append(record)
            if self.live is not None:
                # A fresh eviction policy even when only the admission changes:
                # the candidates are handed over again, what ``after`` does not hold first.
                self.live.switch(
                    admission=self._admission(after.admission)
                    if after.admission != live.admission else None,
                    eviction=self.live_evictions.make(after.eviction), held=held)
            self.pair = after
        self._eliminate(index, deciding, active, bi, after)
        if (self._full is not None and self._sampled is not None
                and self._sampled.weight >= self.min_samples):
            # The sample now holds enough requests to decide on: the full shadows stop.
            self._full = None
            self.handover_at = index
        return decision

    def _allowed(self, index: int, deciding: _ShadowSet, active: list[int], li: int) -> list[int]:
        """The indices of the pairs a decision may serve (the margin over stock, module
        docstring): every active pair without a margin; with one, stock's pair; while
        ``auto`` serves stock's pair, the pairs whose lead over it passes the margin once
        the shadows have evicted for a turnover; while it serves another, every pair ahead
        of stock's, the live pair ``li`` included unless it is behind by more than the
        sampling error."""
        if self.stock_margin <= 0:
            return active
        si = self.pairs.index(self.anchor)
        history = deciding.history
        settled = (self.pressure_at is not None and self.window_len is not None
                   and index - self.pressure_at >= self.window_len)
        bar = history[si]   # off stock's pair: any pair ahead of stock's
        if li == si:        # serving stock's pair: a lead above the margin, once settled
            bar = (1.0 + self.stock_margin) * history[si] if settled else math.inf
        # The live pair stays unless behind stock's by more than the sampling error (none
        # with full shadows): a sampled dip within its noise is no evidence the lead is gone.
        # A start other than stock's is also kept while tied with it.
        stay = history[li] + self.min_lead_errors * deciding.error(li, si)
        keep = stay > history[si] or (self.pairs[li] == self.start and stay >= history[si])
        return [j for j in active
                if j == si or (j == li and keep)
                or history[j] - self.min_lead_errors * deciding.error(j, si) > bar]

    def _eliminate(self, index: int, deciding: _ShadowSet, active: list[int], best: int,
                   live: Pair) -> None:
        """Drop the shadows of pairs that stayed far behind the best (elimination, module
        docstring); ``best``: the index of the best-scoring pair; ``live``: the pair now served."""
        if self.drop_below <= 0 or self.pressure_at is None or self.window_len is None:
            return
        history = deciding.history
        bar = self.drop_below * history[best]
        needed = math.ceil(self.drop_after * self.window_len / self.min_window)
        # The live pair's shadow is what the others are measured against; with a margin,
        # stock's is the reference the margin is measured from.
        keep = (live, self.anchor) if self.stock_margin > 0 else (live,)
        behind = self._behind
        for j in active:
            pair = self.pairs[j]
            if pair in keep or history[j] + self.min_lead_errors * deciding.error(best, j) >= bar:
                behind[j] = 0
                continue
            behind[j] += 1
            if behind[j] >= needed:
                for shadows in (self._full, self._sampled):
                    if shadows is not None:
                        shadows.drop(j)
                self.dropped[pair] = index
