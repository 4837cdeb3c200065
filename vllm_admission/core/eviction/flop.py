"""``flop``: Marconi's FLOP-aware utility over free cached blocks (Marconi section 4.2)."""

from __future__ import annotations

import heapq
import itertools
import math
import operator
from collections.abc import Callable, Sequence

from sortedcontainers import SortedList

from vllm_admission.core.errors import UserError
from vllm_admission.core.eviction.base import EvictionPolicy

__all__ = ["FlopEviction"]


#: A run of blocks freed at one time with one value: ``(value, seq, {block_id: None})``
#: (the members dict is insertion-ordered and shrinks as blocks leave).
_Run = tuple[float, int, dict[int, None]]


class _Bucket:
    """Free blocks with one last-access time: runs of equal value, in free order.

    ``runs`` maps a run's sequence number to ``(value, seq, {block_id: None})``
    (insertion-ordered, so the first run is the earliest freed). Two lazy heaps
    give the lowest and highest value in O(log runs).
    """

    __slots__ = ("t", "runs", "last", "lo", "hi", "minv", "maxv")

    def __init__(self, t: float) -> None:
        self.t = t
        self.runs: dict[int, _Run] = {}
        self.last: _Run | None = None
        self.lo: list[tuple[float, int]] = []   # (value, seq), lazy
        self.hi: list[tuple[float, int]] = []   # (-value, seq), lazy
        self.minv = math.inf   # as indexed in FlopEviction._by_min
        self.maxv = -math.inf  # as indexed in FlopEviction._by_max

    def add_run(self, run: _Run) -> None:
        self.runs[run[1]] = run
        self.last = run
        heapq.heappush(self.lo, (run[0], run[1]))
        heapq.heappush(self.hi, (-run[0], run[1]))

    def drop_run(self, run: _Run) -> None:
        del self.runs[run[1]]
        if self.last is run:
            self.last = None

    def lowest_run(self) -> _Run:
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

    def __init__(self, alpha: float = 0.0) -> None:
        self.alpha = alpha  # validated by the property setter
        self._seq = itertools.count()
        self._where: dict[int, tuple[_Bucket, _Run]] = {}   # id -> (bucket, run)
        self._buckets: dict[float, _Bucket] = {}
        self._times: SortedList[float] = SortedList()                      # bucket times
        self._by_min: SortedList[tuple[float, float]] = SortedList()       # (minv, t)
        self._by_max: SortedList[tuple[float, float]] = SortedList()       # (maxv, t)
        #: Buckets inspected by the last :meth:`pop` (for benchmarks).
        self.last_scan = 0

    @property
    def alpha(self) -> float:
        """Weight of the FLOP-efficiency term (>= 0): the tuning hook.

        Raises:
            UserError: (setting) a value that is not a finite number >= 0.
        """
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        if not (isinstance(value, (int, float)) and value >= 0.0 and math.isfinite(value)):
            raise UserError(f"alpha must be a finite number >= 0, got {value!r}")
        self._alpha = float(value)

    def clone(self) -> FlopEviction:
        other = FlopEviction(self._alpha)
        start = next(self._seq)
        self._seq = itertools.count(start + 1)
        other._seq = itertools.count(start + 1)
        for t, b in self._buckets.items():
            nb = _Bucket(t)
            for v, seq, members in b.runs.values():
                run = (v, seq, dict(members))
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
        self._add_equal((block_id,), now, value)

    def add_many(self, block_ids: Sequence[int], now: float, values: Sequence[float],
                 next_uses: Sequence[float]) -> None:
        """:meth:`add` of each block in order, a stretch of equal values at a time."""
        for value, stretch in itertools.groupby(zip(block_ids, values, strict=True), key=operator.itemgetter(1)):
            self._add_equal([b for b, _ in stretch], now, value)

    def _add_equal(self, block_ids: Sequence[int], now: float, value: float) -> None:
        """Add blocks that share ``value``, in order: they extend the bucket's
        latest run when it has this value, else they start a new run."""
        where = self._where
        if not where.keys().isdisjoint(block_ids):
            raise KeyError(f"a block of {list(block_ids)} is already a candidate")
        b = self._buckets.get(now)
        if b is None:
            if self._times and now < self._times[-1]:
                raise ValueError(f"time went backwards: {now} < {self._times[-1]}")
            b = self._buckets[now] = _Bucket(now)
            self._times.add(now)
        run = b.last
        if run is None or run[0] != value:
            run = (value, next(self._seq), {})
            b.add_run(run)
        run[2].update(dict.fromkeys(block_ids))
        where.update(dict.fromkeys(block_ids, (b, run)))
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

    def _normalisers(self, now: float) -> tuple[Callable[[float], float], Callable[[float], float]]:
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

    def _best_run(self, now: float) -> _Run:
        """The run holding the lowest-utility block (threshold walk over buckets).

        The terms of :meth:`_normalisers` are written out here (the same
        arithmetic, so the same floats): this loop is the policy's hot path.
        """
        buckets, times = self._buckets, self._times
        t_old, t_new = times[0], times[-1]
        v_min, v_max = self._by_min[0][0], self._by_max[-1][0]
        v_span, alpha = v_max - v_min, self._alpha
        if not (v_span > 0 and alpha):
            # No value term: recency alone, which grows with time, so the
            # oldest bucket wins; within it every block ties: the first freed goes.
            self.last_scan = 1
            return next(iter(buckets[t_old].runs.values()))
        r_min = 1.0 / (now - t_old + 1.0)
        r_span = 1.0 / (now - t_new + 1.0) - r_min
        best_s, best_t = math.inf, math.inf
        scanned = 0
        for t_i, (minv_j, t_j) in zip(times, self._by_min, strict=True):
            scanned += 1
            s_i = (1.0 / (now - t_i + 1.0) - r_min) / r_span if r_span > 0 else 0.0
            cand = s_i + alpha * (buckets[t_i].minv - v_min) / v_span
            if cand < best_s or (cand == best_s and t_i < best_t):
                best_s, best_t = cand, t_i
            v_j = alpha * (minv_j - v_min) / v_span
            cand = ((1.0 / (now - t_j + 1.0) - r_min) / r_span if r_span > 0 else 0.0) + v_j
            if cand < best_s or (cand == best_s and t_j < best_t):
                best_s, best_t = cand, t_j
            # An unseen bucket is no older than t_i and holds no value below minv_j.
            if best_s <= s_i + v_j:
                break
        self.last_scan = scanned
        bucket = buckets[best_t]
        if alpha * (v_max - v_min) / v_span > 0.0:
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
            victims = list(itertools.islice(members, n - len(out)))
            bucket = self._where[victims[0]][0]
            for v in victims:
                del self._where[v]
                del members[v]
            if not members:  # as the last self.remove(v) would
                bucket.drop_run(run)
                if not bucket.runs or run[0] == bucket.minv or run[0] == bucket.maxv:
                    self._reindex(bucket)
            out.extend(victims)
        return out

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._where
