"""``learned``: eviction guided by a gradient-boosted model of whether a block's hash
comes back, trained online on the trace's own past (after LRB's relaxed Bélády)."""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Sequence

import numpy as np

from vllm_admission.core.errors import UserError
from vllm_admission.core.eviction.base import EvictionPolicy
from vllm_admission.core.eviction.fifo import BlockFifo
from vllm_admission.core.eviction.learning import (
    FEATURES,
    AccessHistory,
    ModelSchedule,
    Trainer,
    default_trainer,
)

__all__ = ["LearnedEviction"]

_DEPTH = FEATURES.index("depth")


class LearnedEviction(EvictionPolicy):
    """Two LRU queues of free cached blocks, *keep* and *drop*, chosen per block by a
    model trained online: the probability that a request whose hit could reach
    through the block's hash comes within the boundary.

    **Label.** A sample is a block's features when it is freed at request ``t``; its
    label is 1 when a later prompt holds the block's hash with every shallower block
    of that prompt cached (a *useful* access: the hit could reach through it, the
    block itself evicted or not) within ``B`` requests, 0 when ``B`` passes without
    one, and unknown (not trained on) before. ``B``, the Bélády boundary of LRB, is
    ``boundary`` x the pool's turnover (requests to evict as many blocks as the pool
    has held). Labels are only ever the past.

    **Features** (:data:`~vllm_admission.core.eviction.learning.FEATURES`): the gaps
    between the hash's last accesses, decayed access counts, ages, its depth, fan-out
    and cached children in the prefix tree, how often it ended a prompt, how many
    blocks (every KV cache group) hold it and its parent now, and the block's group.

    **Order.** A freed block goes to *keep* when the model's probability is at least
    ``threshold``, or when a deeper block freed with it does (a kept state or KV block
    serves a hit only with every shallower KV block); otherwise to *drop*. Victims are
    the oldest *drop* blocks, except that a *keep* block freed more than ``B`` requests
    ago goes first (its predicted use is overdue), and *keep* serves when *drop* is
    empty. Within a queue blocks leave in free order, vLLM's tail-first order for one
    request. Before the first model every block goes to *drop*: ``lru`` exactly.

    **Training.** Every ``retrain_every`` requests (at the request index, never wall
    time), on the newest ``window`` labelled samples once ``min_samples`` are
    labelled. The model trained at request ``k`` serves from request ``k + lag``
    (:class:`~vllm_admission.core.eviction.learning.ModelSchedule`); the fit runs in a
    background thread and is waited for only if it is not done by then, so the
    model at every request is fixed by the hooks' calls up to it, in the simulator
    and in the engine alike. LightGBM with a fixed seed, one thread and its
    ``deterministic`` flag.

    Why not LRB's sampled eviction: drawing 64 candidates and evicting the one
    predicted farthest broke prefixes (a shallow block evicted strands its cached
    descendants); on the Mooncake conversation trace at 64 GiB (Qwen3-Next) even
    sampled LRU by free age got 2.04 % against ``lru``'s 3.61 %, the learned
    regressor 2.2-3.2 % (``docs/results.md``, "Learned eviction").

    Sources: Song, Berger, Li and Lloyd, "Learning Relaxed Belady for Content
    Distribution Network Caching", NSDI 2020 (the boundary, the gap and decayed-count
    features, the sliding training window); the two queues are ``reuse``'s
    (:class:`~vllm_admission.core.eviction.reuse.ReuseEviction`).

    Args:
        record: freed blocks per ``add_many`` kept as training samples (a seeded draw).
        retrain_every: requests between two trainings (>= 1).
        lag: requests from a training's start until its model serves (>= 1).
        window: labelled samples a training uses (the newest).
        min_samples: labelled samples needed before the first training.
        boundary: ``B`` as a multiple of the pool's turnover (> 0).
        threshold: the probability from which a block is kept, in [0, 1].
        seed: the seed of the sample draw and of the model.
        trainer: fits the model (``None``: LightGBM in a background thread).

    Raises:
        UserError: an argument out of range, or LightGBM not installed.
    """

    name = "learned"
    summary = "two LRU queues, keep and drop, chosen per block by a model trained online (after LRB)"

    def __init__(self, record: int = 16, retrain_every: int = 500, lag: int = 32,
                 window: int = 40_000, min_samples: int = 2_000, boundary: float = 4.0,
                 threshold: float = 0.3, seed: int = 0, trainer: Trainer | None = None) -> None:
        if not isinstance(record, int) or record < 1:
            raise UserError(f"learned: record must be an integer >= 1, got {record!r}")
        if not 0.0 <= threshold <= 1.0:
            raise UserError(f"learned: threshold must be in [0, 1], got {threshold!r}")
        self.record = record
        self.threshold = threshold
        self.seed = seed
        self.schedule = ModelSchedule(
            retrain_every=retrain_every, lag=lag, window=window, min_samples=min_samples,
            boundary=boundary, trainer=trainer if trainer is not None else default_trainer(seed))
        self.hist = AccessHistory()
        self.rng = random.Random(seed)
        self._keep = BlockFifo()           # predicted back within the boundary, free order
        self._drop = BlockFifo()           # the others, free order
        self._evicted = 0                  # victims so far (for the turnover)

    # -- what the cache hears ---------------------------------------------------
    def on_request(self, hashes: Sequence[int], now: float) -> None:
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
        """Queue ``block_ids`` (freed together, in free order) on *keep* or *drop*.

        Raises:
            KeyError: a block is already a candidate.
        """
        if not block_ids:
            return
        for b in block_ids:
            if b in self._keep or b in self._drop:
                raise KeyError(f"block {b} is already a candidate")
        hist = self.hist
        hist.freed(block_ids, now)
        rows = hist.features(block_ids, now)
        n = len(block_ids)
        picks = sorted(self.rng.sample(range(n), self.record)) if self.record < n else list(range(n))
        self.schedule.record(rows[picks], [block_ids[i] for i in picks], hist, now)
        model = self.schedule.model(now)
        if model is None:
            self._drop.append_many(block_ids)
            return
        keep = model(rows) >= self.threshold
        if keep.any():
            depth = np.nan_to_num(rows[:, _DEPTH], nan=-1.0)
            keep = depth <= depth[keep].max()
        flags = keep.tolist()
        self._keep.append_many([b for b, k in zip(block_ids, flags, strict=True) if k])
        self._drop.append_many([b for b, k in zip(block_ids, flags, strict=True) if not k])

    def remove(self, block_id: int) -> None:
        if block_id in self._keep:
            self._keep.remove(block_id)
        else:
            self._drop.remove(block_id)

    def pop(self, now: float) -> int:
        return self.pop_n(1, now)[0]

    def pop_n(self, n: int, now: float) -> list[int]:
        """``n`` victims (class docstring, "Order").

        Raises:
            IndexError: fewer than ``n`` candidates.
        """
        if n > len(self):
            raise IndexError(f"pop {n} from an eviction queue of {len(self)}")
        keep, drop = self._keep, self._drop
        free_t = self.hist.block_free
        overdue = now - self.schedule.bound
        out: list[int] = []
        while len(out) < n:
            if keep.size and (not drop.size or free_t[keep.head] < overdue):
                out.append(keep.popleft())
            else:
                out.append(drop.popleft())
        self.hist.uncached_many(out)
        self._evicted += n
        return out

    def clone(self) -> LearnedEviction:
        other = LearnedEviction.__new__(LearnedEviction)
        other.record, other.threshold, other.seed = self.record, self.threshold, self.seed
        other.schedule = self.schedule.copy()
        other.hist = self.hist.copy()
        other.rng = random.Random()
        other.rng.setstate(self.rng.getstate())
        other._keep, other._drop = self._keep.copy(), self._drop.copy()
        other._evicted = self._evicted
        return other

    def __len__(self) -> int:
        return self._keep.size + self._drop.size

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._keep or block_id in self._drop

    def __repr__(self) -> str:
        return (f"LearnedEviction(candidates={len(self)}, kept={self._keep.size}, "
                f"trainings={self.schedule.trainings})")
