"""``mix``: an expert mix in the LeCaR / Cacheus style: every victim comes from one of
several eviction orders, chosen by weights that each order's regrets lower.

LeCaR (Vietri et al., "Driving Cache Replacement with ML-based LeCaR", HotStorage 2018)
keeps two experts, LRU and LFU, over the same cache. Each eviction asks one expert for its
victim, expert ``i`` with probability ``w_i``, and remembers the victim's key in that
expert's history (ghosts). A miss on a key found in expert ``i``'s history means ``i`` was
wrong to evict it: ``w_i <- w_i * exp(-learning_rate * discount ** age)``, ``age`` being the
time since that eviction, and the weights are normalised to sum 1. The paper's learning
rate is 0.45 and its discount ``0.005 ** (1 / N)`` for a cache of ``N`` objects (a regret
``N`` requests old counts 0.5 % of a fresh one); each history holds ``N`` keys. Cacheus
(Rodriguez et al., "Learning Cache Replacement with CACHEUS", FAST 2021, section 4) adapts
the learning rate: every ``N`` requests it compares the window's hit rate with the previous
window's and keeps moving the rate in the direction that raised the hit rate (it also swaps
the experts for scan- and churn-resistant ones, SR-LRU and CR-LFU; here the experts are the
project's own orders).

Here the objects are free cached blocks, a *request* is a block reference (a block cached,
:meth:`on_cache`, a miss; or a prefix hit, :meth:`on_hit`), and histories are keyed by block
hash (the cache reports keys: :attr:`~EvictionPolicy.needs_keys`). ``N`` is the most
blocks cached at once (:attr:`ReuseHistory.cap`, as ``reuse`` counts it).

**Regrets take effect at the next request.** The engine and the simulator hear one
request's cache events and evictions in a different interleaving (vLLM caches a step's
blocks after it allocated the next ones; under async scheduling a retired block comes back
a step later). A regret that moved the weights at once would let an eviction see them
before the regret in one and after it in the other. So a regret heard in :meth:`on_cache`
waits until the first event of the next request (a hook that carries ``now``: ``add``,
``pop``, ``on_hit``), and evictions are stamped, and regrets aged, with the reference clock
as it stood at the first event of their request (the adaptive rate's windows are not made
exact this way: an option, not the default).

A victim whose hash is still held by another cached block leaves no ghost; a generated-token
block's key is never seen again, so its ghost never returns. Every expert holds every
candidate; when one expert gives the victim, the others withdraw it (``remove``) and drop what
they kept for the block (``forget``), except the expert that keeps the hash history: the
victim's hash goes to the history as an eviction, so ``reuse`` still sees it come back.

**Determinism.** The engine and the simulator must evict the same blocks, and :meth:`clone`
must give shadows the same future. The expert is chosen without randomness by default
(``choice="spread"``): every expert earns its weight in credit at each eviction and the one
with the most credit gives the victim and pays 1 (a smooth weighted round robin), so over
any run of evictions each expert gives its weight's share, as LeCaR's draw does on
average, from state the engine and the simulator both hold exactly. ``choice="random"``
draws as LeCaR does, from a seeded generator consumed once per victim (equally
deterministic, but a single extra or missing eviction shifts every later draw);
``choice="heaviest"`` always asks the heaviest expert.

All state is by block id and block hash; the clock counts block references. Cost per
operation: the experts' own, times their number, plus O(1).
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any, Protocol, cast

from vllm_admission.core.errors import UserError
from vllm_admission.core.eviction.base import EvictionPolicy
from vllm_admission.core.eviction.frequency import LFUEviction
from vllm_admission.core.eviction.history import ReuseHistory
from vllm_admission.core.eviction.lru import LRUEviction
from vllm_admission.core.eviction.reuse import ReuseEviction
from vllm_admission.core.eviction.s3fifo import S3FifoEviction

__all__ = ["CHOICES", "EXPERTS", "ExpertMixEviction"]

#: The orders a mix can ask for victims, by their registry names.
EXPERTS: dict[str, type[EvictionPolicy]] = {
    "lru": LRUEviction,
    "lfu": LFUEviction,
    "reuse": ReuseEviction,
    "s3fifo": S3FifoEviction,
}

class _KeepsHistory(Protocol):
    """An expert that keeps history by block hash (``keeps_history``: ``reuse``) holds
    the shared history as ``hist``."""

    hist: ReuseHistory


#: How the expert that gives a victim is chosen (module docstring).
CHOICES = ("spread", "random", "heaviest")

#: LeCaR's discount: a regret ``N`` references old counts this much of a fresh one.
DISCOUNT_AT_N = 0.005

#: Cacheus-style adaptation: bounds of the learning rate, the step factor, and how
#: many windows without a gain reset it to its start.
LR_MIN, LR_MAX, LR_STEP, LR_PATIENCE = 0.001, 1.0, 1.25, 20


class ExpertMixEviction(EvictionPolicy):
    """LeCaR-style mix of eviction orders with hash-keyed regret (module docstring).

    Args:
        experts: names of :data:`EXPERTS`, at least two, distinct (LeCaR's: ``lru``, ``lfu``).
        learning_rate: ``lambda`` of the weight update, > 0 (LeCaR: 0.45); with
            ``adaptive`` the starting rate.
        discount: per-reference discount of a regret, in (0, 1]; ``None`` (default):
            LeCaR's ``0.005 ** (1 / N)``, ``N`` the most blocks cached at once so far.
        adaptive: adapt the learning rate every ``N`` references, Cacheus-style: keep
            moving it (by a factor of 1.25) in the direction that raised the window's
            hit rate, reverse it when the hit rate fell, alternate when the window gives
            no direction, back to the start after 20 windows without a gain (Cacheus
            picks that last direction at random; here it alternates, to stay
            deterministic).
        ghost_factor: keys each expert's history holds, as a multiple of ``N``
            (LeCaR: 1), > 0.
        choice: ``"spread"`` (default), ``"random"`` or ``"heaviest"`` (module docstring).
        seed: the generator's seed for ``choice="random"``.
        history: ghost hashes of the shared :class:`ReuseHistory` (as ``reuse``'s
            option), ignored with ``shared``.
        min_weight: no weight falls below this, in [0, 1 / experts) (LeCaR: 0; a weight
            near 0 recovers only after as many regrets of the others).
        shared: a history to use and keep up to date instead of a new one (``auto``).

    Raises:
        UserError: an unknown or repeated expert, fewer than two, or a parameter out
            of range.
    """

    name = "mix"
    summary = ("LeCaR-style expert mix: each victim from lru or lfu, weighted down by "
               "regrets on hash-keyed ghosts")

    def __init__(self, experts: Sequence[str] = ("lru", "lfu"), learning_rate: float = 0.45,
                 discount: float | None = None, adaptive: bool = False,
                 ghost_factor: float = 1.0, choice: str = "spread", seed: int = 0,
                 history: float = 4.0, min_weight: float = 0.0, *,
                 shared: ReuseHistory | None = None) -> None:
        names = tuple(experts.split(",")) if isinstance(experts, str) else tuple(experts)
        unknown = [n for n in names if n not in EXPERTS]
        if unknown:
            raise UserError(f"unknown expert {unknown[0]!r}; valid: {', '.join(EXPERTS)}")
        if len(names) < 2 or len(set(names)) != len(names):
            raise UserError(f"a mix needs at least two distinct experts, got {names}")
        if not (learning_rate > 0 and math.isfinite(learning_rate)):
            raise UserError(f"learning_rate must be a finite number > 0, got {learning_rate!r}")
        if discount is not None and not 0.0 < discount <= 1.0:
            raise UserError(f"discount must be in (0, 1], got {discount!r}")
        if not (ghost_factor > 0 and math.isfinite(ghost_factor)):
            raise UserError(f"ghost_factor must be a finite number > 0, got {ghost_factor!r}")
        if not 0.0 <= min_weight < 1.0 / len(names):
            raise UserError(f"min_weight must be in [0, 1 / experts), got {min_weight!r}")
        if choice not in CHOICES:
            raise UserError(f"unknown choice {choice!r}; valid: {', '.join(CHOICES)}")
        self.expert_names = names
        self.learning_rate = self.start_rate = float(learning_rate)
        self.discount = discount
        self.adaptive = adaptive
        self.ghost_factor = ghost_factor
        self.choice = choice
        self.seed = seed
        self.min_weight = min_weight
        self.hist = shared if shared is not None else ReuseHistory(history)
        self.experts: list[EvictionPolicy] = [
            EXPERTS[n].with_history(self.hist) if EXPERTS[n].keeps_history else EXPERTS[n]()
            for n in names]
        self._wire()
        k = len(names)
        #: The experts' weights (sum 1), in the order of :attr:`expert_names`.
        self.weights = [1.0 / k] * k
        self._credit = [0.0] * k
        self._rng = random.Random(seed)
        #: Per expert: ghost hash key -> the clock at the start of the request in which
        #: that expert evicted it.
        self.ghosts: list[OrderedDict[object, int]] = [OrderedDict() for _ in names]
        # cached block -> its hash key; with a shared history (``auto`` switching to a mix
        # mid-run) the blocks cached so far, which the experts' own state lacks
        self._key: dict[int, Hashable] = self.hist.cached_keys() if shared is not None else {}
        self.clock = 0                   # block references heard
        self._now = -math.inf            # the request of the latest event that gave one
        self._epoch = 0                  # the clock at that request's first event
        self._pending: list[tuple[int, int]] = []   # regrets heard since: (expert, stamp)
        self.chosen = [0] * k            # victims each expert gave
        self.regrets = [0] * k           # regrets each expert took
        # Cacheus-style adaptation: the window's references and hits, the previous
        # window's hit rate, the rate before the last change, windows without a gain.
        self._win_refs = self._win_hits = 0
        self._prev_hit_rate = 0.0
        self._prev_rate = self.learning_rate
        self._idle = 0
        self._dither = 1

    def _wire(self) -> None:
        """Which experts hear keys and hits (those that keep no shared history)."""
        own = [e for e in self.experts if not e.keeps_history]
        self._keys_to = [e for e in own if e.needs_keys]
        self._hits_to = [e for e in own if e.needs_hits]

    @classmethod
    def with_history(cls, history: ReuseHistory, **options: Any) -> ExpertMixEviction:
        """A mix that keeps, and lets its ``reuse`` expert learn from, ``history``."""
        return cls(shared=history, **options)

    # -- what the cache hears ------------------------------------------------
    def on_cache(self, block_id: int, key: Hashable) -> None:
        for i, ghosts in enumerate(self.ghosts):
            evicted_at = ghosts.pop(key, None)
            if evicted_at is not None:
                self._pending.append((i, evicted_at))
        self._key[block_id] = key
        self.hist.cached(block_id, key)
        for e in self._keys_to:
            e.on_cache(block_id, key)
        self._tick(hit=False)

    def on_hit(self, block_id: int, now: float) -> None:
        if now != self._now:
            self._new_request(now)
        self.hist.hit(block_id)
        for e in self._hits_to:
            e.on_hit(block_id, now)
        self._tick(hit=True)

    def forget(self, block_id: int) -> None:
        self._key.pop(block_id, None)
        self.hist.dropped(block_id)
        for e in self._hits_to:
            e.forget(block_id)

    # -- learning --------------------------------------------------------------
    def _new_request(self, now: float) -> None:
        """The first event of request ``now``: the regrets heard since the last one take
        effect, and the clock that stamps evictions and ages regrets advances."""
        self._now = now
        self._epoch = self.clock
        for i, evicted_at in self._pending:
            self._regret(i, self._epoch - evicted_at)
        self._pending.clear()

    def _regret(self, i: int, age: int) -> None:
        """Expert ``i`` evicted a hash that came back ``age`` references later."""
        d = self.discount
        if d is None:
            d = DISCOUNT_AT_N ** (1.0 / self.hist.cap)
        w = self.weights
        w[i] *= math.exp(-self.learning_rate * d ** age)
        total = sum(w)
        if total < 1e-300:           # every weight underflowed: start again even
            w[:] = [1.0 / len(w)] * len(w)
        else:
            w[:] = [x / total for x in w]
        floor = self.min_weight
        low: set[int] = set()
        while floor and any(x < floor for j, x in enumerate(w) if j not in low):
            low |= {j for j, x in enumerate(w) if x < floor}      # held at the floor ...
            rest = sum(x for j, x in enumerate(w) if j not in low)
            scale = (1.0 - floor * len(low)) / rest              # ... the others share the rest
            w[:] = [floor if j in low else x * scale for j, x in enumerate(w)]
        self.regrets[i] += 1

    def _tick(self, hit: bool) -> None:
        """One block reference; with ``adaptive``, a new rate every ``N`` of them."""
        self.clock += 1
        if not self.adaptive:
            return
        self._win_refs += 1
        self._win_hits += hit
        if self._win_refs >= self.hist.cap:
            self._adapt()

    def _adapt(self) -> None:
        """Cacheus-style learning-rate step from the window's hit-rate change."""
        hit_rate = self._win_hits / self._win_refs
        d_hit = hit_rate - self._prev_hit_rate
        d_rate = self.learning_rate - self._prev_rate
        rate = self.learning_rate
        self._prev_rate = rate
        if d_rate and d_hit:
            up = (d_rate > 0) == (d_hit > 0)     # keep going where the hit rate rose
            rate = rate * LR_STEP if up else rate / LR_STEP
            self._idle = 0
        elif d_hit <= 0:
            self._idle += 1
            if self._idle >= LR_PATIENCE:
                rate, self._idle = self.start_rate, 0
            else:
                rate = rate * LR_STEP if self._dither > 0 else rate / LR_STEP
                self._dither = -self._dither
        self.learning_rate = min(LR_MAX, max(LR_MIN, rate))
        self._prev_hit_rate = hit_rate
        self._win_refs = self._win_hits = 0

    def _choose(self) -> int:
        """The expert that gives the next victim (``choice``)."""
        w = self.weights
        if self.choice == "spread":
            credit = self._credit
            for i, x in enumerate(w):
                credit[i] += x
            i = max(range(len(w)), key=credit.__getitem__)
            credit[i] -= 1.0
            return i
        if self.choice == "random":
            u = self._rng.random()
            for i, x in enumerate(w):
                u -= x
                if u < 0:
                    return i
            return len(w) - 1
        return max(range(len(w)), key=w.__getitem__)

    # -- the order -------------------------------------------------------------
    def add(self, block_id: int, now: float, value: float = 0.0,
            next_use: float = math.inf) -> None:
        if block_id in self:
            raise KeyError(f"block {block_id} is already a candidate")
        if now != self._now:
            self._new_request(now)
        for e in self.experts:
            e.add(block_id, now, value, next_use)

    def add_many(self, block_ids: Sequence[int], now: float, values: Sequence[float],
                 next_uses: Sequence[float]) -> None:
        """:meth:`add` of each block in order, to every expert."""
        if now != self._now:
            self._new_request(now)
        first = self.experts[0]
        for b in block_ids:
            if b in first:
                raise KeyError(f"block {b} is already a candidate")
        for e in self.experts:
            e.add_many(block_ids, now, values, next_uses)

    def remove(self, block_id: int) -> None:
        for e in self.experts:
            e.remove(block_id)

    def pop(self, now: float) -> int:
        return self.pop_n(1, now)[0]

    def pop_n(self, n: int, now: float) -> list[int]:
        """``n`` single pops: one choice of expert per victim."""
        if n > len(self):
            raise IndexError(f"pop {n} from an eviction queue of {len(self)}")
        if now != self._now:
            self._new_request(now)
        experts, hist = self.experts, self.hist
        out: list[int] = []
        for _ in range(n):
            i = self._choose()
            chosen = experts[i]
            v = chosen.pop(now)
            key = self._key.pop(v, None)
            for e in experts:
                if e is not chosen:
                    e.remove(v)
                    if e.needs_hits and not e.keeps_history:
                        e.forget(v)
            if not chosen.keeps_history:
                hist.age()
                hist.evicted((v,))
            self.chosen[i] += 1
            if key is not None and key not in hist.live:
                ghosts = self.ghosts[i]
                ghosts[key] = self._epoch
                ghosts.move_to_end(key)
                limit = max(1, int(self.ghost_factor * hist.cap))
                while len(ghosts) > limit:
                    ghosts.popitem(last=False)
            out.append(v)
        return out

    def clone(self) -> ExpertMixEviction:
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        other.hist = self.hist.copy()
        other.experts = []
        for e in self.experts:
            c = e.clone()
            if e.keeps_history:
                # the clone's expert learns from the clone's history
                cast(_KeepsHistory, c).hist = other.hist
            other.experts.append(c)
        other._wire()
        other.weights = self.weights[:]
        other._credit = self._credit[:]
        other._rng = random.Random()
        other._rng.setstate(self._rng.getstate())
        other.ghosts = [g.copy() for g in self.ghosts]
        other._key = dict(self._key)
        other._pending = self._pending[:]
        other.chosen = self.chosen[:]
        other.regrets = self.regrets[:]
        return other

    def __len__(self) -> int:
        return len(self.experts[0])

    def __contains__(self, block_id: int) -> bool:
        return block_id in self.experts[0]

    def __repr__(self) -> str:
        w = ", ".join(f"{n}={x:.3f}" for n, x in zip(self.expert_names, self.weights, strict=True))
        return f"ExpertMixEviction(candidates={len(self)}, weights: {w})"
