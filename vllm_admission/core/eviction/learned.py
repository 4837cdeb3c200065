"""``learned``: eviction guided by a gradient-boosted model of whether a block's hash
comes back, trained online on the trace's own past (after LRB's relaxed Bélády)."""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Hashable, Sequence

import numpy as np

from vllm_admission.core.errors import UserError
from vllm_admission.core.eviction.base import EvictionPolicy
from vllm_admission.core.eviction.fifo import BlockFifo, room
from vllm_admission.core.eviction.learning import (
    FEATURES,
    AccessHistory,
    ModelSchedule,
    Trainer,
    default_trainer,
)

__all__ = ["LearnedEviction"]

_DEPTH = FEATURES.index("depth")
#: The lower ends of the probability levels, one free-order queue each.
LEVELS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
#: The least probability a block is given (its age is divided by it).
_FLOOR = 0.01
#: The queue of blocks freed since the last request, not yet scored.
_UNSCORED = len(LEVELS)


class LearnedEviction(EvictionPolicy):
    """Free cached blocks in free-order queues by the probability, predicted by a model
    trained online, that a hit could reach through the block's hash soon; the victim
    is the queue head with the largest ``(age + 1) / probability``.

    **Label.** A sample is a block's features at request ``t``, the first request after
    it was freed (when it is scored, below). Its label is 1 when, within ``B`` requests, a
    later prompt holds the block's hash with every shallower block of that prompt cached
    (a *useful* access: the hit could reach through it, the block itself evicted or
    not); 0 when ``B`` passes without one; unknown, and not trained on, before either.
    ``B``, the Bélády boundary of LRB, is ``boundary`` x the pool's turnover (requests
    to evict as many blocks as the pool has held). Labels are only ever the past.

    **Features** (:data:`~vllm_admission.core.eviction.learning.FEATURES`): the gaps
    between the hash's last accesses, decayed access counts, ages, its depth, fan-out
    and cached children in the prefix tree, how often it ended a prompt, how many
    blocks (every KV cache group) hold it and its parent now, the block's group, and
    the last prompt that held it: its length, how much of it was known, the blocks
    after this one and its turn in the conversation.

    **Order.** The blocks freed since the last request are scored at the next one
    (:meth:`on_request`), with one model call for them all; until then they count as
    ``p = 1``. A block's probability ``p`` is the model's, at least 0.01, raised to the
    largest of the blocks freed with it (one ``add_many``) that lie deeper (a state or KV
    block serves a hit only with every shallower KV block). It joins the free-order queue
    of its level (:data:`LEVELS`); a victim is the head, of all queues, with the largest
    ``(now - freed + 1) / p``: the oldest block of equal worth goes first, as in
    ``lru``, and a block predicted back lives longer in proportion. Before the first
    model every block gets ``p = 1``: ``lru`` exactly.

    **Training.** Every ``retrain_every`` requests (at the request index, never wall
    time), on the newest ``window`` labelled samples once ``min_samples`` are
    labelled with both labels among them. The model trained at request ``k`` serves
    from request ``k + lag``
    (:class:`~vllm_admission.core.eviction.learning.ModelSchedule`); the fit runs in a
    background thread and is waited for only if it is not done by then, so the
    model at every request is fixed by the hooks' calls up to it, in the simulator
    and in the engine alike. LightGBM with a fixed seed, one thread and its
    ``deterministic`` flag.

    Why not LRB's sampled eviction: drawing 64 candidates and evicting the one
    predicted farthest broke prefixes (a shallow block evicted strands its cached
    descendants); on the Mooncake conversation trace at 64 GiB (Qwen3-Next) even
    sampled LRU by free age got 2.04 % against ``lru``'s 3.61 % (``docs/results.md``,
    section 9).

    Sources: Song, Berger, Li and Lloyd, "Learning Relaxed Belady for Content
    Distribution Network Caching", NSDI 2020 (the boundary, the gap and decayed-count
    features, the sliding training window); age over probability is GDSF's
    frequency-weighted priority (Cherkasova, HP Labs HPL-98-69) with the predicted
    probability in place of the count.

    Args:
        record: blocks of each batch freed together (one ``add_many``) kept as training
            samples when scored (a seeded draw).
        retrain_every: requests between two trainings (>= 1).
        lag: requests from a training's start until its model serves (>= 1).
        window: labelled samples a training uses (the newest).
        min_samples: labelled samples needed before the first training.
        boundary: ``B`` as a multiple of the pool's turnover (> 0).
        seed: the seed of the sample draw and of the model.
        trainer: fits the model (``None``: LightGBM in a background thread).

    Raises:
        UserError: an argument out of range, or LightGBM not installed.
    """

    name = "learned"
    summary = "free-order queues by a reuse probability learned online (LightGBM, after LRB)"

    def __init__(self, record: int = 16, retrain_every: int = 500, lag: int = 32,
                 window: int = 40_000, min_samples: int = 2_000, boundary: float = 4.0,
                 seed: int = 0, trainer: Trainer | None = None) -> None:
        if not isinstance(record, int) or record < 1:
            raise UserError(f"learned: record must be an integer >= 1, got {record!r}")
        self.record = record
        self.seed = seed
        self.schedule = ModelSchedule(
            retrain_every=retrain_every, lag=lag, window=window, min_samples=min_samples,
            boundary=boundary, trainer=trainer if trainer is not None else default_trainer(seed))
        self.hist = AccessHistory()
        self.rng = random.Random(seed)
        # One queue per level, free order, and last the blocks not yet scored.
        self._queues = [BlockFifo() for _ in range(len(LEVELS) + 1)]
        self._batches: list[list[int]] = []   # blocks freed together since the last request
        self._prob: list[float] = []       # block id -> its probability when freed
        self._level: list[int] = []        # block id -> its queue (-1: not a candidate)
        self._size = 0                     # candidates
        self._evicted = 0                  # victims so far (for the turnover)

    # -- what the cache hears ---------------------------------------------------
    def on_request(self, hashes: Sequence[int], now: float) -> None:
        self._score(now)
        self.hist.request(hashes, now)
        self.schedule.tick(now, self.hist, self._evicted)

    def on_cache(self, block_id: int, key: Hashable) -> None:
        self.hist.cached(block_id, key)

    def forget(self, block_id: int) -> None:
        self.hist.uncached(block_id)

    # -- candidates ---------------------------------------------------------------
    def add(self, block_id: int, now: float, value: float = 0.0,
            next_use: float = math.inf) -> None:
        self.add_many((block_id,), now, (), ())

    def add_many(self, block_ids: Sequence[int], now: float, values: Sequence[float],
                 next_uses: Sequence[float]) -> None:
        """Queue ``block_ids`` (freed together, in free order) as unscored: each gets its
        level at the next request (:meth:`_score`), and until then counts as ``p = 1``.

        Raises:
            KeyError: a block is already a candidate.
        """
        if not block_ids:
            return
        self._grow(max(block_ids))
        level, prob = self._level, self._prob
        for b in block_ids:
            if level[b] >= 0:
                raise KeyError(f"block {b} is already a candidate")
        for b in block_ids:
            level[b] = _UNSCORED
            prob[b] = 1.0
        self._queues[_UNSCORED].append_many(block_ids)
        self._size += len(block_ids)
        self._batches.append(list(block_ids))
        self.hist.freed(block_ids, now)

    def _score(self, now: float) -> None:
        """Give the blocks freed since the last request their levels: one feature row
        each, one model call for them all; record a seeded draw of each batch's rows as
        training samples."""
        pending, self._batches = self._batches, []
        level = self._level
        # A block taken back by a hit and freed again belongs to its latest batch only.
        seen: set[int] = set()
        batches: list[list[int]] = []
        for batch in reversed(pending):
            kept = [b for b in batch if level[b] == _UNSCORED and b not in seen]
            if kept:
                seen.update(kept)
                batches.append(kept)
        batches.reverse()
        if not batches:
            return
        blocks = [b for batch in batches for b in batch]
        hist = self.hist
        rows = hist.features(blocks, now)
        picks: list[int] = []
        start = 0
        for batch in batches:
            n = len(batch)
            draw = self.rng.sample(range(n), self.record) if self.record < n else range(n)
            picks.extend(start + i for i in sorted(draw))
            start += n
        self.schedule.record(rows[picks], [blocks[i] for i in picks], hist, now)
        # The unscored queue holds exactly these blocks, in this order.
        self._queues[_UNSCORED].popleft_n(len(blocks))
        self._size -= len(blocks)
        model = self.schedule.model(now)
        if model is None:
            self._queue(blocks, [1.0] * len(blocks))
            return
        p = np.maximum(model(rows), _FLOOR)
        depth = np.fmax(rows[:, _DEPTH], -1.0)   # NaN (no key): -1
        start = 0
        for batch in batches:
            # A block is worth what the deepest block freed with it is worth: a state or
            # KV block serves a hit only with every shallower KV block.
            end = start + len(batch)
            order = start + np.argsort(-depth[start:end], kind="stable")
            p[order] = np.maximum.accumulate(p[order])
            start = end
        self._queue(blocks, p.tolist())

    def _queue(self, block_ids: Sequence[int], probs: Sequence[float]) -> None:
        """Append each block to the queue of its probability's level."""
        prob, level_of = self._prob, self._level
        by_level: dict[int, list[int]] = {}
        for b, q in zip(block_ids, probs, strict=True):
            prob[b] = q
            level = bisect.bisect_right(LEVELS, q) - 1
            level_of[b] = level
            by_level.setdefault(level, []).append(b)
        for level, ids in by_level.items():
            self._queues[level].append_many(ids)
        self._size += len(block_ids)

    def _grow(self, block_id: int) -> None:
        more = room(len(self._prob), block_id)
        if more:
            self._prob.extend([1.0] * more)
            self._level.extend([-1] * more)

    def remove(self, block_id: int) -> None:
        level = self._level[block_id] if 0 <= block_id < len(self._level) else -1
        if level < 0:
            raise KeyError(block_id)
        self._queues[level].remove(block_id)
        self._level[block_id] = -1
        self._size -= 1

    def pop(self, now: float) -> int:
        return self.pop_n(1, now)[0]

    def pop_n(self, n: int, now: float) -> list[int]:
        """``n`` victims, each the head of a level's queue with the largest
        ``(age + 1) / probability`` (class docstring, "Order").

        Raises:
            IndexError: fewer than ``n`` candidates.
        """
        if n > len(self):
            raise IndexError(f"pop {n} from an eviction queue of {len(self)}")
        free_t, prob, level_of = self.hist.block_free, self._prob, self._level
        queues = [q for q in self._queues if q.size]
        # Each nonempty queue's head priority, updated only for the queue popped.
        score = [(now - free_t[q.head] + 1.0) / prob[q.head] for q in queues]
        out: list[int] = []
        while len(out) < n:
            i = max(range(len(queues)), key=score.__getitem__)
            q = queues[i]
            b = q.popleft()
            level_of[b] = -1
            out.append(b)
            if q.size:
                score[i] = (now - free_t[q.head] + 1.0) / prob[q.head]
            else:
                del queues[i], score[i]
        self.hist.uncached_many(out)
        self._size -= n
        self._evicted += n
        return out

    def clone(self) -> LearnedEviction:
        other = LearnedEviction.__new__(LearnedEviction)
        other.record, other.seed = self.record, self.seed
        other.schedule = self.schedule.copy()
        other.hist = self.hist.copy()
        other.rng = random.Random()
        other.rng.setstate(self.rng.getstate())
        other._queues = [q.copy() for q in self._queues]
        other._prob, other._level, other._size = self._prob[:], self._level[:], self._size
        other._batches = [batch[:] for batch in self._batches]
        other._evicted = self._evicted
        return other

    def __len__(self) -> int:
        return self._size

    def __contains__(self, block_id: int) -> bool:
        return 0 <= block_id < len(self._level) and self._level[block_id] >= 0

    def __repr__(self) -> str:
        return f"LearnedEviction(candidates={len(self)}, trainings={self.schedule.trainings})"
