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
* ``needs_keys``: the caching hook :meth:`~EvictionPolicy.on_cache` (the block's
  hash key), for history kept by hash;
* ``tunable``: an ``alpha`` tuned online by :class:`~vllm_admission.core.tuning.AlphaTuner`
  when not fixed;
* ``vllm_order``: orders exactly as vLLM's ``FreeKVCacheBlockQueue``, so the
  engine keeps vLLM's own queue;
* ``baseline``: a reference point, not a recommendation (``auto`` leaves it out).

Policies:

* :class:`LRUEviction` (``lru``): vLLM's own order, block for block.
* :class:`FlopEviction` (``flop``): Marconi's utility, recency + alpha x FLOP
  efficiency, min-max normalised over the candidates (Marconi section 4.2).
* :class:`LFUEviction` (``lfu``): fewest prefix hits since the block was cached
  first, least recently freed among equals.
* :class:`ReuseEviction` (``reuse``): LRU in which blocks whose hash was used
  again may grow ``r`` times older, ``r`` learned online from hash-keyed history
  that outlives eviction (ghosts).
* :class:`BeladyEviction` (``belady``): offline reference; evicts the block whose
  hash is next needed farthest in the future. Needs the future, so the engine
  never offers it.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import operator
from abc import ABC, abstractmethod
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import ClassVar

from sortedcontainers import SortedList

from vllm_admission.core.admission import UnknownPolicyError

__all__ = [
    "EVICTION_POLICIES",
    "BeladyEviction",
    "EvictionPolicy",
    "FlopEviction",
    "HistoryKeeper",
    "LFUEviction",
    "LRUEviction",
    "ReuseEviction",
    "ReuseHistory",
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
    #: Whether the cache must report each block's hash key when the block is
    #: cached (:meth:`on_cache`), so the policy can keep history by hash.
    needs_keys: ClassVar[bool] = False
    #: Whether the policy has an ``alpha`` that is tuned online unless fixed.
    tunable: ClassVar[bool] = False
    #: Whether the order is exactly vLLM's free-block queue order (the engine
    #: then keeps vLLM's own queue and calls no policy code).
    vllm_order: ClassVar[bool] = False
    #: Whether the policy is kept as a baseline only, not recommended: runs
    #: everywhere, but ``auto`` does not choose it.
    baseline: ClassVar[bool] = False

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
        """Block ``block_id`` (in use) was given a hash; ``key`` is hashable and
        equal for equal hashes in one KV cache group: ``(group, block_hash)``
        for a block of prompt tokens (the engine's ``block_hash`` is
        ``vllm_admission.plugin.control.hash_key`` of vLLM's hash), a key never
        seen again for a block holding generated tokens. Called only for
        policies that :attr:`needs_keys`, before the block is a candidate; not
        called for a state cached only as a ``marconi`` sequence end (see
        :class:`ReuseEviction`). A block cached without a report has no key."""

    @abstractmethod
    def clone(self) -> "EvictionPolicy":
        """An independent copy with the same candidates in the same order."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(candidates={len(self)})"


_ABSENT = -2   # _BlockFifo: not queued
_END = -1      # _BlockFifo: no neighbour


def _room(size: int, block_id: int) -> int:
    """Entries to add to a table indexed by block id, now ``size`` long, so that
    it holds ``block_id``: at least half again its size (amortised O(1) growth).

    Raises:
        ValueError: ``block_id`` is negative.
    """
    if block_id < 0:
        raise ValueError(f"block ids must be >= 0, got {block_id}")
    return max(block_id + 1 - size, size >> 1) if block_id >= size else 0


class _BlockFifo:
    """First-in first-out queue of distinct block ids (non-negative ints) with
    O(1) removal anywhere: a doubly linked list kept in two lists indexed by
    block id, which grow to the largest id queued.

    16 bytes per block id instead of the ~80 bytes per entry of an
    ``OrderedDict`` (``docs/benchmarks.md``: eviction queues were most of a
    large shadow pool's memory), and no slower to append and pop.

    Raises (methods): KeyError for an id queued twice or not queued, IndexError
    for a pop past the end, ValueError for a negative id.
    """

    __slots__ = ("nxt", "prv", "head", "tail", "size")

    def __init__(self) -> None:
        self.nxt: list[int] = []
        self.prv: list[int] = []    # _ABSENT for ids not queued
        self.head = _END
        self.tail = _END
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def __contains__(self, b: int) -> bool:
        return 0 <= b < len(self.prv) and self.prv[b] != _ABSENT

    def _grow(self, top: int, bottom: int) -> None:
        """Make room for ids up to ``top`` (ValueError if ``bottom`` < 0)."""
        _room(0, bottom)
        more = _room(len(self.prv), top)
        if more:
            self.prv.extend([_ABSENT] * more)
            self.nxt.extend([_END] * more)

    def append_many(self, ids: Sequence[int]) -> None:
        """Queue ``ids`` at the tail, in order."""
        if not ids:
            return
        top = max(ids)
        if top >= len(self.prv) or min(ids) < 0:
            self._grow(top, min(ids))
        prv, nxt = self.prv, self.nxt
        t = self.tail
        for b in ids:
            if prv[b] != _ABSENT:
                break
            prv[b] = t
            if t == _END:
                self.head = b
            else:
                nxt[t] = b
            t = b
        else:
            nxt[t] = _END
            self.tail = t
            self.size += len(ids)
            return
        # A duplicate: keep what was queued before it (the queue stays sound), then refuse.
        if t != _END:
            nxt[t] = _END
        c = self.head if self.tail == _END else nxt[self.tail]
        queued = 0
        while c != _END:
            queued += 1
            c = nxt[c]
        self.tail = t
        self.size += queued
        raise KeyError(f"block {b} is already a candidate")

    def remove(self, b: int) -> None:
        """Take ``b`` out of the queue."""
        if b not in self:
            raise KeyError(f"block {b} is not a candidate")
        prv, nxt = self.prv, self.nxt
        p, q = prv[b], nxt[b]
        if p == _END:
            self.head = q
        else:
            nxt[p] = q
        if q == _END:
            self.tail = p
        else:
            prv[q] = p
        prv[b] = _ABSENT
        self.size -= 1

    def popleft(self) -> int:
        """Remove and return the id at the head."""
        b = self.head
        if b == _END:
            raise IndexError("pop from an empty eviction queue")
        self.head = q = self.nxt[b]
        self.prv[b] = _ABSENT
        if q == _END:
            self.tail = _END
        else:
            self.prv[q] = _END
        self.size -= 1
        return b

    def popleft_n(self, n: int) -> list[int]:
        """Remove and return the first ``n`` ids, in order."""
        if n > self.size:
            raise IndexError(f"pop {n} from an eviction queue of {self.size}")
        prv, nxt = self.prv, self.nxt
        out = []
        b = self.head
        for _ in range(n):
            out.append(b)
            prv[b] = _ABSENT
            b = nxt[b]
        self.head = b
        if b == _END:
            self.tail = _END
        else:
            prv[b] = _END
        self.size -= n
        return out

    def copy(self) -> "_BlockFifo":
        other = _BlockFifo()
        other.nxt, other.prv = self.nxt[:], self.prv[:]
        other.head, other.tail, other.size = self.head, self.tail, self.size
        return other


class LRUEviction(EvictionPolicy):
    """vLLM's order: first freed, first evicted (FIFO over free events).

    Within one free call vLLM passes a request's blocks tail first
    (``SingleTypeKVCacheManager.free``), so a request's last blocks go first.
    """

    name = "lru"
    summary = "vLLM's free-block queue order (least recently freed first)"
    vllm_order = True

    def __init__(self) -> None:
        self._order = _BlockFifo()

    def add(self, block_id: int, now: float, value: float = 0.0,
            next_use: float = math.inf) -> None:
        self._order.append_many((block_id,))

    def remove(self, block_id: int) -> None:
        self._order.remove(block_id)

    def pop(self, now: float) -> int:
        return self._order.popleft()

    def add_many(self, block_ids: Sequence[int], now: float, values: Sequence[float],
                 next_uses: Sequence[float]) -> None:
        self._order.append_many(block_ids)

    def clone(self) -> "LRUEviction":
        other = LRUEviction()
        other._order = self._order.copy()
        return other

    def pop_n(self, n: int, now: float) -> list[int]:
        return self._order.popleft_n(n)

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
        self._add_equal((block_id,), now, value)

    def add_many(self, block_ids: Sequence[int], now: float, values: Sequence[float],
                 next_uses: Sequence[float]) -> None:
        """:meth:`add` of each block in order, a stretch of equal values at a time."""
        for value, stretch in itertools.groupby(zip(block_ids, values), key=operator.itemgetter(1)):
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
            run = [value, next(self._seq), {}]
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
        for t_i, (minv_j, t_j) in zip(times, self._by_min):
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


class LFUEviction(EvictionPolicy):
    """Least frequently used: the candidate with the fewest prefix hits goes first.

    A block's count is the number of prefix hits that referenced it since it
    got its hash (:meth:`on_hit`); it starts at 0 and is forgotten when the
    block is evicted (:meth:`pop`) or loses its hash otherwise
    (:meth:`forget`). Among candidates with equal counts the least recently
    freed goes first (vLLM's order), so with no hits at all this is ``lru``.
    A classic frequency baseline (no aging); see docs/results.md for how it
    does on the Mooncake trace. It is a :attr:`~EvictionPolicy.baseline`:
    without aging, early hit counts outlive the traffic that made them; it
    loses to ``lru`` over both studied workloads, yet its transient leads drew
    ``auto`` into it (docs/results.md section 5).
    """

    name = "lfu"
    summary = "fewest prefix hits since cached first, least recently freed among equals"
    needs_hits = True
    baseline = True

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

    def pop_n(self, n: int, now: float) -> list[int]:
        """Pop ``n`` victims: the lowest level's first candidates, level after level
        (the order of ``n`` pops)."""
        level_of = self._level_of
        if n > len(level_of):
            raise IndexError(f"pop {n} from an eviction queue of {len(level_of)}")
        out: list[int] = []
        levels, counts, hits = self._levels, self._counts, self._hits
        while len(out) < n:
            k = counts[0]
            level = levels[k]
            victims = list(itertools.islice(level, n - len(out)))
            for b in victims:
                del level[b]
            if not level:
                del levels[k]
                counts.remove(k)
            for b in victims:
                del level_of[b]
            if hits:
                for b in victims:
                    hits.pop(b, None)
            out += victims
        return out

    def add_many(self, block_ids: Sequence[int], now: float, values: Sequence[float],
                 next_uses: Sequence[float]) -> None:
        """:meth:`add` of each block in order; blocks never hit go to level 0 in bulk."""
        level_of, hits = self._level_of, self._hits
        if hits and not hits.keys().isdisjoint(block_ids):
            for b in block_ids:
                self.add(b, now)
            return
        if not level_of.keys().isdisjoint(block_ids):
            raise KeyError(f"a block of {list(block_ids)} is already a candidate")
        level = self._levels.get(0)
        if level is None:
            level = self._levels[0] = OrderedDict()
            self._counts.add(0)
        n = len(level)
        level.update(dict.fromkeys(block_ids))
        if len(level) != n + len(block_ids):
            raise KeyError(f"a block of {list(block_ids)} is listed twice")
        level_of.update(dict.fromkeys(block_ids, 0))

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


class ReuseHistory:
    """What :class:`ReuseEviction` learns, by block hash: which hashes were used
    again, and how much likelier a reused hash is to come back.

    Fed the cache's events: :meth:`cached` (a block got its hash key),
    :meth:`hit` (a prefix hit referenced it), :meth:`evicted` (victims gave up
    their hashes; the keys stay as ghosts) and :meth:`dropped` (a hash lost
    without an eviction). A key is *again* once a second request used it (a
    hit, or a request cached it once more after every copy was evicted).

    Statistics: ``reused[k] / total[k]``, the fraction of references of kind
    ``k`` (0: a first use, 1: a use of a key already used) that were followed
    by another reference of the same key; both halve every time as many
    references were counted as the cache ever held blocks (:meth:`age`), so
    they follow the workload.

    Ghosts (keys with no cached copy left, the ``history`` x ``cap`` most
    recently evicted) are kept in eviction order in a queue that is cleaned
    lazily: a key cached again stays in the queue until the queue's head
    reaches it. Each key's entry in ``refs`` packs its use count (the low two
    bits: 0 no use, 1 one request, 2 more) with how many times it is queued
    (the rest), so that only its newest queue entry counts. This holds the
    same ghosts in the same order as an ordered set at a tenth of the memory.

    Args:
        history: ghost keys kept, as a multiple of the most blocks ever cached.

    Raises:
        ValueError: ``history`` is negative or not finite.
    """

    __slots__ = ("history", "key_of", "num_keys", "live", "refs", "queue", "num_ghosts", "cap",
                 "reused", "total", "counted")

    def __init__(self, history: float = 4.0) -> None:
        if not (history >= 0 and math.isfinite(history)):
            raise ValueError(f"history must be a finite number >= 0, got {history!r}")
        self.history = history
        self.key_of: list = []                    # block id -> its hash key (None: none)
        self.num_keys = 0                         # blocks with a key
        self.live: dict[object, int] = {}         # key -> cached blocks holding it
        self.refs: dict[object, int] = {}         # key -> uses (1 or 2 = "again") + 4 x times queued
        self.queue: deque[object] = deque()       # ghost evictions, oldest first (some stale)
        self.num_ghosts = 0                       # keys with no cached copy, still counted
        self.cap = 1                              # most blocks ever cached at once
        self.reused = [1.0, 1.0]                  # references followed by another, by kind
        self.total = [1.0, 1.0]                   # references, by kind
        self.counted = 0                          # references since the last halving

    def copy(self) -> "ReuseHistory":
        other = ReuseHistory(self.history)
        other.key_of, other.num_keys = self.key_of[:], self.num_keys
        other.live, other.refs = dict(self.live), dict(self.refs)
        other.queue, other.num_ghosts = self.queue.copy(), self.num_ghosts
        other.cap, other.counted = self.cap, self.counted
        other.reused, other.total = self.reused[:], self.total[:]
        return other

    @property
    def ghosts(self) -> list:
        """The ghost keys, oldest eviction first (for inspection; O(queue))."""
        newest = {key: i for i, key in enumerate(self.queue)}
        live, refs = self.live, self.refs
        return [key for i, key in enumerate(self.queue)
                if newest[key] == i and key not in live and refs[key] & 3]

    def cached_keys(self) -> dict[int, object]:
        """Every block that has a key, with its key (for inspection; O(blocks))."""
        return {b: key for b, key in enumerate(self.key_of) if key is not None}

    def uses(self, key: object) -> int:
        """How many requests used ``key``, counted up to 2 (0: unknown or forgotten)."""
        return self.refs.get(key, 0) & 3

    def reference(self, key: object) -> None:
        """A request used ``key`` (cached it or hit it)."""
        refs = self.refs
        v = refs.get(key, 0)
        r = v & 3
        if r:
            self.reused[r - 1] += 1.0
            self.total[1] += 1.0
            refs[key] = v - r + 2
        else:
            self.total[0] += 1.0
            refs[key] = v + 1
        self.counted += 1

    def cached(self, block_id: int, key: object) -> None:
        """``block_id`` was given hash ``key``; a first cached copy is a use."""
        key_of = self.key_of
        if not 0 <= block_id < len(key_of):
            key_of.extend([None] * _room(len(key_of), block_id))
        if key_of[block_id] is None:
            self.num_keys += 1
            if self.num_keys > self.cap:
                self.cap = self.num_keys
        key_of[block_id] = key
        live_counts = self.live
        live = live_counts.get(key, 0)
        live_counts[key] = live + 1
        if live:
            return   # a duplicate of a cached block is not a new use
        if self.refs.get(key, 0) & 3:
            self.num_ghosts -= 1   # a ghost comes back; its queue entry goes stale
        self.reference(key)

    def hit(self, block_id: int) -> None:
        """A prefix hit referenced ``block_id``."""
        key_of = self.key_of
        key = key_of[block_id] if 0 <= block_id < len(key_of) else None
        if key is not None:
            self.reference(key)

    def again(self, block_id: int) -> bool:
        """Whether ``block_id``'s hash was used by more than one request."""
        key_of = self.key_of
        key = key_of[block_id] if 0 <= block_id < len(key_of) else None
        return key is not None and self.refs.get(key, 1) & 3 > 1

    def dropped(self, block_id: int) -> None:
        """``block_id`` lost its hash without an eviction: no ghost is kept."""
        key_of = self.key_of
        key = key_of[block_id] if 0 <= block_id < len(key_of) else None
        if key is None:
            return
        key_of[block_id] = None
        self.num_keys -= 1
        live = self.live[key] - 1
        if live:
            self.live[key] = live
            return
        del self.live[key]
        queued = self.refs[key] & ~3
        if queued:
            self.refs[key] = queued   # unused, until its stale queue entries are passed
        else:
            del self.refs[key]

    def evicted(self, victims: Sequence[int]) -> None:
        """``victims`` gave up their hashes; a key with no cached copy left is
        remembered as a ghost (the ``history`` x ``cap`` newest are kept)."""
        key_of, live_counts, refs, queue = self.key_of, self.live, self.refs, self.queue
        limit = self.history * self.cap
        n = len(key_of)
        ghosts = self.num_ghosts
        lost = 0
        for b in victims:
            key = key_of[b] if 0 <= b < n else None
            if key is None:
                continue
            key_of[b] = None
            lost += 1
            live = live_counts[key] - 1
            if live:
                live_counts[key] = live
                continue
            del live_counts[key]
            queue.append(key)
            refs[key] += 4
            ghosts += 1
            while ghosts > limit:
                old = queue.popleft()
                v = refs[old] - 4
                if v > 3 or old in live_counts:
                    refs[old] = v          # queued again later, or cached again: stale
                elif v:
                    del refs[old]          # the oldest ghost is forgotten
                    ghosts -= 1
                else:
                    del refs[old]          # dropped since: no ghost to forget
        self.num_ghosts = ghosts
        self.num_keys -= lost

    def age(self) -> None:
        """Halve the statistics once per ``cap`` references counted. Called when
        a victim is chosen, not per reference, so that the order in which one
        step's blocks are cached (group by group) does not matter."""
        while self.counted >= self.cap:
            self.counted -= self.cap
            for i in (0, 1):
                self.reused[i] *= 0.5
                self.total[i] *= 0.5

    @property
    def ratio(self) -> float:
        """``r = max(1, p_again / p_first)``: how much likelier a reused hash is
        to be used again than a first-time one."""
        p_first = self.reused[0] / self.total[0]
        p_again = self.reused[1] / self.total[1]
        return max(1.0, p_again / p_first)


class ReuseEviction(EvictionPolicy):
    """Reuse-aware LRU: a block whose hash came back may grow ``r`` times older
    than the oldest first-time block, with ``r`` learned online by hash.

    Two LRU queues of free cached blocks (in free order): *first* holds blocks
    whose hash has been used by one request only; *again* holds blocks whose
    hash was used again (a prefix hit took it, or a request computed and cached
    it once more after an earlier copy was evicted). Let ``p_first`` and
    ``p_again`` be the fractions of references of each kind that were followed
    by another reference of the same hash, and ``r = max(1, p_again / p_first)``.
    The victim is the oldest *again* block when its age (time since it was
    freed) is more than ``r`` times the age of the oldest *first* block,
    otherwise the oldest *first* block; at exactly ``r`` times (both freed at
    the current time, say: a burst of requests shares one clock tick) the one
    freed first goes, as in LRU. With ``r = 1`` this is LRU; an empty queue
    yields to the other.

    History is keyed by block hash (:attr:`needs_keys`): what :meth:`on_cache`
    and :meth:`on_hit` report, identically in the simulator and in the engine
    (the plugin's ``AdmissionBlockPool.cache_full_blocks``). Two kinds of
    blocks are reported the way the simulator can know them, not by vLLM's
    hash: a block holding generated tokens counts as new content (a key of
    its own: vLLM's hash would tie a resent prompt's identical greedy output to
    the first copy, which the simulator, not knowing the outputs, cannot); and
    a state that ``marconi`` keeps only as the sequence end is cached without a
    key (the engine, not knowing the length, caches every candidate tail
    tentatively and drops all but the last; a key heard for the dropped ones
    would count uses the simulator never sees). A block without a key is a
    first-time block and leaves no ghost. With that, engine and simulator
    order evictions identically, request by request
    (``tests/test_plugin_scheduler.py``).

    History outlives eviction:
    a hash whose last block was evicted stays in a ghost list (the ``history``
    x cache-size most recently evicted hashes), so a prefix recomputed after an
    eviction is recognised as reused. That is what LRU misses on the Mooncake
    conversation trace: a conversation's next turn typically comes after about
    twice the traffic a 64 GiB cache holds, so most reuse is never seen as a
    hit; yet a hash used twice is used again within 1,000 requests 32-57 % of the
    time against 18 % for a hash used once (``docs/results.md``). Statistics
    halve every time as many references were counted as the cache holds blocks,
    so ``r`` follows the workload; no constant is fitted to a trace.

    Sources: the frequency-classed LRU queues with a history of evicted ids of
    MQ (Zhou, Philbin and Li, "The Multi-Queue Replacement Algorithm for Second
    Level Buffer Caches", USENIX ATC 2001) and 2Q / ARC's ghost entries (Johnson
    and Shasha, VLDB 1994; Megiddo and Modha, FAST 2003), adapted to hash-keyed
    prefix-cache blocks; the lifetime ratio replaces MQ's fixed ``lifeTime``.

    The history is a :class:`ReuseHistory`; ``auto`` gives every policy it
    switches among one shared history (:class:`HistoryKeeper`), so that
    ``reuse`` switched in mid-run starts from everything the cache heard.

    Args:
        history: ghost hashes kept, as a multiple of the most blocks ever cached.
        shared: a history to use (and keep up to date) instead of a new one;
            ``history`` is then ignored.
    """

    name = "reuse"
    summary = "LRU in which blocks whose hash was reused may grow r times older (r learned by hash)"
    needs_hits = True
    needs_keys = True

    def __init__(self, history: float = 4.0, *, shared: ReuseHistory | None = None) -> None:
        self.hist = shared if shared is not None else ReuseHistory(history)
        # The candidates, in free order, and each one's free sequence number
        # (indexed by block id). The free time of a sequence number is looked up
        # in the clock below: one entry per time blocks were freed at a new
        # ``now``, not a time per block.
        self._first = _BlockFifo()
        self._again = _BlockFifo()
        self._seqs = array("q")
        self._next = 0
        self._tick_seq: list[int] = []     # first sequence number freed at each time ...
        self._tick_time: list[float] = []  # ... and that time (both increasing)
        self._prune_at = 256               # prune the clock when it grows past this

    def _stamp(self, now: float) -> None:
        """Start a clock tick at the next sequence number if ``now`` is new."""
        times = self._tick_time
        if not times or times[-1] != now:
            self._tick_seq.append(self._next)
            times.append(now)

    def _tick_of(self, seq: int) -> tuple[float, float]:
        """The free time of sequence number ``seq``, and the first sequence
        number of the next tick (every number below it has the same time)."""
        ticks = self._tick_seq
        i = bisect.bisect_right(ticks, seq)
        return self._tick_time[i - 1], (ticks[i] if i < len(ticks) else math.inf)

    def _prune_clock(self) -> None:
        """Drop the clock ticks before the older head (queues are in sequence
        order, so no candidate can need them again). Called when the clock has
        doubled since the last pruning: amortised O(1) per tick."""
        heads = [self._seqs[q.head] for q in (self._first, self._again) if q.size]
        if heads:
            k = bisect.bisect_right(self._tick_seq, min(heads)) - 1
            del self._tick_seq[:k]
            del self._tick_time[:k]
        else:
            self._tick_seq.clear()
            self._tick_time.clear()
        self._prune_at = max(256, 2 * len(self._tick_seq))

    @property
    def ratio(self) -> float:
        """``r``: how many times older than the oldest first-time block a
        reused block may grow before it is evicted (>= 1)."""
        return self.hist.ratio

    def on_cache(self, block_id: int, key: object) -> None:
        self.hist.cached(block_id, key)

    def on_hit(self, block_id: int, now: float) -> None:
        self.hist.hit(block_id)

    def forget(self, block_id: int) -> None:
        self.hist.dropped(block_id)

    # -- candidates ------------------------------------------------------
    def add(self, block_id: int, now: float, value: float = 0.0,
            next_use: float = math.inf) -> None:
        self.add_many((block_id,), now, (), ())

    def remove(self, block_id: int) -> None:
        if block_id in self._first:
            self._first.remove(block_id)
        else:
            self._again.remove(block_id)

    def pop(self, now: float) -> int:
        return self.pop_n(1, now)[0]

    def pop_n(self, n: int, now: float) -> list[int]:
        """The order of ``n`` single pops. Within one call the ratio cannot
        change (pops add no references, so only the first aging can do
        anything) and a queue found empty stays empty, so the heads are compared
        with one ``r`` while both queues last, and the rest is taken in bulk."""
        if n > len(self):
            raise IndexError(f"pop {n} from an eviction queue of {len(self)}")
        first, again, seqs = self._first, self._again, self._seqs
        out: list[int] = []
        if first.size and again.size and n:
            self.hist.age()
            r = self.hist.ratio
            tick_of = self._tick_of
            # A head's free time is looked up again only when it crosses a tick.
            seq_f, seq_a = seqs[first.head], seqs[again.head]
            t_f, end_f = tick_of(seq_f)
            t_a, end_a = tick_of(seq_a)
            while len(out) < n:
                limit = r * (now - t_f)
                age_a = now - t_a
                if age_a > limit or (age_a == limit and seq_a < seq_f):
                    out.append(again.popleft())
                    if not again.size:
                        break
                    seq_a = seqs[again.head]
                    if seq_a >= end_a:
                        t_a, end_a = tick_of(seq_a)
                else:
                    out.append(first.popleft())
                    if not first.size:
                        break
                    seq_f = seqs[first.head]
                    if seq_f >= end_f:
                        t_f, end_f = tick_of(seq_f)
        if len(out) < n:
            out += (first if first.size else again).popleft_n(n - len(out))
        if len(self._tick_seq) > self._prune_at:
            self._prune_clock()
        self.hist.evicted(out)
        return out

    def add_many(self, block_ids: Sequence[int], now: float, values: Sequence[float],
                 next_uses: Sequence[float]) -> None:
        """:meth:`add` of each block in order."""
        if not block_ids:
            return
        first, again, seqs = self._first, self._again, self._seqs
        top, low = max(block_ids), min(block_ids)
        if top >= len(seqs) or low < 0:
            first._grow(top, low)
            again._grow(top, low)
            seqs.frombytes(bytes(seqs.itemsize * (len(first.prv) - len(seqs))))
        self._stamp(now)
        fprv, aprv, is_again = first.prv, again.prv, self.hist.again
        s = self._next
        to_first: list[int] = []
        to_again: list[int] = []
        for b in block_ids:
            if fprv[b] != _ABSENT or aprv[b] != _ABSENT:
                raise KeyError(f"block {b} is already a candidate")
            seqs[b] = s
            s += 1
            (to_again if is_again(b) else to_first).append(b)
        self._next = s
        first.append_many(to_first)
        again.append_many(to_again)

    def clone(self) -> "ReuseEviction":
        other = ReuseEviction(shared=self.hist.copy())
        other._first, other._again = self._first.copy(), self._again.copy()
        other._seqs = array("q", self._seqs)
        other._next = self._next
        other._prune_at = self._prune_at
        other._tick_seq, other._tick_time = self._tick_seq[:], self._tick_time[:]
        return other

    def __len__(self) -> int:
        return self._first.size + self._again.size

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._first or block_id in self._again


class HistoryKeeper(EvictionPolicy):
    """Orders like ``inner`` and keeps a :class:`ReuseHistory` up to date.

    ``auto`` serves its live cache with one of these around every policy
    other than ``reuse`` (which keeps the history itself), all sharing one
    history, so that a switch to ``reuse`` finds the use counts and ghosts of
    everything the cache cached, hit and evicted so far, not an empty history
    (``core/adaptive.py``). It hears hash keys and hits whatever ``inner``
    needs, and passes them on only where ``inner`` asks for them.

    Args:
        inner: the policy that orders the candidates (not ``reuse``, and not
            one that needs the future).
        history: the history to keep up to date.

    Raises:
        ValueError: ``inner`` is a :class:`ReuseEviction` or needs the future.
    """

    needs_hits = True
    needs_keys = True

    def __init__(self, inner: EvictionPolicy, history: ReuseHistory) -> None:
        if isinstance(inner, ReuseEviction) or inner.needs_future:
            raise ValueError(f"{inner.name!r} cannot be wrapped: it keeps its own history "
                             f"or needs the future")
        self.inner = inner
        self.hist = history
        self.name = inner.name
        self.summary = inner.summary
        self.needs_values = inner.needs_values
        self.tunable = inner.tunable
        self._pass_keys = inner.needs_keys
        self._pass_hits = inner.needs_hits

    def add(self, block_id: int, now: float, value: float = 0.0,
            next_use: float = math.inf) -> None:
        self.inner.add(block_id, now, value, next_use)

    def add_many(self, block_ids: Sequence[int], now: float, values: Sequence[float],
                 next_uses: Sequence[float]) -> None:
        self.inner.add_many(block_ids, now, values, next_uses)

    def remove(self, block_id: int) -> None:
        self.inner.remove(block_id)

    def pop(self, now: float) -> int:
        return self.pop_n(1, now)[0]

    def pop_n(self, n: int, now: float) -> list[int]:
        out = self.inner.pop_n(n, now)
        self.hist.age()   # statistics halve when victims are chosen, as in ReuseEviction
        self.hist.evicted(out)
        return out

    def on_cache(self, block_id: int, key: object) -> None:
        self.hist.cached(block_id, key)
        if self._pass_keys:
            self.inner.on_cache(block_id, key)

    def on_hit(self, block_id: int, now: float) -> None:
        self.hist.hit(block_id)
        if self._pass_hits:
            self.inner.on_hit(block_id, now)

    def forget(self, block_id: int) -> None:
        self.hist.dropped(block_id)
        if self._pass_hits:
            self.inner.forget(block_id)

    def clone(self) -> "HistoryKeeper":
        return HistoryKeeper(self.inner.clone(), self.hist.copy())

    def __len__(self) -> int:
        return len(self.inner)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self.inner

    @property
    def alpha(self) -> float:
        """The wrapped policy's ``alpha`` (a :attr:`~EvictionPolicy.tunable` one):
        a tuner or the plugin setting it here sets it there."""
        return self.inner.alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        self.inner.alpha = value

    def __repr__(self) -> str:
        return f"HistoryKeeper({self.inner!r})"


#: Registry: name -> policy class.
EVICTION_POLICIES: dict[str, type[EvictionPolicy]] = {
    cls.name: cls for cls in (LRUEviction, FlopEviction, LFUEviction, ReuseEviction,
                              BeladyEviction)
}

#: Policies a live engine can run: every one that needs no future knowledge
#: (the plugin serves ``needs_values``, ``needs_hits`` and ``needs_keys``).
ENGINE_EVICTION_POLICIES = tuple(n for n, c in EVICTION_POLICIES.items()
                                 if not c.needs_future)


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
