"""``lfu``: the fewest prefix hits since cached first, least recently freed among equals."""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Sequence

from sortedcontainers import SortedList

from vllm_admission.core.eviction.base import EvictionPolicy

__all__ = ["LFUEviction"]


class LFUEviction(EvictionPolicy):
    """Least frequently used: the candidate with the fewest prefix hits goes first.

    A block's count is the number of prefix hits that referenced it since it
    got its hash (:meth:`on_hit`); it starts at 0 and is forgotten when the
    block is evicted (:meth:`pop`) or loses its hash otherwise
    (:meth:`forget`). Among candidates with equal counts the least recently
    freed goes first (vLLM's order), so with no hits at all this is ``lru``.
    A classic frequency baseline (no aging); see docs/results.md for how it
    does on the Mooncake trace. It is a baseline, not an ``auto`` candidate
    (it does not declare :attr:`~EvictionPolicy.auto_candidate`): without aging,
    early hit counts outlive the traffic that made them; it loses to ``lru``
    over both studied workloads, yet its transient leads drew ``auto`` into it
    (docs/results.md section 5).
    """

    name = "lfu"
    summary = "fewest prefix hits since cached first, least recently freed among equals"

    def __init__(self) -> None:
        self._hits: dict[int, int] = {}
        self._levels: dict[int, OrderedDict[int, None]] = {}   # hits -> candidates in free order
        self._counts: SortedList[int] = SortedList()           # hit counts with candidates
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

    def clone(self) -> LFUEviction:
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
