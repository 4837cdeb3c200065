"""Eviction policies: the order in which free cached blocks give up their hashes.

In vLLM 0.32 every KV cache group allocates from one ``BlockPool``. A block whose
request finished keeps its block hash and waits in ``free_block_queue``; the
queue's order is the eviction order (``vllm/v1/core/block_pool.py``:
``free_blocks`` appends cached blocks at the tail, ``get_new_blocks`` pops the
head and drops its hash). Blocks without a hash are put at the head and reused
first; they are not the eviction policy's business. An :class:`EvictionPolicy`
orders the *cached* free blocks only.

Blocks are identified by integer ids. ``add`` is called when a cached block's
reference count drops to zero, ``remove`` when a prefix hit takes it back, and
``pop`` when an allocation needs a block. A policy that declares
:attr:`~EvictionPolicy.needs_hits` also hears :meth:`~EvictionPolicy.on_hit`
for every cached block a prefix hit references (vLLM's ``BlockPool.touch``) and
:meth:`~EvictionPolicy.forget` when a block loses its hash without being popped.
Time is injected (``now``): the index of the latest request, in the simulator
and in the engine alike.

What a policy needs is declared as class attributes (capabilities), read by the
simulator and by the plugin; nothing outside this registry branches on a
policy's name:

* ``needs_values``: FLOP-efficiency values at ``add`` (the cache model computes them);
* ``needs_future``: next-use times (an oracle): simulator only;
* ``needs_hits``: the hit hook;
* ``tunable``: an ``alpha`` tuned online by :class:`~vllm_admission.core.tuning.AlphaTuner`
  when not fixed;
* ``vllm_order``: orders exactly as vLLM's ``FreeKVCacheBlockQueue``, so the
  engine keeps vLLM's own queue.

Policies:

* :class:`LRUEviction` (``lru``): vLLM's own order, block for block.
* :class:`FlopEviction` (``flop``): Marconi's utility, recency + alpha x FLOP
  efficiency, min-max normalised over the candidates (Marconi section 4.2).
* :class:`LFUEviction` (``lfu``): fewest prefix hits since the block was cached
  first, least recently freed among equals.
* :class:`BeladyEviction` (``belady``): offline reference; evicts the block whose
  hash is next needed farthest in the future. Needs the future, so the engine
  never offers it.
"""

from __future__ import annotations

import heapq
import itertools
import math
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import ClassVar

from sortedcontainers import SortedList

from vllm_admission.core.admission import UnknownPolicyError

__all__ = [
    "EVICTION_POLICIES",
    "BeladyEviction",
    "EvictionPolicy",
    "FlopEviction",
    "LFUEviction",
    "LRUEviction",
    "eviction_class",
    "get_eviction",
]


class EvictionPolicy(ABC):
    """Orders free cached blocks; :meth:`pop` returns the next victim.

    Subclasses implement the four abstract methods. ``value`` (FLOP efficiency,
    FLOPs saved per byte held) and ``next_use`` (logical time of the next
    request that needs the block's hash) are supplied by the cache model; a
    policy reads only what it needs (:attr:`needs_values`,
    :attr:`needs_future`).
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    #: Whether the cache model must compute FLOP-efficiency values.
    needs_values: ClassVar[bool] = False
    #: Whether the policy needs future knowledge (simulator only).
    needs_future: ClassVar[bool] = False
    #: Whether the cache must report prefix hits (:meth:`on_hit`, :meth:`forget`).
    needs_hits: ClassVar[bool] = False
    #: Whether the cache must report each block's hash key when it is cached
    #: (:meth:`on_cache`), so the policy can keep history by hash.
    needs_keys: ClassVar[bool] = False
    #: Whether the policy has an ``alpha`` that is tuned online unless fixed.
    tunable: ClassVar[bool] = False
    #: Whether the order is exactly vLLM's free-block queue order (the engine
    #: then keeps vLLM's own queue and calls no policy code).
    vllm_order: ClassVar[bool] = False

    @abstractmethod
    def add(self, block_id: int, now: float, value: float = 0.0,
            next_use: float = math.inf) -> None:
        """Make ``block_id`` an eviction candidate (its ref count reached 0)."""

    @abstractmethod
    def remove(self, block_id: int) -> None:
        """Withdraw a candidate (a prefix hit touched it). KeyError if absent."""

    @abstractmethod
    def pop(self, now: float) -> int:
        """Remove and return the next victim. IndexError when empty."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __contains__(self, block_id: int) -> bool: ...

    def pop_n(self, n: int, now: float) -> list[int]:
        """Pop ``n`` victims in eviction order."""
        return [self.pop(now) for _ in range(n)]

    def add_many(self, block_ids: Sequence[int], now: float, values: Sequence[float],
                 next_uses: Sequence[float]) -> None:
        """:meth:`add` for several blocks, in order (``values``/``next_uses`` aligned)."""
        for b, v, nu in zip(block_ids, values, next_uses):
            self.add(b, now, v, nu)

    def bind_future(self, refresh: Callable[[int, float], float]) -> None:
        """Give a policy that :attr:`needs_future` its oracle: ``refresh(block_id,
        now)`` is the block's next use after ``now``. Others ignore it."""

    def on_hit(self, block_id: int, now: float) -> None:
        """A prefix hit referenced cached block ``block_id`` (after :meth:`remove`
        if it was a candidate). Called only for policies that :attr:`needs_hits`."""

    def forget(self, block_id: int) -> None:
        """``block_id`` lost its hash without being popped (the plugin drops a
        superseded state, or the prefix cache is reset); it is not a candidate.
        Called only for policies that :attr:`needs_hits`."""

    def on_cache(self, block_id: int, key: object) -> None:
        """Block ``block_id`` (in use) was given the hash ``key`` (vLLM's
        ``BlockHashWithGroupId``: the group and the block hash). Called only for
        policies that :attr:`needs_keys`, before the block is ever a candidate."""

    @abstractmethod
    def clone(self) -> "EvictionPolicy":
        """An independent copy with the same candidates in the same order."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(candidates={len(self)})"


class LRUEviction(EvictionPolicy):
    """vLLM's order: first freed, first evicted (FIFO over free events).

    Within one free call vLLM passes a request's blocks tail first
    (``SingleTypeKVCacheManager.free``), so a request's last blocks go first.
    """

    name = "lru"
    summary = "vLLM's free-block queue order (least recently freed first)"
    vllm_order = True

    def __init__(self) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()

    def add(self, block_id: int, now: float, value: float = 0.0,
            next_use: float = math.inf) -> None:
        self._order[block_id] = None

    def remove(self, block_id: int) -> None:
        del self._order[block_id]

    def pop(self, now: float) -> int:
        if not self._order:
            raise IndexError("pop from an empty eviction queue")
        return self._order.popitem(last=False)[0]

    def add_many(self, block_ids: Sequence[int], now: float, values: Sequence[float],
                 next_uses: Sequence[float]) -> None:
        self._order.update(dict.fromkeys(block_ids))

    def clone(self) -> "LRUEviction":
        other = LRUEviction()
        other._order = self._order.copy()
        return other

    def pop_n(self, n: int, now: float) -> list[int]:
        if n > len(self._order):
            raise IndexError(f"pop {n} from an eviction queue of {len(self._order)}")
        pop = self._order.popitem
        return [pop(last=False)[0] for _ in range(n)]

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._order


class _Bucket:
    """Free blocks with one last-access time: runs of equal value, in free order.

    ``runs`` maps a run's sequence number to ``[value, seq, {block_id: None}]``
    (insertion-ordered, so the first run is the earliest freed). Two lazy heaps
    give the lowest and highest value in O(log runs).
    """

    __slots__ = ("t", "runs", "last", "lo", "hi", "minv", "maxv")

    def __init__(self, t: float) -> None:
        self.t = t
        self.runs: dict[int, list] = {}
        self.last: list | None = None
        self.lo: list[tuple[float, int]] = []   # (value, seq), lazy
        self.hi: list[tuple[float, int]] = []   # (-value, seq), lazy
        self.minv = math.inf   # as indexed in FlopEviction._by_min
        self.maxv = -math.inf  # as indexed in FlopEviction._by_max

    def add_run(self, run: list) -> None:
        self.runs[run[1]] = run
        self.last = run
        heapq.heappush(self.lo, (run[0], run[1]))
        heapq.heappush(self.hi, (-run[0], run[1]))

    def drop_run(self, run: list) -> None:
        del self.runs[run[1]]
        if self.last is run:
            self.last = None

    def lowest_run(self) -> list:
        lo, runs = self.lo, self.runs
        while lo[0][1] not in runs:
            heapq.heappop(lo)
        return runs[lo[0][1]]

    def bounds(self) -> tuple[float, float]:
        """(lowest, highest) value among the runs; the bucket must be non-empty."""
        hi, runs = self.hi, self.runs
        while hi[0][1] not in runs:
            heapq.heappop(hi)
        return self.lowest_run()[0], -hi[0][0]


class FlopEviction(EvictionPolicy):
    """Marconi's FLOP-aware eviction over free cached blocks.

    Utility of a candidate ``n`` (Marconi section 4.2)::

        S(n) = norm(recency(n)) + alpha * norm(flop_efficiency(n))
        recency(n) = 1 / (now - last_access(n) + 1)

    ``norm`` is min-max normalisation over the current candidates; the lowest
    ``S`` is evicted (ties: the earlier freed block). ``alpha = 0`` is recency
    only, which orders exactly like LRU. ``flop_efficiency`` is the ``value``
    passed to :meth:`add`: FLOPs a hit on the block's segment saves, per byte
    the segment holds (computed by the cache model; see ``HybridPrefixCache``).
    The "+ 1" keeps recency finite for a block freed at the current logical
    time (Marconi's formula has ``now - last_access`` alone).

    The exact minimum is found without rescanning the candidates. Blocks freed
    at the same time share their recency term, so candidates are kept in
    buckets by last access (a request frees all its blocks at one time), each
    holding runs of equal value. A bucket's best block is its lowest-value run's
    first block, with utility ``R(t) + alpha * norm(minv)``. Fagin's threshold
    algorithm then walks two sorted bucket indexes, by time and by minimum
    value, and stops once no unseen bucket can beat the best one seen. A walk
    visits a few buckets; each pop costs O(log buckets).
    """

    name = "flop"
    summary = "Marconi's utility: recency + alpha x FLOPs saved per byte (min-max normalised)"
    needs_values = True
    tunable = True

    def __init__(self, alpha: float = 0.0) -> None:
        self.alpha = alpha  # validated by the property setter
        self._seq = itertools.count()
        self._where: dict[int, tuple[_Bucket, list]] = {}   # id -> (bucket, run)
        self._buckets: dict[float, _Bucket] = {}
        self._times: SortedList = SortedList()               # bucket times
        self._by_min: SortedList = SortedList()              # (minv, t)
        self._by_max: SortedList = SortedList()              # (maxv, t)
        #: Buckets inspected by the last :meth:`pop` (for benchmarks).
        self.last_scan = 0

    @property
    def alpha(self) -> float:
        """Weight of the FLOP-efficiency term (>= 0)."""
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        if not (isinstance(value, (int, float)) and value >= 0.0 and math.isfinite(value)):
            raise ValueError(f"alpha must be a finite number >= 0, got {value!r}")
        self._alpha = float(value)

    def clone(self) -> "FlopEviction":
        other = FlopEviction(self._alpha)
        start = next(self._seq)
        self._seq = itertools.count(start + 1)
        other._seq = itertools.count(start + 1)
        for t, b in self._buckets.items():
            nb = _Bucket(t)
            for v, seq, members in b.runs.values():
                run = [v, seq, dict(members)]
                nb.add_run(run)
                for bid in members:
                    other._where[bid] = (nb, run)
            nb.last = nb.runs.get(b.last[1]) if b.last is not None else None
            nb.minv, nb.maxv = b.minv, b.maxv
            other._buckets[t] = nb
        other._times = self._times.copy()
        other._by_min = self._by_min.copy()
        other._by_max = self._by_max.copy()
        return other

    # -- bookkeeping -----------------------------------------------------
    def _reindex(self, b: _Bucket) -> None:
        """Refresh a bucket's (min, max) value in the indexes after a change."""
        if b.runs:
            lo, hi = b.bounds()
        else:
            lo, hi = math.inf, -math.inf
        if lo != b.minv:
            if b.minv != math.inf:
                self._by_min.remove((b.minv, b.t))
            if lo != math.inf:
                self._by_min.add((lo, b.t))
            b.minv = lo
        if hi != b.maxv:
            if b.maxv != -math.inf:
                self._by_max.remove((b.maxv, b.t))
            if hi != -math.inf:
                self._by_max.add((hi, b.t))
            b.maxv = hi
        if not b.runs:
            del self._buckets[b.t]
            self._times.remove(b.t)

    def add(self, block_id: int, now: float, value: float = 0.0,
            next_use: float = math.inf) -> None:
        if block_id in self._where:
            raise KeyError(f"block {block_id} is already a candidate")
        b = self._buckets.get(now)
        if b is None:
            if self._times and now < self._times[-1]:
                raise ValueError(f"time went backwards: {now} < {self._times[-1]}")
            b = self._buckets[now] = _Bucket(now)
            self._times.add(now)
        run = b.last
        if run is None or run[0] != value:
            run = [value, next(self._seq), {}]
            b.add_run(run)
        run[2][block_id] = None
        self._where[block_id] = (b, run)
        if value < b.minv or value > b.maxv:
            self._reindex(b)

    def remove(self, block_id: int) -> None:
        b, run = self._where.pop(block_id)
        del run[2][block_id]
        if not run[2]:
            b.drop_run(run)
            if not b.runs or run[0] == b.minv or run[0] == b.maxv:
                self._reindex(b)

    def utility(self, block_id: int, now: float) -> float:
        """``S(n)`` of a candidate at time ``now`` (for tests and reports)."""
        b, run = self._where[block_id]
        rec_term, val_term = self._normalisers(now)
        return rec_term(b.t) + val_term(run[0])

    def _normalisers(self, now: float):
        t_old, t_new = self._times[0], self._times[-1]
        r_min, r_max = 1.0 / (now - t_old + 1.0), 1.0 / (now - t_new + 1.0)
        r_span = r_max - r_min
        v_min, v_max = self._by_min[0][0], self._by_max[-1][0]
        v_span = v_max - v_min
        alpha = self._alpha

        def rec_term(t: float) -> float:
            return (1.0 / (now - t + 1.0) - r_min) / r_span if r_span > 0 else 0.0

        if v_span > 0 and alpha:
            def val_term(v: float) -> float:
                return alpha * (v - v_min) / v_span
        else:
            def val_term(v: float) -> float:
                return 0.0
        return rec_term, val_term

    def _best_run(self, now: float) -> list:
        """The run holding the lowest-utility block (threshold walk over buckets)."""
        rec_term, val_term = self._normalisers(now)
        buckets = self._buckets
        best_s, best_t = math.inf, math.inf
        scanned = 0
        for t_i, (minv_j, t_j) in zip(self._times, self._by_min):
            scanned += 1
            s_i = rec_term(t_i)
            cand = s_i + val_term(buckets[t_i].minv)
            if cand < best_s or (cand == best_s and t_i < best_t):
                best_s, best_t = cand, t_i
            cand = rec_term(t_j) + val_term(minv_j)
            if cand < best_s or (cand == best_s and t_j < best_t):
                best_s, best_t = cand, t_j
            # An unseen bucket is no older than t_i and holds no value below minv_j.
            if best_s <= s_i + val_term(minv_j):
                break
        self.last_scan = scanned
        bucket = buckets[best_t]
        if val_term(self._by_max[-1][0]) > 0.0:
            return bucket.lowest_run()
        return next(iter(bucket.runs.values()))  # all tie: the first freed goes

    def pop(self, now: float) -> int:
        if not self._where:
            raise IndexError("pop from an empty eviction queue")
        victim = next(iter(self._best_run(now)[2]))
        self.remove(victim)
        return victim

    def pop_n(self, n: int, now: float) -> list[int]:
        """Pop ``n`` victims. The winning run is drained while it lasts: its
        blocks share time and value, and the normalisation bounds cannot move
        until the run empties, so this is the same order as ``n`` pops."""
        if n > len(self._where):
            raise IndexError(f"pop {n} from an eviction queue of {len(self._where)}")
        out: list[int] = []
        while len(out) < n:
            run = self._best_run(now)
            members = run[2]
            take = min(n - len(out), len(members))
            it = iter(members)
            victims = [next(it) for _ in range(take)]
            for v in victims:
                self.remove(v)
            out.extend(victims)
        return out

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._where


class LFUEviction(EvictionPolicy):
    """Least frequently used: the candidate with the fewest prefix hits goes first.

    A block's count is the number of prefix hits that referenced it since it
    got its hash (:meth:`on_hit`); it starts at 0 and is forgotten when the
    block is evicted (:meth:`pop`) or loses its hash otherwise
    (:meth:`forget`). Among candidates with equal counts the least recently
    freed goes first (vLLM's order), so with no hits at all this is ``lru``.
    A classic frequency baseline (no aging); see docs/results.md for how it
    does on the Mooncake trace.
    """

    name = "lfu"
    summary = "fewest prefix hits since cached first, least recently freed among equals"
    needs_hits = True

    def __init__(self) -> None:
        self._hits: dict[int, int] = {}
        self._levels: dict[int, OrderedDict[int, None]] = {}   # hits -> candidates in free order
        self._counts: SortedList = SortedList()                # hit counts with candidates
        self._level_of: dict[int, int] = {}                    # candidate -> its level

    def add(self, block_id: int, now: float, value: float = 0.0,
            next_use: float = math.inf) -> None:
        if block_id in self._level_of:
            raise KeyError(f"block {block_id} is already a candidate")
        k = self._hits.get(block_id, 0)
        level = self._levels.get(k)
        if level is None:
            level = self._levels[k] = OrderedDict()
            self._counts.add(k)
        level[block_id] = None
        self._level_of[block_id] = k

    def remove(self, block_id: int) -> None:
        k = self._level_of.pop(block_id)
        level = self._levels[k]
        del level[block_id]
        if not level:
            del self._levels[k]
            self._counts.remove(k)

    def pop(self, now: float) -> int:
        if not self._level_of:
            raise IndexError("pop from an empty eviction queue")
        k = self._counts[0]
        level = self._levels[k]
        block_id = level.popitem(last=False)[0]
        if not level:
            del self._levels[k]
            self._counts.remove(k)
        del self._level_of[block_id]
        self._hits.pop(block_id, None)
        return block_id

    def on_hit(self, block_id: int, now: float) -> None:
        self._hits[block_id] = self._hits.get(block_id, 0) + 1

    def forget(self, block_id: int) -> None:
        self._hits.pop(block_id, None)

    def clone(self) -> "LFUEviction":
        other = LFUEviction()
        other._hits = dict(self._hits)
        other._levels = {k: v.copy() for k, v in self._levels.items()}
        other._counts = self._counts.copy()
        other._level_of = dict(self._level_of)
        return other

    def __len__(self) -> int:
        return len(self._level_of)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._level_of


class BeladyEviction(EvictionPolicy):
    """Offline reference: evict the block whose hash is needed farthest ahead.

    ``next_use`` is the logical time of the next request whose prompt contains
    the block's hash (infinity if none); ties go to the earlier freed block.

    A predicted use can pass without touching the block (the later request's
    hybrid hit stopped short of it). Such a stale prediction is refreshed with
    ``refresh(block_id, now)`` before any eviction, so a block never keeps a
    next use in the past. For a hybrid cache this is a strong reference, not a
    proven optimum: a state block is only useful if a hit ends exactly on it.

    Args:
        refresh: ``f(block_id, now) -> next use after now``; the cache model
            binds it through :meth:`bind_future`.
    """

    name = "belady"
    summary = "offline reference: evict the block next needed farthest in the future"
    needs_future = True

    def __init__(self, refresh: Callable[[int, float], float] | None = None) -> None:
        self.refresh = refresh
        self._seq = itertools.count()
        self._entries: dict[int, tuple[float, int]] = {}
        self._order: SortedList = SortedList()  # (-next_use, seq, id): farthest first

    def add(self, block_id: int, now: float, value: float = 0.0,
            next_use: float = math.inf) -> None:
        seq = next(self._seq)
        self._entries[block_id] = (next_use, seq)
        self._order.add((-next_use, seq, block_id))

    def remove(self, block_id: int) -> None:
        nu, seq = self._entries.pop(block_id)
        self._order.remove((-nu, seq, block_id))

    def bind_future(self, refresh: Callable[[int, float], float]) -> None:
        self.refresh = refresh

    def clone(self) -> "BeladyEviction":
        other = BeladyEviction(self.refresh)
        start = next(self._seq)
        self._seq = itertools.count(start + 1)
        other._seq = itertools.count(start + 1)
        other._entries = dict(self._entries)
        other._order = self._order.copy()
        return other

    def _refresh_stale(self, now: float) -> None:
        order, entries = self._order, self._entries
        while order and -order[-1][0] <= now:
            _, seq, bid = order.pop()
            nu = self.refresh(bid, now) if self.refresh else math.inf
            entries[bid] = (nu, seq)
            order.add((-nu, seq, bid))

    def pop(self, now: float) -> int:
        if not self._entries:
            raise IndexError("pop from an empty eviction queue")
        self._refresh_stale(now)
        _, seq, bid = self._order.pop(0)
        del self._entries[bid]
        return bid

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._entries


def _age_bin(age: float) -> int:
    """Log-spaced age bin: 4 bins per doubling of ``age + 1`` (scale-free)."""
    return min(int(4.0 * math.log2(age + 1.0)), _LHD_BINS - 1)


_LHD_BINS = 80
#: Representative age of each bin (its geometric middle).
_LHD_AGES = [2.0 ** ((j + 0.5) / 4.0) - 1.0 for j in range(_LHD_BINS)]


class LHDEviction(EvictionPolicy):
    """Least hit density (Beckmann, Chen and Cidon, "LHD: Improving Cache Hit
    Rate by Maximizing Hit Density", NSDI 2018), over free cached blocks.

    A candidate's *age* is the time since it was last freed. For each class of
    blocks the policy keeps two histograms over age: hits (a prefix hit took a
    block back at that age) and evictions. From them it estimates, for a block
    of age ``a``, its hit density: the probability that it is hit again over
    the expected space-time it will still occupy::

        density(a) = sum_{x >= a} H[x] / sum_{x >= a} (x - a + 1) (H[x] + E[x])

    and evicts the candidate with the lowest density. Where reuse comes after a
    typical distance longer than the cache holds (Mooncake: the median
    conversation turn returns after ~2x what 64 GiB holds), density rises with
    age up to that distance, so young unproven blocks go first and blocks that
    have waited long are kept to their reuse; once past the typical distance,
    density falls and they go. LRU instead always evicts the oldest.

    Classes: the block's hit count since cached (0, 1, 2, 3+). Ages are binned
    on a log scale (4 bins per doubling), histograms decay by half every time
    as many events were recorded as there are candidates (one turnover of the
    cache), and densities are recomputed when ``now`` advances. Candidates are
    kept in buckets by (class, free time); within the chosen (class, age bin)
    the oldest bucket goes first, a bucket in free order (vLLM's tail first).
    """

    name = "lhd"
    summary = "least hit density (LHD): learned hit probability per byte-time by age and hit count"
    needs_hits = True

    CLASSES = 4

    def __init__(self) -> None:
        C = self.CLASSES
        self._hits_h = [[0.0] * _LHD_BINS for _ in range(C)]
        self._evict_h = [[0.0] * _LHD_BINS for _ in range(C)]
        self._events = 0.0
        self._cls: dict[int, int] = {}          # cached block -> hit count (capped)
        self._freed: dict[int, float] = {}      # cached block -> last free time
        self._where: dict[int, tuple[int, float]] = {}   # candidate -> (class, time)
        self._buckets: list[dict[float, dict[int, None]]] = [{} for _ in range(C)]
        self._times: list[SortedList] = [SortedList() for _ in range(C)]
        self._order: list[tuple[int, int]] = []   # (class, bin) by ascending density
        self._order_at: float | None = None

    # -- statistics ------------------------------------------------------
    def _record(self, hist: list[list[float]], c: int, age: float) -> None:
        hist[c][_age_bin(age)] += 1.0
        self._events += 1.0
        if self._events > max(len(self._where), 1024):
            for h in (self._hits_h, self._evict_h):
                for row in h:
                    for j in range(_LHD_BINS):
                        row[j] *= 0.5
            self._events = 0.0
            self._order_at = None

    def _densities(self) -> list[tuple[float, int, int]]:
        out = []
        ages = _LHD_AGES
        for c in range(self.CLASSES):
            H, E = self._hits_h[c], self._evict_h[c]
            hits_up = events_up = 0.0
            weighted_up = 0.0   # sum_{x >= a} age_x * events_x
            for j in range(_LHD_BINS - 1, -1, -1):
                hits_up += H[j]
                events_up += H[j] + E[j]
                weighted_up += ages[j] * (H[j] + E[j])
                life = weighted_up - (ages[j] - 1.0) * events_up
                d = hits_up / life if life > 0 else 0.0
                out.append((d, c, j))
        out.sort(key=lambda t: (t[0], -t[2]))
        return out

    def _plan(self, now: float) -> list[tuple[int, int]]:
        if self._order_at != now:
            self._order = [(c, j) for _, c, j in self._densities()]
            self._order_at = now
        return self._order

    # -- interface -------------------------------------------------------
    def add(self, block_id: int, now: float, value: float = 0.0,
            next_use: float = math.inf) -> None:
        if block_id in self._where:
            raise KeyError(f"block {block_id} is already a candidate")
        c = min(self._cls.get(block_id, 0), self.CLASSES - 1)
        self._freed[block_id] = now
        b = self._buckets[c].get(now)
        if b is None:
            b = self._buckets[c][now] = {}
            self._times[c].add(now)
        b[block_id] = None
        self._where[block_id] = (c, now)

    def remove(self, block_id: int) -> None:
        c, t = self._where.pop(block_id)
        b = self._buckets[c][t]
        del b[block_id]
        if not b:
            del self._buckets[c][t]
            self._times[c].remove(t)

    def on_hit(self, block_id: int, now: float) -> None:
        t = self._freed.get(block_id)
        k = self._cls.get(block_id, 0)
        if t is not None:
            self._record(self._hits_h, min(k, self.CLASSES - 1), now - t)
        self._cls[block_id] = k + 1

    def forget(self, block_id: int) -> None:
        self._cls.pop(block_id, None)
        self._freed.pop(block_id, None)

    def _victim_bucket(self, now: float) -> tuple[int, float]:
        for c, j in self._plan(now):
            times = self._times[c]
            if not times:
                continue
            # ages in bin j: 2^(j/4) - 1 <= age < 2^((j+1)/4) - 1
            lo_age = 2.0 ** (j / 4.0) - 1.0
            hi_age = 2.0 ** ((j + 1) / 4.0) - 1.0 if j < _LHD_BINS - 1 else math.inf
            # times with now - t in [lo_age, hi_age): t in (now - hi_age, now - lo_age]
            k = times.bisect_right(now - hi_age)
            if k < len(times) and times[k] <= now - lo_age:
                t = times[k]
                if _age_bin(now - t) == j:
                    return c, t
                # float edge: fall through to the exact bin check below
        c = min(range(self.CLASSES), key=lambda c: self._times[c][0] if self._times[c] else math.inf)
        return c, self._times[c][0]

    def pop(self, now: float) -> int:
        return self.pop_n(1, now)[0]

    def pop_n(self, n: int, now: float) -> list[int]:
        if n > len(self._where):
            raise IndexError(f"pop {n} from an eviction queue of {len(self._where)}")
        out: list[int] = []
        while len(out) < n:
            c, t = self._victim_bucket(now)
            b = self._buckets[c][t]
            while b and len(out) < n:
                bid = next(iter(b))
                del b[bid]
                out.append(bid)
            if not b:
                del self._buckets[c][t]
                self._times[c].remove(t)
        for bid in out:
            c, t = self._where.pop(bid)
            self._record(self._evict_h, c, now - t)
            self._cls.pop(bid, None)
            self._freed.pop(bid, None)
        return out

    def clone(self) -> "LHDEviction":
        other = LHDEviction()
        other._hits_h = [r[:] for r in self._hits_h]
        other._evict_h = [r[:] for r in self._evict_h]
        other._events = self._events
        other._cls = dict(self._cls)
        other._freed = dict(self._freed)
        other._where = dict(self._where)
        other._buckets = [{t: dict(b) for t, b in bs.items()} for bs in self._buckets]
        other._times = [s.copy() for s in self._times]
        return other

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._where


class ARCEviction(EvictionPolicy):
    """Adaptive replacement (Megiddo and Modha, "ARC: A Self-Tuning, Low
    Overhead Replacement Cache", FAST 2003) over free cached blocks, with its
    history keyed by block hash so that it survives eviction.

    A cached block is *recent* (T1) while its hash has been seen once, and
    *frequent* (T2) once its hash was seen again: a prefix hit took it, or the
    hash was cached again (a request recomputed a prefix that an earlier one
    had cached, in this block or in one evicted since). Evicted hashes are
    remembered in two ghost lists, B1 (evicted from T1) and B2 (from T2), each
    as long as the cache. A hash cached again while in B1 means recent blocks
    were evicted too early: the target share ``p`` of T1 grows; one in B2
    shrinks it. The victim is T1's least recently freed candidate while T1
    holds more than ``p`` candidates, otherwise T2's.

    Needs the block hashes (:attr:`needs_keys`): the ghosts are keyed by hash,
    which is what lets it see reuse at distances longer than the cache holds.
    """

    name = "arc"
    summary = "ARC: recent vs frequent free blocks, adapted by hash-keyed ghosts of evictions"
    needs_hits = True
    needs_keys = True

    def __init__(self, t1_share: float | None = None) -> None:
        self.t1_share = t1_share
        self._key: dict[int, object] = {}        # cached block -> its hash key
        self._live: dict[object, int] = {}       # hash key -> cached blocks holding it
        self._freq: dict[object, int] = {}       # hash key -> times seen (live or ghost)
        self._t1: OrderedDict[int, None] = OrderedDict()
        self._t2: OrderedDict[int, None] = OrderedDict()
        self._b1: OrderedDict[object, None] = OrderedDict()
        self._b2: OrderedDict[object, None] = OrderedDict()
        self._p = 0.0
        self._cap = 1

    def on_cache(self, block_id: int, key: object) -> None:
        self._key[block_id] = key
        n = len(self._key)
        if n > self._cap:
            self._cap = n
        live = self._live.get(key, 0)
        self._live[key] = live + 1
        if key in self._b1:
            del self._b1[key]
            self._p = min(self._p + max(1.0, len(self._b2) / max(len(self._b1), 1)), self._cap)
            self._freq[key] += 1
        elif key in self._b2:
            del self._b2[key]
            self._p = max(self._p - max(1.0, len(self._b1) / max(len(self._b2), 1)), 0.0)
            self._freq[key] += 1
        elif live:
            self._freq[key] += 1
        else:
            self._freq[key] = 1

    def on_hit(self, block_id: int, now: float) -> None:
        key = self._key.get(block_id)
        if key is not None:
            self._freq[key] += 1

    def add(self, block_id: int, now: float, value: float = 0.0,
            next_use: float = math.inf) -> None:
        if block_id in self._t1 or block_id in self._t2:
            raise KeyError(f"block {block_id} is already a candidate")
        key = self._key.get(block_id)
        if key is not None and self._freq.get(key, 1) >= 2:
            self._t2[block_id] = None
        else:
            self._t1[block_id] = None

    def remove(self, block_id: int) -> None:
        if block_id in self._t1:
            del self._t1[block_id]
        else:
            del self._t2[block_id]

    def _drop(self, block_id: int, ghost: OrderedDict | None) -> None:
        key = self._key.pop(block_id, None)
        if key is None:
            return
        live = self._live[key] - 1
        if live:
            self._live[key] = live
            return
        del self._live[key]
        if ghost is None:
            del self._freq[key]
            return
        ghost[key] = None
        ghost.move_to_end(key)
        while len(ghost) > self._cap:
            old, _ = ghost.popitem(last=False)
            if old not in self._live and old not in self._b1 and old not in self._b2:
                self._freq.pop(old, None)

    def forget(self, block_id: int) -> None:
        self._drop(block_id, None)

    def pop(self, now: float) -> int:
        t1, t2 = self._t1, self._t2
        if not t1 and not t2:
            raise IndexError("pop from an empty eviction queue")
        p = self._p if self.t1_share is None else self.t1_share * self._cap
        if t1 and (len(t1) > p or not t2):
            b = t1.popitem(last=False)[0]
            self._drop(b, self._b1)
        else:
            b = t2.popitem(last=False)[0]
            self._drop(b, self._b2)
        return b

    def pop_n(self, n: int, now: float) -> list[int]:
        if n > len(self):
            raise IndexError(f"pop {n} from an eviction queue of {len(self)}")
        return [self.pop(now) for _ in range(n)]

    def clone(self) -> "ARCEviction":
        other = ARCEviction(self.t1_share)
        other._key, other._live, other._freq = dict(self._key), dict(self._live), dict(self._freq)
        other._t1, other._t2 = self._t1.copy(), self._t2.copy()
        other._b1, other._b2 = self._b1.copy(), self._b2.copy()
        other._p, other._cap = self._p, self._cap
        return other

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._t1 or block_id in self._t2


class LFUDAEviction(EvictionPolicy):
    """LFU with dynamic aging (Arlitt et al., "Evaluating content management
    techniques for Web proxy caches", 2000; GreedyDual-Size-Frequency with
    unit cost and size), with frequencies keyed by block hash.

    A hash's frequency counts the requests that used it: each time a block is
    cached with it (a prefill computed it) and each prefix hit that takes it.
    It is kept while the hash is cached and for a while after its last block is
    evicted (a ghost entry; the ``history`` most recently evicted hashes,
    default 4x the most blocks ever cached), so a prefix recomputed after an
    eviction resumes its count. A freed block's key is ``L + freq``, where the
    clock ``L`` is the key of the last victim; the lowest key goes first, the
    least recently freed among equals (so with no reuse at all this is LRU).
    The clock ages out blocks that were popular long ago, which plain
    :class:`LFUEviction` never does.
    """

    name = "lfuda"
    summary = "LFU with dynamic aging, frequencies by block hash kept past eviction"
    needs_hits = True
    needs_keys = True

    def __init__(self, history: int | None = None, weight: str = "linear") -> None:
        self.history = history
        self.weight = weight
        self._key: dict[int, object] = {}
        self._live: dict[object, int] = {}
        self._freq: dict[object, int] = {}
        self._ghost: OrderedDict[object, None] = OrderedDict()
        self._cap = 1
        self._clock = 0.0
        self._where: dict[int, float] = {}
        self._levels: dict[float, OrderedDict[int, None]] = {}
        self._keys: SortedList = SortedList()

    def _w(self, f: int) -> float:
        if self.weight == "linear":
            return float(f)
        if self.weight == "log":
            return math.log2(1 + f)
        return math.sqrt(f)

    def on_cache(self, block_id: int, key: object) -> None:
        self._key[block_id] = key
        if len(self._key) > self._cap:
            self._cap = len(self._key)
        live = self._live.get(key, 0)
        self._live[key] = live + 1
        if key in self._ghost:
            del self._ghost[key]
        if live == 0 or True:
            self._freq[key] = self._freq.get(key, 0) + 1

    def on_hit(self, block_id: int, now: float) -> None:
        key = self._key.get(block_id)
        if key is not None:
            self._freq[key] += 1

    def add(self, block_id: int, now: float, value: float = 0.0,
            next_use: float = math.inf) -> None:
        if block_id in self._where:
            raise KeyError(f"block {block_id} is already a candidate")
        key = self._key.get(block_id)
        k = self._clock + self._w(self._freq.get(key, 1) if key is not None else 1)
        level = self._levels.get(k)
        if level is None:
            level = self._levels[k] = OrderedDict()
            self._keys.add(k)
        level[block_id] = None
        self._where[block_id] = k

    def remove(self, block_id: int) -> None:
        k = self._where.pop(block_id)
        level = self._levels[k]
        del level[block_id]
        if not level:
            del self._levels[k]
            self._keys.remove(k)

    def _drop(self, block_id: int, keep_history: bool) -> None:
        key = self._key.pop(block_id, None)
        if key is None:
            return
        live = self._live[key] - 1
        if live:
            self._live[key] = live
            return
        del self._live[key]
        if not keep_history:
            self._freq.pop(key, None)
            return
        ghost = self._ghost
        ghost[key] = None
        limit = self.history if self.history is not None else 4 * self._cap
        while len(ghost) > limit:
            old, _ = ghost.popitem(last=False)
            self._freq.pop(old, None)

    def forget(self, block_id: int) -> None:
        self._drop(block_id, False)

    def pop(self, now: float) -> int:
        return self.pop_n(1, now)[0]

    def pop_n(self, n: int, now: float) -> list[int]:
        if n > len(self._where):
            raise IndexError(f"pop {n} from an eviction queue of {len(self._where)}")
        out: list[int] = []
        while len(out) < n:
            k = self._keys[0]
            level = self._levels[k]
            while level and len(out) < n:
                b = level.popitem(last=False)[0]
                del self._where[b]
                self._drop(b, True)
                out.append(b)
            if not level:
                del self._levels[k]
                self._keys.remove(k)
            self._clock = k
        return out

    def clone(self) -> "LFUDAEviction":
        other = LFUDAEviction(self.history, self.weight)
        other._key, other._live, other._freq = dict(self._key), dict(self._live), dict(self._freq)
        other._ghost = self._ghost.copy()
        other._cap, other._clock = self._cap, self._clock
        other._where = dict(self._where)
        other._levels = {k: v.copy() for k, v in self._levels.items()}
        other._keys = self._keys.copy()
        return other

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._where


class LHDGEviction(EvictionPolicy):
    """LHD with hash-keyed history (uncensored reuse statistics)."""

    name = "lhdg"
    summary = "least hit density, learned from hash-keyed reuse ages (ghosts)"
    needs_hits = True
    needs_keys = True

    def __init__(self, classes: int = 4, history: float = 4.0, decay: float = 1.0,
                 within: str = "oldest") -> None:
        self.classes = classes
        self.history = history
        self.decay = decay
        self.within = within
        C = classes
        self._H = [[0.0] * _LHD_BINS for _ in range(C)]
        self._E = [[0.0] * _LHD_BINS for _ in range(C)]
        self._events = 0.0
        self._key: dict[int, object] = {}        # cached block -> key
        self._live: dict[object, int] = {}
        self._refs: dict[object, int] = {}       # key -> references so far
        self._last: dict[object, float] = {}     # key -> last reference time
        self._ghost: OrderedDict[object, None] = OrderedDict()
        self._cap = 1
        self._now = 0.0
        self._where: dict[int, tuple[int, float]] = {}
        self._buckets: list[dict[float, dict[int, None]]] = [{} for _ in range(C)]
        self._times: list[SortedList] = [SortedList() for _ in range(C)]
        self._plan: list[tuple[int, int]] = []
        self._plan_at: float | None = None
        self._ptr = 0

    def _record(self, hist, c: int, age: float) -> None:
        hist[c][_age_bin(age)] += 1.0
        self._events += 1.0
        if self._events > self.decay * self._cap:
            for h in (self._H, self._E):
                for row in h:
                    for j in range(_LHD_BINS):
                        row[j] *= 0.5
            self._events = 0.0
            self._plan_at = None

    def _ref(self, key: object, now: float) -> None:
        r = self._refs.get(key, 0)
        if r:
            self._record(self._H, min(r - 1, self.classes - 1), now - self._last[key])
        self._refs[key] = r + 1
        self._last[key] = now
        self._now = now

    def on_cache(self, block_id: int, key: object) -> None:
        self._key[block_id] = key
        if len(self._key) > self._cap:
            self._cap = len(self._key)
        live = self._live.get(key, 0)
        self._live[key] = live + 1
        if key in self._ghost:
            del self._ghost[key]
        if not live:
            self._ref(key, self._now)

    def on_hit(self, block_id: int, now: float) -> None:
        key = self._key.get(block_id)
        if key is not None:
            self._ref(key, now)

    def _class(self, block_id: int) -> int:
        key = self._key.get(block_id)
        r = self._refs.get(key, 1) if key is not None else 1
        return min(r - 1, self.classes - 1)

    def add(self, block_id: int, now: float, value: float = 0.0,
            next_use: float = math.inf) -> None:
        if block_id in self._where:
            raise KeyError(f"block {block_id} is already a candidate")
        self._now = now
        c = self._class(block_id)
        b = self._buckets[c].get(now)
        if b is None:
            b = self._buckets[c][now] = {}
            self._times[c].add(now)
            self._ptr = 0
        b[block_id] = None
        self._where[block_id] = (c, now)

    def remove(self, block_id: int) -> None:
        c, t = self._where.pop(block_id)
        b = self._buckets[c][t]
        del b[block_id]
        if not b:
            del self._buckets[c][t]
            self._times[c].remove(t)

    def _drop(self, block_id: int, now: float, keep: bool) -> None:
        key = self._key.pop(block_id, None)
        if key is None:
            return
        live = self._live[key] - 1
        if live:
            self._live[key] = live
            return
        del self._live[key]
        if not keep:
            self._refs.pop(key, None)
            self._last.pop(key, None)
            return
        ghost = self._ghost
        ghost[key] = None
        limit = self.history * self._cap
        while len(ghost) > limit:
            old, _ = ghost.popitem(last=False)
            r = self._refs.pop(old)
            t = self._last.pop(old)
            self._record(self._E, min(r - 1, self.classes - 1), now - t)

    def forget(self, block_id: int) -> None:
        self._drop(block_id, self._now, False)

    def _densities(self):
        out = []
        ages = _LHD_AGES
        for c in range(self.classes):
            H, E = self._H[c], self._E[c]
            hits_up = events_up = weighted_up = 0.0
            for j in range(_LHD_BINS - 1, -1, -1):
                hits_up += H[j]
                ev = H[j] + E[j]
                events_up += ev
                weighted_up += ages[j] * ev
                life = weighted_up - (ages[j] - 1.0) * events_up
                out.append((hits_up / life if life > 0 else 0.0, c, j))
        out.sort(key=lambda t: (t[0], -t[2]))
        return [(c, j) for _, c, j in out]

    def _victim(self, now: float) -> tuple[int, float]:
        if self._plan_at != now:
            self._plan = self._densities()
            self._plan_at = now
            self._ptr = 0
        plan = self._plan
        while self._ptr < len(plan):
            c, j = plan[self._ptr]
            times = self._times[c]
            if times:
                lo_age = 2.0 ** (j / 4.0) - 1.0
                hi_age = 2.0 ** ((j + 1) / 4.0) - 1.0 if j < _LHD_BINS - 1 else math.inf
                if self.within == "oldest":
                    k = times.bisect_left(now - hi_age)
                    while k < len(times) and _age_bin(now - times[k]) > j:
                        k += 1
                    if k < len(times) and _age_bin(now - times[k]) == j:
                        return c, times[k]
                else:
                    k = times.bisect_right(now - lo_age) - 1
                    while k >= 0 and _age_bin(now - times[k]) < j:
                        k -= 1
                    if k >= 0 and _age_bin(now - times[k]) == j:
                        return c, times[k]
            self._ptr += 1
        raise AssertionError("no candidate found")

    def pop(self, now: float) -> int:
        return self.pop_n(1, now)[0]

    def pop_n(self, n: int, now: float) -> list[int]:
        if n > len(self._where):
            raise IndexError(f"pop {n} from an eviction queue of {len(self._where)}")
        self._now = now
        out: list[int] = []
        while len(out) < n:
            c, t = self._victim(now)
            b = self._buckets[c][t]
            while b and len(out) < n:
                bid = next(iter(b))
                del b[bid]
                del self._where[bid]
                out.append(bid)
            if not b:
                del self._buckets[c][t]
                self._times[c].remove(t)
        for bid in out:
            self._drop(bid, now, True)
        return out

    def clone(self) -> "LHDGEviction":
        import copy
        return copy.deepcopy(self)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._where


class WeightedLRUEviction(EvictionPolicy):
    """Class-weighted LRU with hash-keyed reuse statistics (prototype)."""

    name = "wlru"
    summary = "LRU whose lifetime scales with the learned reuse probability of the block's hash class"
    needs_hits = True
    needs_keys = True

    def __init__(self, classes: int = 4, history: float = 4.0, power: float = 1.0) -> None:
        self.classes = classes
        self.history = history
        self.power = power
        C = classes
        self._key: dict[int, object] = {}
        self._live: dict[object, int] = {}
        self._refs: dict[object, int] = {}
        self._ghost: OrderedDict[object, None] = OrderedDict()
        self._cap = 1
        self._reused = [1.0] * C
        self._total = [1.0] * C
        self._nref = 0
        self._t0 = 0.0
        self._q: list[OrderedDict[int, float]] = [OrderedDict() for _ in range(C)]
        self._cls: dict[int, int] = {}

    def _ref(self, key: object) -> None:
        r = self._refs.get(key, 0)
        C = self.classes
        if r:
            self._reused[min(r - 1, C - 1)] += 1.0
        self._total[min(r, C - 1)] += 1.0
        self._refs[key] = r + 1
        self._nref += 1
        if self._nref > self._cap:
            self._nref = 0
            for c in range(C):
                self._reused[c] *= 0.5
                self._total[c] *= 0.5

    def on_cache(self, block_id: int, key: object) -> None:
        self._key[block_id] = key
        if len(self._key) > self._cap:
            self._cap = len(self._key)
        live = self._live.get(key, 0)
        self._live[key] = live + 1
        if key in self._ghost:
            del self._ghost[key]
        if not live:
            self._ref(key)

    def on_hit(self, block_id: int, now: float) -> None:
        key = self._key.get(block_id)
        if key is not None:
            self._ref(key)

    def add(self, block_id: int, now: float, value: float = 0.0,
            next_use: float = math.inf) -> None:
        if block_id in self._cls:
            raise KeyError(f"block {block_id} is already a candidate")
        key = self._key.get(block_id)
        r = self._refs.get(key, 1) if key is not None else 1
        c = min(r - 1, self.classes - 1)
        self._q[c][block_id] = now
        self._cls[block_id] = c

    def remove(self, block_id: int) -> None:
        c = self._cls.pop(block_id)
        del self._q[c][block_id]

    def _drop(self, block_id: int, keep: bool) -> None:
        key = self._key.pop(block_id, None)
        if key is None:
            return
        live = self._live[key] - 1
        if live:
            self._live[key] = live
            return
        del self._live[key]
        if not keep:
            self._refs.pop(key, None)
            return
        ghost = self._ghost
        ghost[key] = None
        while len(ghost) > self.history * self._cap:
            old, _ = ghost.popitem(last=False)
            self._refs.pop(old, None)

    def forget(self, block_id: int) -> None:
        self._drop(block_id, False)

    def _offsets(self) -> list[float]:
        p = [self._reused[c] / self._total[c] for c in range(self.classes)]
        base = p[0] if p[0] > 0 else 1e-9
        return [self._t0 * (max(pc / base, 1.0) ** self.power - 1.0) for pc in p]

    def pop(self, now: float) -> int:
        return self.pop_n(1, now)[0]

    def pop_n(self, n: int, now: float) -> list[int]:
        if n > len(self._cls):
            raise IndexError(f"pop {n} from an eviction queue of {len(self._cls)}")
        off = self._offsets()
        out: list[int] = []
        q = self._q
        while len(out) < n:
            best, bc = math.inf, -1
            for c in range(self.classes):
                if q[c]:
                    k = next(iter(q[c].values())) + off[c]
                    if k < best:
                        best, bc = k, c
            b, t = q[bc].popitem(last=False)
            del self._cls[b]
            if bc == 0:
                self._t0 += 0.01 * ((now - t) - self._t0)
            self._drop(b, True)
            out.append(b)
        return out

    def clone(self) -> "WeightedLRUEviction":
        import copy
        return copy.deepcopy(self)

    def __len__(self) -> int:
        return len(self._cls)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._cls


#: Registry: name -> policy class.
EVICTION_POLICIES: dict[str, type[EvictionPolicy]] = {
    cls.name: cls for cls in (LRUEviction, FlopEviction, LFUEviction, LHDEviction, ARCEviction,
                              LFUDAEviction, LHDGEviction,
                              WeightedLRUEviction, BeladyEviction)
}

#: Policies a live engine can run (no future knowledge).
ENGINE_EVICTION_POLICIES = tuple(n for n, c in EVICTION_POLICIES.items() if not c.needs_future)


def eviction_class(name: str) -> type[EvictionPolicy]:
    """The policy class registered under ``name`` (to read its capabilities).

    Raises:
        UnknownPolicyError: unknown name; the message lists the valid names.
    """
    try:
        return EVICTION_POLICIES[name]
    except KeyError:
        valid = ", ".join(EVICTION_POLICIES)
        raise UnknownPolicyError(f"unknown eviction policy {name!r}; valid: {valid}") from None


def get_eviction(name: str, **options) -> EvictionPolicy:
    """Build the eviction policy registered under ``name``.

    Args:
        name: a key of :data:`EVICTION_POLICIES`.
        options: constructor options (``alpha`` for ``flop``).

    Raises:
        UnknownPolicyError: unknown name; the message lists the valid names.
        TypeError: an option the policy does not take.
    """
    return eviction_class(name)(**options)
