"""``belady``: the offline reference that evicts the block next needed farthest ahead."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

from sortedcontainers import SortedList

from vllm_admission.core.eviction.base import EvictionPolicy

__all__ = ["BeladyEviction"]


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
        self._order: SortedList[tuple[float, int, int]] = SortedList()  # (-next_use, seq, id): farthest first

    def add(self, block_id: int, now: float, value: float = 0.0,
            next_use: float = math.inf) -> None:
        if block_id in self._entries:
            raise KeyError(f"block {block_id} is already a candidate")
        seq = next(self._seq)
        self._entries[block_id] = (next_use, seq)
        self._order.add((-next_use, seq, block_id))

    def remove(self, block_id: int) -> None:
        nu, seq = self._entries.pop(block_id)
        self._order.remove((-nu, seq, block_id))

    def bind_future(self, refresh: Callable[[int, float], float]) -> None:
        self.refresh = refresh

    def clone(self) -> BeladyEviction:
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
