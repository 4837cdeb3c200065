"""The queue of free cached blocks that ``lru`` and ``reuse`` keep: first in, first
out, with O(1) removal anywhere, over non-negative integer block ids.

Also :func:`room`, the growth rule of the tables indexed by block id that the
policies keep (this queue's, ``reuse``'s history).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ABSENT", "END", "BlockFifo", "room"]


ABSENT = -2   # BlockFifo: not queued
END = -1      # BlockFifo: no neighbour


def room(size: int, block_id: int) -> int:
    """Entries to add to a table indexed by block id, now ``size`` long, so that
    it holds ``block_id``: at least half again its size (amortised O(1) growth).

    Raises:
        ValueError: ``block_id`` is negative.
    """
    if block_id < 0:
        raise ValueError(f"block ids must be >= 0, got {block_id}")
    return max(block_id + 1 - size, size >> 1) if block_id >= size else 0


class BlockFifo:
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
        self.prv: list[int] = []    # ABSENT for ids not queued
        self.head = END
        self.tail = END
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def __contains__(self, b: int) -> bool:
        return 0 <= b < len(self.prv) and self.prv[b] != ABSENT

    def _grow(self, top: int, bottom: int) -> None:
        """Make room for ids up to ``top`` (ValueError if ``bottom`` < 0)."""
        room(0, bottom)
        more = room(len(self.prv), top)
        if more:
            self.prv.extend([ABSENT] * more)
            self.nxt.extend([END] * more)

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
            if prv[b] != ABSENT:
                break
            prv[b] = t
            if t == END:
                self.head = b
            else:
                nxt[t] = b
            t = b
        else:
            nxt[t] = END
            self.tail = t
            self.size += len(ids)
            return
        # A duplicate: keep what was queued before it (the queue stays sound), then refuse.
        if t != END:
            nxt[t] = END
        c = self.head if self.tail == END else nxt[self.tail]
        queued = 0
        while c != END:
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
        if p == END:
            self.head = q
        else:
            nxt[p] = q
        if q == END:
            self.tail = p
        else:
            prv[q] = p
        prv[b] = ABSENT
        self.size -= 1

    def popleft(self) -> int:
        """Remove and return the id at the head."""
        b = self.head
        if b == END:
            raise IndexError("pop from an empty eviction queue")
        self.head = q = self.nxt[b]
        self.prv[b] = ABSENT
        if q == END:
            self.tail = END
        else:
            self.prv[q] = END
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
            prv[b] = ABSENT
            b = nxt[b]
        self.head = b
        if b == END:
            self.tail = END
        else:
            prv[b] = END
        self.size -= n
        return out

    def copy(self) -> BlockFifo:
        other = BlockFifo()
        other.nxt, other.prv = self.nxt[:], self.prv[:]
        other.head, other.tail, other.size = self.head, self.tail, self.size
        return other
