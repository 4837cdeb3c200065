"""``reuse``: LRU in which blocks whose hash was used again may grow ``r`` times
older, ``r`` learned online from hash-keyed history that outlives eviction."""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from vllm_admission.core.eviction.base import EvictionPolicy
from vllm_admission.core.eviction.fifo import ABSENT, BlockFifo
from vllm_admission.core.eviction.history import ReuseHistory

__all__ = ["ReuseEviction"]

#: A tick no sequence number is in: the first :meth:`ReuseEviction._head_tick` looks one up.
_NO_TICK = (0.0, -math.inf)


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

    History is keyed by block hash (it overrides :meth:`on_cache`, so the cache
    reports keys: :attr:`~EvictionPolicy.needs_keys`): what :meth:`on_cache`
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

    The history is a :class:`~vllm_admission.core.eviction.history.ReuseHistory`;
    ``auto`` gives every policy it switches among one shared history
    (:meth:`with_history` here, a ``HistoryKeeper`` around the others), so that
    ``reuse`` switched in mid-run starts from everything the cache heard.

    Args:
        history: ghost hashes kept, as a multiple of the most blocks ever cached.
        shared: a history to use (and keep up to date) instead of a new one;
            ``history`` is then ignored.
    """

    name = "reuse"
    summary = "LRU in which blocks whose hash was reused may grow r times older (r learned by hash)"
    auto_candidate = True

    def __init__(self, history: float = 4.0, *, shared: ReuseHistory | None = None) -> None:
        self.hist = shared if shared is not None else ReuseHistory(history)
        # The candidates, in free order, and each one's free sequence number
        # (indexed by block id). The free time of a sequence number is looked up
        # in the clock below: one entry per time blocks were freed at a new
        # ``now``, not a time per block.
        self._first = BlockFifo()
        self._again = BlockFifo()
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

    def _head_tick(self, queue: BlockFifo, tick: tuple[float, float]) -> tuple[int, tuple[float, float]]:
        """The sequence number of ``queue``'s head and its tick (:meth:`_tick_of`),
        ``tick`` itself while the head has not crossed into the next one."""
        seq = self._seqs[queue.head]
        return seq, (tick if seq < tick[1] else self._tick_of(seq))

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

    @classmethod
    def with_history(cls, history: ReuseHistory, **options: Any) -> ReuseEviction:
        """A ``reuse`` that learns from, and keeps up to date, the shared ``history``."""
        return cls(shared=history, **options)

    def _protected(self) -> Callable[[int], bool]:
        """``f(block_id)``: whether a freed block joins the *again* queue."""
        return self.hist.again

    @property
    def ratio(self) -> float:
        """``r``: how many times older than the oldest first-time block a
        reused block may grow before it is evicted (>= 1)."""
        return self.hist.ratio

    def on_cache(self, block_id: int, key: Hashable) -> None:
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
        first, again = self._first, self._again
        out: list[int] = []
        if first.size and again.size and n:
            self.hist.age()
            r = self.hist.ratio
            # A head's free time is looked up again only when it crosses a tick.
            head = self._head_tick
            seq_f, tick_f = head(first, _NO_TICK)
            seq_a, tick_a = head(again, _NO_TICK)
            while len(out) < n:
                limit = r * (now - tick_f[0])
                age_a = now - tick_a[0]
                if age_a > limit or (age_a == limit and seq_a < seq_f):
                    out.append(again.popleft())
                    if not again.size:
                        break
                    seq_a, tick_a = head(again, tick_a)
                else:
                    out.append(first.popleft())
                    if not first.size:
                        break
                    seq_f, tick_f = head(first, tick_f)
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
        fprv, aprv, is_again = first.prv, again.prv, self._protected()
        s = self._next
        to_first: list[int] = []
        to_again: list[int] = []
        for b in block_ids:
            if fprv[b] != ABSENT or aprv[b] != ABSENT:
                raise KeyError(f"block {b} is already a candidate")
            seqs[b] = s
            s += 1
            (to_again if is_again(b) else to_first).append(b)
        self._next = s
        first.append_many(to_first)
        again.append_many(to_again)

    def clone(self) -> ReuseEviction:
        other = type(self)(shared=self.hist.copy())
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
