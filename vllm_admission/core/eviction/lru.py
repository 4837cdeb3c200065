"""``lru``: vLLM's own order, block for block (first freed, first evicted)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from vllm_admission.core.eviction.base import EvictionPolicy
from vllm_admission.core.eviction.fifo import BlockFifo

__all__ = ["LRUEviction"]


class LRUEviction(EvictionPolicy):
    """vLLM's order: first freed, first evicted (FIFO over free events).

    Within one free call vLLM passes a request's blocks tail first
    (``SingleTypeKVCacheManager.free``), so a request's last blocks go first.
    """

    name = "lru"
    summary = "vLLM's free-block queue order (least recently freed first)"
    vllm_order = True
    auto_candidate = True

    def __init__(self) -> None:
        self._order = BlockFifo()

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

    def clone(self) -> LRUEviction:
        other = LRUEviction()
        other._order = self._order.copy()
        return other

    def pop_n(self, n: int, now: float) -> list[int]:
        return self._order.popleft_n(n)

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._order
