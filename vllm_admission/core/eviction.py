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
``pop`` when an allocation needs a block. Time is injected (``now``): a logical
request counter in the simulator, a monotonic clock in the engine.

Policies:

* :class:`LRUEviction` (``lru``): vLLM's own order, block for block.
* :class:`FlopEviction` (``flop``): Marconi's utility, recency + alpha x FLOP
  efficiency, min-max normalised over the candidates (Marconi section 4.2).
* :class:`BeladyEviction` (``belady``): offline reference; evicts the block whose
  hash is next needed farthest in the future. Needs the future, so the engine
  never offers it.
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from collections import OrderedDict
from typing import ClassVar

from sortedcontainers import SortedList

from vllm_admission.core.admission import UnknownPolicyError

__all__ = [
    "EVICTION_POLICIES",
    "BeladyEviction",
    "EvictionPolicy",
    "FlopEviction",
    "LRUEviction",
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

    def __repr__(self) -> str:
        return f"{type(self).__name__}(candidates={len(self)})"


class LRUEviction(EvictionPolicy):
    """vLLM's order: first freed, first evicted (FIFO over free events).

    Within one free call vLLM passes a request's blocks tail first
    (``SingleTypeKVCacheManager.free``), so a request's last blocks go first.
    """

    name = "lru"
    summary = "vLLM's free-block queue order (least recently freed first)"

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

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._order


class FlopEviction(EvictionPolicy):
    """Marconi's FLOP-aware eviction over free cached blocks.

    Utility of a candidate ``n`` (Marconi section 4.2)::

        S(n) = norm(recency(n)) + alpha * norm(flop_efficiency(n))
        recency(n) = 1 / (now - last_access(n) + 1)

    ``norm`` is min-max normalisation over the current candidates; the lowest
    ``S`` is evicted (ties: the earlier freed block). ``alpha = 0`` is recency
    only, which orders like LRU. ``flop_efficiency`` is the ``value`` passed to
    :meth:`add`: FLOPs a hit on the block's segment saves, per byte the segment
    holds (computed by the cache model; see ``HybridPrefixCache``).

    The "+ 1" keeps recency finite for a block freed at the current logical
    time (Marconi's formula has ``now - last_access`` alone).

    Finding the minimum does not rescan the candidates: both terms are
    monotone, so Fagin's threshold algorithm over two sorted indexes (by
    last access, by value) stops as soon as the best utility seen is no larger
    than the utility that any unseen candidate could still reach. Each step
    costs O(log n); typical pops look at a handful of entries.
    """

    name = "flop"
    summary = "Marconi's utility: recency + alpha x FLOPs saved per byte (min-max normalised)"
    needs_values = True

    def __init__(self, alpha: float = 0.0) -> None:
        if not (alpha >= 0.0 and math.isfinite(alpha)):
            raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
        self.alpha = float(alpha)
        self._seq = itertools.count()
        self._entries: dict[int, tuple[float, float, int]] = {}  # id -> (t, v, seq)
        self._by_time: SortedList = SortedList()   # (t, seq, id)
        self._by_value: SortedList = SortedList()  # (v, seq, id)
        #: Entries inspected by the last :meth:`pop` (for benchmarks).
        self.last_scan = 0

    def add(self, block_id: int, now: float, value: float = 0.0,
            next_use: float = math.inf) -> None:
        if block_id in self._entries:
            raise KeyError(f"block {block_id} is already a candidate")
        seq = next(self._seq)
        self._entries[block_id] = (now, value, seq)
        self._by_time.add((now, seq, block_id))
        self._by_value.add((value, seq, block_id))

    def remove(self, block_id: int) -> None:
        t, v, seq = self._entries.pop(block_id)
        self._by_time.remove((t, seq, block_id))
        self._by_value.remove((v, seq, block_id))

    def set_value(self, block_id: int, value: float) -> None:
        """Change a candidate's FLOP efficiency (keeps its last access)."""
        t, v, seq = self._entries[block_id]
        if v == value:
            return
        self._by_value.remove((v, seq, block_id))
        self._by_value.add((value, seq, block_id))
        self._entries[block_id] = (t, value, seq)

    def utility(self, block_id: int, now: float) -> float:
        """``S(n)`` of a candidate at time ``now`` (for tests and reports)."""
        t, v, _ = self._entries[block_id]
        rec_term, val_term = self._normalisers(now)
        return rec_term(t) + val_term(v)

    def _normalisers(self, now: float):
        t_old, t_new = self._by_time[0][0], self._by_time[-1][0]
        r_min, r_max = 1.0 / (now - t_old + 1.0), 1.0 / (now - t_new + 1.0)
        r_span = r_max - r_min
        v_min, v_max = self._by_value[0][0], self._by_value[-1][0]
        v_span = v_max - v_min
        alpha = self.alpha

        def rec_term(t: float) -> float:
            return (1.0 / (now - t + 1.0) - r_min) / r_span if r_span > 0 else 0.0

        def val_term(v: float) -> float:
            return alpha * (v - v_min) / v_span if (v_span > 0 and alpha) else 0.0

        return rec_term, val_term

    def pop(self, now: float) -> int:
        if not self._entries:
            raise IndexError("pop from an empty eviction queue")
        rec_term, val_term = self._normalisers(now)
        entries = self._entries
        by_time, by_value = self._by_time, self._by_value
        best: tuple[float, int, int] | None = None  # (S, seq, id)
        n = len(entries)
        i = 0
        while i < n:
            t_i, seq_t, id_t = by_time[i]
            v_i, seq_v, id_v = by_value[i]
            for bid, seq in ((id_t, seq_t), (id_v, seq_v)):
                t, v, _ = entries[bid]
                cand = (rec_term(t) + val_term(v), seq, bid)
                if best is None or cand < best:
                    best = cand
            i += 1
            # No unseen candidate is older than t_i or cheaper than v_i.
            if best[0] <= rec_term(t_i) + val_term(v_i):
                break
        self.last_scan = i
        victim = best[2]
        self.remove(victim)
        return victim

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._entries


class BeladyEviction(EvictionPolicy):
    """Offline reference: evict the block whose hash is needed farthest ahead.

    ``next_use`` is the logical time of the next request whose prompt contains
    the block's hash (infinity if none); ties go to the earlier freed block.
    For a hybrid cache this is a strong reference, not a proven optimum: a
    state block is only useful if a later hit ends exactly on it.
    """

    name = "belady"
    summary = "offline reference: evict the block next needed farthest in the future"
    needs_future = True

    def __init__(self) -> None:
        self._seq = itertools.count()
        self._entries: dict[int, tuple[float, int]] = {}
        self._order: SortedList = SortedList()  # (-next_use, seq, id)

    def add(self, block_id: int, now: float, value: float = 0.0,
            next_use: float = math.inf) -> None:
        seq = next(self._seq)
        self._entries[block_id] = (next_use, seq)
        self._order.add((-next_use, seq, block_id))

    def remove(self, block_id: int) -> None:
        nu, seq = self._entries.pop(block_id)
        self._order.remove((-nu, seq, block_id))

    def pop(self, now: float) -> int:
        if not self._entries:
            raise IndexError("pop from an empty eviction queue")
        _, seq, bid = self._order.pop(0)
        del self._entries[bid]
        return bid

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._entries


#: Registry: name -> policy class.
EVICTION_POLICIES: dict[str, type[EvictionPolicy]] = {
    cls.name: cls for cls in (LRUEviction, FlopEviction, BeladyEviction)
}

#: Policies a live engine can run (no future knowledge).
ENGINE_EVICTION_POLICIES = tuple(n for n, c in EVICTION_POLICIES.items() if not c.needs_future)


def get_eviction(name: str, **options) -> EvictionPolicy:
    """Build the eviction policy registered under ``name``.

    Args:
        name: a key of :data:`EVICTION_POLICIES`.
        options: constructor options (``alpha`` for ``flop``).

    Raises:
        UnknownPolicyError: unknown name; the message lists the valid names.
        TypeError: an option the policy does not take.
    """
    try:
        cls = EVICTION_POLICIES[name]
    except KeyError:
        valid = ", ".join(EVICTION_POLICIES)
        raise UnknownPolicyError(f"unknown eviction policy {name!r}; valid: {valid}") from None
    return cls(**options)
