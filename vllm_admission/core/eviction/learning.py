"""What ``learned`` (:class:`~vllm_admission.core.eviction.learned.LearnedEviction`)
learns from: the access history by block hash (:class:`AccessHistory`), the features
derived from it (:data:`FEATURES`), the labelled samples and the training schedule
(:class:`ModelSchedule`), and the trainer (:class:`LightGBMTrainer`).

Time is the request index (``now`` of the eviction hooks): every age, gap and
boundary here is a number of requests, and nothing depends on wall time.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, cast

import numpy as np

from vllm_admission.core.errors import UserError
from vllm_admission.core.eviction.fifo import room

__all__ = ["FEATURES", "LIGHTGBM_PARAMS", "LIGHTGBM_ROUNDS", "AccessHistory", "LightGBMTrainer",
           "ModelSchedule", "Predictor", "Trainer", "default_trainer", "lightgbm_available"]

#: Half-lives, in requests, of the decayed access counts (LRB keeps several such counts).
#: The decay is hyperbolic, ``1 / (1 + dt / half_life)``: arithmetic alone, so a count is the
#: same on every CPU (NumPy's ``exp2`` is vectorised differently per instruction set, and a
#: last-place difference can move a tree's split).
HALF_LIVES = (16.0, 256.0, 4096.0)
#: Gaps between accesses kept per hash, newest first.
GAPS = 4

#: The model's input columns, in order (all float; NaN where unknown).
FEATURES: tuple[str, ...] = (
    "age",              # requests since a prompt last held the hash
    *(f"gap{i + 1}" for i in range(GAPS)),    # gaps between its last accesses, newest first
    "count",            # prompts that held the hash
    *(f"edc{int(h)}" for h in HALF_LIVES),   # access counts decayed with these half-lives
    "depth",            # the block's index in its prompts: its depth in the prefix tree
    "children",         # distinct hashes seen right after it (fan-out in the prefix tree)
    "ends",             # prompts whose last full block it was
    "live",             # blocks holding the hash now, every KV cache group counted
    "group",            # the block's KV cache group index (its kind, for one model)
    "free_age",         # requests since this block was freed
    "first_age",        # requests since a prompt first held the hash
    "parent_live",      # blocks holding the parent hash now (NaN at the root)
    "cached_children",  # child hashes some block holds now (0: a leaf of the cached tree)
    "prompt_blocks",    # full blocks of the last prompt that held the hash
    "prompt_known",     # how many of that prompt's leading blocks an earlier prompt held
    "from_end",         # that prompt's blocks after this one
    "turn",             # that prompt's turn: 1 + the turn of the prompt it continued
)

# Columns of the per-hash table.
(_LAST, _COUNT, _EDC_T, _DEPTH, _CHILDREN, _ENDS, _FIRST, _PROMPT, _KNOWN, _TURN) = range(10)
_GAP0 = 10
_EDC0 = _GAP0 + GAPS
_COLS = _EDC0 + len(HALF_LIVES)
_ZERO_COLS = [_COUNT, _CHILDREN, _ENDS, *range(_EDC0, _COLS)]


class Predictor(Protocol):
    """A trained model: ``f(rows)``, rows of shape ``(n, len(FEATURES))`` (float64), to
    the probability of each row's label being 1, shape ``(n,)``."""

    def __call__(self, rows: np.ndarray) -> np.ndarray: ...


class Trainer(Protocol):
    """Fits a :class:`Predictor`: ``start`` may return before the fit is done, and
    ``finish`` returns the model of the ``start`` that gave ``handle``, waiting if
    needed."""

    def start(self, x: np.ndarray, y: np.ndarray) -> object: ...

    def finish(self, handle: object) -> Predictor: ...


def lightgbm_available() -> bool:
    """Whether LightGBM can be imported (``learned`` needs it)."""
    try:
        import lightgbm  # noqa: F401
    except ImportError:
        return False
    return True


#: LightGBM's parameters: a binary classifier of few small trees (one prediction per
#: batch of freed blocks must be cheap), one thread, ``deterministic`` and a seed, so a
#: fit gives the same model on every run.
LIGHTGBM_PARAMS: dict[str, Any] = {
    "objective": "binary", "num_leaves": 31, "learning_rate": 0.1, "min_data_in_leaf": 20,
    "num_threads": 1, "deterministic": True, "force_row_wise": True, "verbose": -1,
}
#: Boosting rounds per fit.
LIGHTGBM_ROUNDS = 32


class _Booster:
    """A LightGBM booster as a :class:`Predictor`."""

    def __init__(self, booster: Any) -> None:
        self.booster = booster

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(self.booster.predict(rows, num_threads=1))


class LightGBMTrainer:
    """Fits LightGBM (:data:`LIGHTGBM_PARAMS`) with ``seed``, in one background thread
    (``background``) or in the calling thread. LightGBM releases the GIL while it
    fits, so a background fit stays off the scheduler's path."""

    def __init__(self, seed: int = 0, background: bool = True) -> None:
        self.seed = seed
        self.background = background
        self._pool: ThreadPoolExecutor | None = None

    def fit(self, x: np.ndarray, y: np.ndarray) -> Predictor:
        """The model fitted to rows ``x`` of :data:`FEATURES` and labels ``y`` (0 or 1)."""
        import lightgbm as lgb
        params = dict(LIGHTGBM_PARAMS, seed=self.seed)
        data = lgb.Dataset(x, y, feature_name=list(FEATURES), free_raw_data=True)
        return _Booster(lgb.train(params, data, num_boost_round=LIGHTGBM_ROUNDS))

    def start(self, x: np.ndarray, y: np.ndarray) -> object:
        if not self.background:
            return self.fit(x, y)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="learned-fit")
        return self._pool.submit(self.fit, x, y)

    def finish(self, handle: object) -> Predictor:
        if isinstance(handle, Future):
            result: Predictor = handle.result()
            return result
        return cast(Predictor, handle)   # fitted inline: start returned the model

    def __getstate__(self) -> dict[str, Any]:
        return {"seed": self.seed, "background": self.background, "_pool": None}


def default_trainer(seed: int = 0) -> Trainer:
    """LightGBM, fitting in a background thread.

    Raises:
        UserError: LightGBM is not installed.
    """
    if not lightgbm_available():
        raise UserError("eviction policy 'learned' needs LightGBM: pip install lightgbm")
    return LightGBMTrainer(seed)


class AccessHistory:
    """Accesses by block hash, and the blocks holding each hash.

    An *access* of a hash is a prompt that holds it (:meth:`request`, with the prompt's
    chained block hashes, so a hash's parent is the one before it); a block is tied to
    its hash by :meth:`cached` (``on_cache``'s ``(group, hash)`` key). Per hash a row
    of a float table; per block its hash's row, its group and its free time. Row 0
    belongs to blocks without a key (every feature of the hash unknown).
    """

    def __init__(self) -> None:
        self.slot_of: dict[Hashable, int] = {}
        self.table = np.full((1024, _COLS), np.nan)
        self.slots = 1
        # Per hash row, kept as lists (changed one entry at a time): blocks holding it,
        # child hashes some block holds, the parent's row (-1: none).
        self.live: list[float] = [0.0] * 1024
        self.kids: list[float] = [0.0] * 1024
        self.parent: list[int] = [-1] * 1024
        # Per block id: its hash's row (0: none), its group, its free time.
        self.block_slot: list[int] = []
        self.block_group: list[float] = []
        self.block_free: list[float] = []
        #: Samples waiting for their hash's next useful access: slot -> sample ids.
        self.waiting: dict[int, list[int]] = {}
        #: Useful accesses not yet given to the waiting samples: (slot, request).
        self.arrivals: list[tuple[int, float]] = []

    def copy(self) -> AccessHistory:
        other = AccessHistory.__new__(AccessHistory)
        other.slot_of = dict(self.slot_of)
        other.table, other.slots = self.table.copy(), self.slots
        other.live, other.kids, other.parent = self.live[:], self.kids[:], self.parent[:]
        other.block_slot, other.block_group = self.block_slot[:], self.block_group[:]
        other.block_free = self.block_free[:]
        other.waiting = {s: ids[:] for s, ids in self.waiting.items()}
        other.arrivals = self.arrivals[:]
        return other

    def _slot(self, h: Hashable) -> tuple[int, bool]:
        """The row of hash ``h``, and whether it is new."""
        s = self.slot_of.get(h)
        if s is not None:
            return s, False
        s = self.slots
        if s >= len(self.table):
            more = len(self.table)
            self.table = np.vstack((self.table, np.full((more, _COLS), np.nan)))
            self.live.extend([0.0] * more)
            self.kids.extend([0.0] * more)
            self.parent.extend([-1] * more)
        self.table[s, _ZERO_COLS] = 0.0
        self.slot_of[h] = s
        self.slots = s + 1
        return s, True

    def request(self, hashes: Sequence[Hashable], now: float) -> None:
        """A prompt with chained block hashes ``hashes`` arrived at request ``now``,
        before any of its blocks is cached."""
        if not hashes:
            return
        slots = []
        parent = -1
        known = 0
        for depth, h in enumerate(hashes):
            s, new = self._slot(h)
            if not new and known == depth:
                known = depth + 1
            if new:
                table = self.table
                table[s, _FIRST] = now
                table[s, _DEPTH] = depth
                if parent >= 0:
                    table[parent, _CHILDREN] += 1.0
                    self.parent[s] = parent
                    if self.live[s] > 0:   # cached before any prompt held it
                        self.kids[parent] += 1.0
            slots.append(s)
            parent = s
        table = self.table
        # The turn: one more than the turn of the prompt this one continues (the
        # deepest known block ended a prompt), else 1.
        deepest = table[slots[known - 1]] if known else None
        turn = 1.0
        if deepest is not None and deepest[_ENDS] > 0 and not math.isnan(deepest[_TURN]):
            turn = deepest[_TURN] + 1.0
        idx = np.asarray(slots, dtype=np.int64)
        rows = table[idx]
        # Useful accesses: the prompt's blocks up to its first one no group holds, that
        # one included (a hit could reach through each, were it cached).
        live = self.live
        reach = next((i + 1 for i, s in enumerate(slots) if live[s] <= 0), len(slots))
        last = rows[:, _LAST]
        seen = ~np.isnan(last)
        rows[:, _GAP0 + 1:_GAP0 + GAPS] = rows[:, _GAP0:_GAP0 + GAPS - 1]
        rows[:, _GAP0] = np.where(seen, now - last, np.nan)
        decay = np.where(seen, now - rows[:, _EDC_T], 0.0)
        for j, half_life in enumerate(HALF_LIVES):
            rows[:, _EDC0 + j] = rows[:, _EDC0 + j] / (1.0 + decay / half_life) + 1.0
        rows[:, _EDC_T] = now
        rows[:, _LAST] = now
        rows[:, _COUNT] += 1.0
        rows[:, _PROMPT] = len(slots)
        rows[:, _KNOWN] = known
        rows[:, _TURN] = turn
        table[idx] = rows
        table[slots[-1], _ENDS] += 1.0
        self.arrivals.extend((s, now) for s in slots[:reach])

    def _grow_blocks(self, block_id: int) -> None:
        more = room(len(self.block_slot), block_id)
        if more:
            self.block_slot.extend([0] * more)
            self.block_group.extend([math.nan] * more)
            self.block_free.extend([math.nan] * more)

    def _live(self, s: int, delta: float) -> None:
        """Add ``delta`` to the blocks holding slot ``s``; keep its parent's count of
        cached children."""
        live = self.live
        before = live[s]
        after = before + delta
        live[s] = after
        if (before > 0) != (after > 0):
            parent = self.parent[s]
            if parent >= 0:
                self.kids[parent] += 1.0 if after > 0 else -1.0

    def cached(self, block_id: int, key: Hashable) -> None:
        """Block ``block_id`` was given key ``(group, block hash)``."""
        # on_cache's keys are (group, block hash) pairs (EvictionPolicy.on_cache).
        group, h = cast(tuple[Hashable, Hashable], key)
        s, _ = self._slot(h)
        self._grow_blocks(block_id)
        old = self.block_slot[block_id]
        if old:
            self._live(old, -1.0)
        self.block_slot[block_id] = s
        self.block_group[block_id] = group if isinstance(group, int) else math.nan
        self._live(s, 1.0)

    def uncached(self, block_id: int) -> None:
        """``block_id`` lost its key (evicted, or dropped by the cache)."""
        if block_id < len(self.block_slot):
            s = self.block_slot[block_id]
            if s:
                self._live(s, -1.0)
                self.block_slot[block_id] = 0

    def uncached_many(self, block_ids: Sequence[int]) -> None:
        """:meth:`uncached` of each block."""
        for b in block_ids:
            self.uncached(b)

    def freed(self, block_ids: Sequence[int], now: float) -> None:
        """``block_ids`` were freed at request ``now``."""
        self._grow_blocks(max(block_ids))
        free = self.block_free
        for b in block_ids:
            free[b] = now

    def features(self, block_ids: Sequence[int], now: float) -> np.ndarray:
        """Rows of :data:`FEATURES` for ``block_ids`` at request ``now``: shape
        ``(len(block_ids), len(FEATURES))``, float64."""
        if block_ids:
            self._grow_blocks(max(block_ids))
        block_slot, live, kids, parent = self.block_slot, self.live, self.kids, self.parent
        slots = [block_slot[b] for b in block_ids]
        rows = self.table[slots]
        out = np.empty((len(slots), len(FEATURES)))
        out[:, 0] = now - rows[:, _LAST]
        out[:, 1:1 + GAPS] = rows[:, _GAP0:_GAP0 + GAPS]
        out[:, 1 + GAPS] = rows[:, _COUNT]
        decay = now - rows[:, _EDC_T]
        k = 2 + GAPS
        for j, half_life in enumerate(HALF_LIVES):
            out[:, k + j] = rows[:, _EDC0 + j] / (1.0 + decay / half_life)
        k += len(HALF_LIVES)
        out[:, k] = rows[:, _DEPTH]
        out[:, k + 1] = rows[:, _CHILDREN]
        out[:, k + 2] = rows[:, _ENDS]
        out[:, k + 3] = [live[s] if s else math.nan for s in slots]
        out[:, k + 4] = [self.block_group[b] for b in block_ids]
        out[:, k + 5] = [now - self.block_free[b] for b in block_ids]
        out[:, k + 6] = now - rows[:, _FIRST]
        out[:, k + 7] = [live[parent[s]] if s and parent[s] >= 0 else math.nan for s in slots]
        out[:, k + 8] = [kids[s] if s else math.nan for s in slots]
        out[:, k + 9] = rows[:, _PROMPT]
        out[:, k + 10] = rows[:, _KNOWN]
        out[:, k + 11] = rows[:, _PROMPT] - rows[:, _DEPTH] - 1.0
        out[:, k + 12] = rows[:, _TURN]
        return out


class ModelSchedule:
    """The labelled samples, and the model serving at each request.

    A sample is a row of :data:`FEATURES` of a block with hash row ``s``, taken at
    request ``t`` when the block is scored, the first request after it was freed
    (:meth:`record`). Its label is 1 once a useful access of ``s``
    (:meth:`AccessHistory.request`) comes within ``B`` requests after ``t``, 0 once
    ``t + B`` has passed without one; unknown, and left out, before either. ``B`` is
    ``boundary`` x the pool's turnover, measured at each training.

    A training starts at the first request index past each multiple of
    ``retrain_every`` with at least ``min_samples`` labelled, both labels among them,
    on the newest ``window``; its model serves from ``lag`` requests later (:meth:`model`).

    Raises:
        UserError: an argument out of range.
    """

    def __init__(self, *, retrain_every: int, lag: int, window: int, min_samples: int,
                 boundary: float, trainer: Trainer) -> None:
        for name, v in (("retrain_every", retrain_every), ("lag", lag), ("window", window),
                        ("min_samples", min_samples)):
            if not isinstance(v, int) or v < 1:
                raise UserError(f"learned: {name} must be an integer >= 1, got {v!r}")
        if not (boundary > 0 and math.isfinite(boundary)):
            raise UserError(f"learned: boundary must be a finite number > 0, got {boundary!r}")
        self.retrain_every, self.lag, self.window = retrain_every, lag, window
        self.min_samples, self.boundary, self.trainer = min_samples, boundary, trainer
        self.x = np.empty((1024, len(FEATURES)))
        self.t = np.empty(1024)
        self.gap = np.empty(1024)       # requests to the next useful access; NaN: none yet
        self.base = 0                   # the sample id of row 0
        self.n = 0                      # rows in use
        self.current: Predictor | None = None
        self.pending: tuple[float, object] | None = None   # (serves from, trainer handle)
        self.next_training = float(retrain_every)
        self.trainings = 0
        self.max_live = 1
        self._mark: tuple[float, int] | None = None   # (request, evictions) at the last training

    def copy(self) -> ModelSchedule:
        """An independent copy; a fit in progress is waited for."""
        other = ModelSchedule.__new__(ModelSchedule)
        other.__dict__.update(self.__dict__)
        other.x, other.t, other.gap = self.x.copy(), self.t.copy(), self.gap.copy()
        if self.pending is not None:
            serves, handle = self.pending
            self.pending = other.pending = (serves, _Done(self._finish(handle)))
        return other

    def record(self, rows: np.ndarray, blocks: Sequence[int], hist: AccessHistory,
               now: float) -> None:
        """Keep ``rows``, the features of ``blocks`` scored at request ``now``, as samples."""
        k = len(blocks)
        if not k:
            return
        if self.n + k > len(self.x):
            self._trim(hist)
            if self.n + k > len(self.x):
                cap = 2 * (self.n + k)
                self.x = np.resize(self.x, (cap, len(FEATURES)))
                self.t = np.resize(self.t, cap)
                self.gap = np.resize(self.gap, cap)
        i = self.n
        self.x[i:i + k] = rows
        self.t[i:i + k] = now
        self.gap[i:i + k] = math.nan
        first = self.base + i
        block_slot = hist.block_slot
        for j, s in enumerate(block_slot[b] for b in blocks):
            if s:
                hist.waiting.setdefault(s, []).append(first + j)
        self.n = i + k

    def _label(self, hist: AccessHistory) -> None:
        """Give every waiting sample whose hash had a useful access its gap."""
        waiting, gap, t, base, n = hist.waiting, self.gap, self.t, self.base, self.n
        for s, now in hist.arrivals:
            ids = waiting.pop(s, None)
            if not ids:
                continue
            later = []
            for sid in ids:
                i = sid - base
                if 0 <= i < n:
                    if t[i] < now:
                        gap[i] = now - t[i]
                    else:
                        later.append(sid)   # recorded at this very request
            if later:
                waiting[s] = later
        hist.arrivals.clear()

    def _trim(self, hist: AccessHistory) -> None:
        """Drop all but the newest ``2 x window`` samples (and, when the waiting lists
        hold many more ids than samples, the ids of dropped samples)."""
        keep = 2 * self.window
        if self.n <= keep:
            return
        cut = self.n - keep
        self.x[:keep] = self.x[cut:self.n]
        self.t[:keep] = self.t[cut:self.n]
        self.gap[:keep] = self.gap[cut:self.n]
        self.n = keep
        self.base += cut
        if sum(map(len, hist.waiting.values())) > 4 * keep:
            base = self.base
            kept = {s: [i for i in ids if i >= base] for s, ids in hist.waiting.items()}
            hist.waiting = {s: ids for s, ids in kept.items() if ids}

    def _turnover(self, now: float, evicted: int, hist: AccessHistory) -> float:
        """Requests the pool took, since the last training, to evict as many blocks
        as it has held at most (infinite before any eviction)."""
        self.max_live = max(self.max_live, int(sum(hist.live[1:hist.slots])))
        mark, self._mark = self._mark, (now, evicted)
        if mark is None or evicted <= mark[1] or now <= mark[0]:
            return math.inf
        return self.max_live * (now - mark[0]) / (evicted - mark[1])

    def tick(self, now: float, hist: AccessHistory, evicted: int) -> None:
        """Request ``now`` arrived (``evicted``: victims so far): label the samples,
        and start a training when one is due."""
        self._label(hist)
        if now < self.next_training:
            return
        self.next_training = (math.floor(now / self.retrain_every) + 1) * self.retrain_every
        turnover = self._turnover(now, evicted, hist)
        if not math.isfinite(turnover):
            return
        bound = self.boundary * turnover
        n = self.n
        gap, t = self.gap[:n], self.t[:n]
        known = ~np.isnan(gap) | (t + bound <= now)
        idx = np.flatnonzero(known)[-self.window:]
        if len(idx) < self.min_samples:
            return
        y = (np.nan_to_num(gap[idx], nan=math.inf) <= bound).astype(np.float64)
        if not 0 < y.sum() < len(y):   # one class only: nothing to tell apart yet
            return
        if self.pending is not None:   # the fit before this one serves until this one does
            self.current = self._finish(self.pending[1])
        self.pending = (now + self.lag, self.trainer.start(self.x[idx], y))
        self.trainings += 1

    def _finish(self, handle: object) -> Predictor:
        return handle.model if isinstance(handle, _Done) else self.trainer.finish(handle)

    def model(self, now: float) -> Predictor | None:
        """The model serving at request ``now`` (``None`` before the first)."""
        if self.pending is not None and now >= self.pending[0]:
            self.current = self._finish(self.pending[1])
            self.pending = None
        return self.current


class _Done:
    """A fit already finished, as a handle any trainer's ``finish`` returns."""

    def __init__(self, model: Predictor) -> None:
        self.model = model
