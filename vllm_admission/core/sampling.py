"""Which requests ``auto``'s shadow caches serve: a hashed sample of prefix subtrees.

Miniature simulation (Waldspurger et al., "Efficient MRC Construction with
SHARDS", FAST'15; "Cache Modeling and Optimization using Miniature
Simulations", ATC'17) predicts a cache of ``C`` blocks from a cache of
``R * C`` blocks that sees only the references whose key hashes below
``R * 2**64``: a key is either in the sample with all its references or not
at all, so each sampled key's reuse pattern is kept whole, and the scaled cache
keeps the same pressure.

A prefix cache's references are not independent keys: a request's hit depends
on every earlier request that shares a prefix with it. Sampling single blocks
would break every prefix apart; sampling by a request's first block would put
every request under one system prompt in or out together (on the Mooncake
conversation trace all 12,031 requests share their first 512-token block). So
the sampling unit here is a **prefix subtree**: the subtree under the deepest
*branch point* on the request's chain of block hashes, a block that has been
followed by at least ``fanout`` distinct next blocks (a system prompt, a few-shot
template, an agent's shared context). A conversation or an agent loop, whose
turns extend one chain, stays one unit; the popular prefixes above the branch
points are reached from many units, so the sample sees them as often as the
rate says and the scaled cache keeps them as the full cache would.

What it costs: one dictionary lookup per prompt block, and a table of at most
``max_nodes`` block hashes (when it is full the blocks that are not branch
points are dropped, and the oldest branch points beyond half the table), so
memory stays bounded whatever the trace's length.

A unit is in the sample when the hash (:func:`~vllm_admission.core.hashing.mix64`) of the index of the
request that opened it, its first request, falls below ``rate * 2**64``. The
index, not the block hash itself, so that the sample depends only on the shape
of the request sequence: the simulator (the trace's block keys) and the engine
(vLLM's block hashes) pick the same requests, and ``fidelity`` stays exact
with sampled shadows. A unit not seen among the last ``max_nodes`` units is
opened again by its next request.

A branch point is only known once ``fanout`` requests went through it: until
then the requests under it are sampled as one unit (the first few requests of
each popular prefix).

This module imports neither vLLM nor torch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from vllm_admission.core.errors import UserError
from vllm_admission.core.hashing import MASK64, mix64

__all__ = ["BranchTable", "PrefixSampler"]

_HOT = object()          # marks a branch point in the table


class BranchTable:
    """Branch points of the key chains seen so far: keys followed by at least ``fanout``
    distinct next keys. The one definition of a branch point, used online by
    :class:`PrefixSampler` (chains of block hashes) and offline by
    :func:`~vllm_admission.core.traces.resample.shared_prefix_keys` (chains of span keys).

    Args:
        fanout: distinct next keys that make a key a branch point (>= 2).
        max_nodes: most keys the table holds (``None``: no bound). When it is full the
            keys that are not branch points are dropped, and the oldest branch points
            beyond half the table (a popular one is found again after ``fanout`` more
            chains through it).

    Raises:
        UserError: a fanout below 2, or ``max_nodes`` below 1.
    """

    def __init__(self, fanout: int = 4, max_nodes: int | None = None) -> None:
        if not (isinstance(fanout, int) and fanout >= 2):
            raise UserError(f"a branch point needs a fanout >= 2, got {fanout!r}")
        if max_nodes is not None and not (isinstance(max_nodes, int) and max_nodes >= 1):
            raise UserError(f"the branch table needs max_nodes >= 1, got {max_nodes!r}")
        self.fanout = fanout
        self.max_nodes = max_nodes
        # key -> its one next key, a set of fewer than ``fanout`` next keys, or _HOT.
        self._next: dict[int, object] = {}

    def __len__(self) -> int:
        return len(self._next)

    def record(self, keys: Sequence[int]) -> int:
        """Record the chain ``keys``; the index of the deepest branch point on it, this
        chain counted (-1: none)."""
        table = self._next
        deepest = -1
        last = len(keys) - 1
        for i in range(last):
            h, child = keys[i], keys[i + 1]
            known = table.get(h)
            if known is _HOT:
                deepest = i
            elif known is None:
                table[h] = child
            elif isinstance(known, set):
                known.add(child)
                if len(known) >= self.fanout:
                    del table[h]             # to the end: the newest branch point
                    table[h] = _HOT
                    deepest = i
            elif known != child:
                if self.fanout == 2:
                    del table[h]
                    table[h] = _HOT
                    deepest = i
                else:
                    table[h] = {known, child}
        if last >= 0 and table.get(keys[last]) is _HOT:
            deepest = last
        if self.max_nodes is not None and len(table) > self.max_nodes:
            hot = [h for h, v in table.items() if v is _HOT]
            self._next = dict.fromkeys(hot[-(self.max_nodes // 2):], _HOT)
        return deepest

    def deepest(self, keys: Sequence[int]) -> int:
        """The index of the deepest branch point on ``keys`` (-1: none), recording nothing."""
        table = self._next
        return max((i for i, k in enumerate(keys) if table.get(k) is _HOT), default=-1)


class PrefixSampler:
    """Decides, request by request, whether a request is in the sample.

    Args:
        rate: the fraction of sampling units kept, in ``(0, 1]``.
        fanout: distinct next blocks that make a block a branch point (>= 2).
        max_nodes: most block hashes the branch table holds, and most units
            whose first request is remembered (>= 1).

    Raises:
        UserError: a rate outside ``(0, 1]``, a fanout below 2 or ``max_nodes`` below 1.

    Use: :meth:`sampled` once per request, in serving order.
    """

    def __init__(self, rate: float, *, fanout: int = 4, max_nodes: int = 1 << 18) -> None:
        if not (isinstance(rate, (int, float)) and 0.0 < rate <= 1.0):
            raise UserError(f"the shadow sample rate must be in (0, 1], got {rate!r}")
        #: Branch points of the block-hash chains seen (bounded by ``max_nodes``).
        self.branches = BranchTable(fanout, max_nodes)
        self.rate = float(rate)
        self.max_nodes = max_nodes
        self._threshold = min(MASK64 + 1, round(self.rate * (MASK64 + 1)))
        # unit key -> index of its first request, least recently seen first
        self._opened: OrderedDict[int, int] = OrderedDict()
        #: Requests seen, and those in the sample.
        self.seen = 0
        self.kept = 0

    def unit(self, hashes: Sequence[int]) -> int | None:
        """The key of the request's sampling unit, after recording its chain: the
        block after the deepest branch point on ``hashes`` (the request's first
        block when none is a branch point, the last when it ends on one);
        ``None`` for a prompt without a full block."""
        if not hashes:
            return None
        return hashes[min(self.branches.record(hashes) + 1, len(hashes) - 1)]

    def sampled(self, hashes: Sequence[int], index: int) -> int | None:
        """The sampling unit's key (:meth:`unit`; a prompt without a full block is
        its own unit, keyed by its ``index``) when request ``index`` with prompt
        block keys ``hashes`` is in the sample, else ``None``. With ``rate`` 1
        every request is kept, under its ``index``, and nothing is recorded."""
        self.seen += 1
        if self.rate >= 1.0:
            self.kept += 1
            return index
        key = self.unit(hashes)
        if key is None:
            key = first = index
        else:
            opened = self._opened
            known = opened.get(key)
            if known is None:
                opened[key] = first = index
                if len(opened) > self.max_nodes:
                    opened.popitem(last=False)
            else:
                first = known
                opened.move_to_end(key)
        if mix64(first) < self._threshold:
            self.kept += 1
            return key
        return None
