"""``s3fifo``: S3-FIFO over free cached blocks: a small probation queue, a main queue, ghosts.

S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction", SOSP 2023,
section 4) keeps three FIFO queues: a small queue ``S`` (10 % of the cache) that every new
object enters, a main queue ``M``, and a ghost queue ``G`` of keys only. When ``S`` is over
its share, its oldest object moves to ``M`` if it was accessed while in the cache, and is
evicted otherwise, its key going to ``G``; an object whose key is in ``G`` enters ``M``
directly. ``M`` evicts its oldest object unless it was accessed, in which case it goes back
to the tail with its access count decremented (a CLOCK-like second chance). Access counts
are capped at 3. The idea: most objects are used once, and a small FIFO filters them out
quickly ("quick demotion") before they push reused objects out.

Here the cache's objects are blocks, an access is a prefix hit (:meth:`on_hit`), and only
free cached blocks can be evicted, so ``S``'s share is 10 % of the current candidates.
A block joins ``S`` or ``M`` when it becomes a candidate (its request freed it, tail
first as vLLM frees) and leaves its queue while a request holds it; its access count and
its membership of ``M`` last as long as its hash. Ghost keys are block hash keys
(:meth:`on_cache`, so the cache reports them: :attr:`~EvictionPolicy.needs_keys`); the ghost
queue holds as many keys as the policy has seen candidates at most. A block without a key
(generated tokens) leaves no ghost.
"""

from __future__ import annotations

import math
from collections import OrderedDict

from vllm_admission.core.errors import UserError
from vllm_admission.core.eviction.base import EvictionPolicy

__all__ = ["S3FifoEviction"]

#: Access counts are capped here (S3-FIFO's two-bit counter).
MAX_FREQ = 3


class S3FifoEviction(EvictionPolicy):
    """S3-FIFO (SOSP 2023) over the free cached blocks (module docstring).

    Args:
        small_fraction: ``S``'s share of the candidates, in (0, 1) (the paper's 10 %).
        promote_hits: prefix hits a block needs while in ``S`` to move to ``M`` rather
            than be evicted (the paper moves objects accessed at least once: 1).
        ghost_factor: ghost keys kept, as a multiple of the most candidates seen (the
            paper's ghost queue is as large as the cache: 1).

    Raises:
        UserError: ``small_fraction`` outside (0, 1), ``promote_hits`` below 1 or a
            ``ghost_factor`` that is not positive.
    """

    name = "s3fifo"
    summary = "S3-FIFO: new blocks in a small FIFO, reused ones in a main FIFO, ghosts by hash"

    def __init__(self, small_fraction: float = 0.1, promote_hits: int = 1, ghost_factor: float = 1.0) -> None:
        if not 0.0 < small_fraction < 1.0:
            raise UserError(f"small_fraction must be in (0, 1), got {small_fraction}")
        if promote_hits < 1:
            raise UserError(f"promote_hits must be at least 1, got {promote_hits}")
        if ghost_factor <= 0:
            raise UserError(f"ghost_factor must be positive, got {ghost_factor}")
        self.small_fraction = small_fraction
        self.promote_hits = promote_hits
        self.ghost_factor = ghost_factor
        self._small: OrderedDict[int, None] = OrderedDict()
        self._main: OrderedDict[int, None] = OrderedDict()
        self._freq: dict[int, int] = {}          # block -> prefix hits since cached (capped)
        self._in_main: set[int] = set()          # blocks of M, candidates or held
        self._key: dict[int, object] = {}        # block -> its hash key
        self._ghost: OrderedDict[object, None] = OrderedDict()
        self._ghost_size = 0

    # -- hooks ---------------------------------------------------------------
    def on_cache(self, block_id: int, key: object) -> None:
        self._key[block_id] = key

    def on_hit(self, block_id: int, now: float) -> None:
        self._freq[block_id] = min(self._freq.get(block_id, 0) + 1, MAX_FREQ)

    def forget(self, block_id: int) -> None:
        self._drop(block_id)

    # -- the order -------------------------------------------------------------
    def add(self, block_id: int, now: float, value: float = 0.0,
            next_use: float = math.inf) -> None:
        if block_id in self:
            raise KeyError(f"block {block_id} is already a candidate")
        if block_id not in self._in_main:
            key = self._key.get(block_id)
            if key is not None and key in self._ghost:
                del self._ghost[key]
                self._in_main.add(block_id)
        (self._main if block_id in self._in_main else self._small)[block_id] = None
        self._ghost_size = max(self._ghost_size, int(self.ghost_factor * len(self)))

    def remove(self, block_id: int) -> None:
        if block_id in self._small:
            del self._small[block_id]
        else:
            del self._main[block_id]

    def pop(self, now: float) -> int:
        small, main, freq = self._small, self._main, self._freq
        if not small and not main:
            raise IndexError("pop from an empty eviction queue")
        while True:
            if small and (not main or len(small) >= self.small_fraction * (len(small) + len(main))):
                block_id, _ = small.popitem(last=False)
                if freq.get(block_id, 0) >= self.promote_hits:
                    freq[block_id] = 0
                    self._in_main.add(block_id)
                    main[block_id] = None
                    continue
                key = self._key.get(block_id)
                if key is not None:
                    self._ghost[key] = None
                    while len(self._ghost) > self._ghost_size:
                        self._ghost.popitem(last=False)
                self._drop(block_id)
                return block_id
            block_id, _ = main.popitem(last=False)
            f = freq.get(block_id, 0)
            if f > 0:
                freq[block_id] = f - 1
                main[block_id] = None
                continue
            self._drop(block_id)
            return block_id

    def _drop(self, block_id: int) -> None:
        """Forget what is kept per block (it lost its hash)."""
        self._freq.pop(block_id, None)
        self._in_main.discard(block_id)
        self._key.pop(block_id, None)

    def clone(self) -> S3FifoEviction:
        other = S3FifoEviction(self.small_fraction, self.promote_hits, self.ghost_factor)
        other._small = self._small.copy()
        other._main = self._main.copy()
        other._freq = dict(self._freq)
        other._in_main = set(self._in_main)
        other._key = dict(self._key)
        other._ghost = self._ghost.copy()
        other._ghost_size = self._ghost_size
        return other

    def __len__(self) -> int:
        return len(self._small) + len(self._main)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._small or block_id in self._main
