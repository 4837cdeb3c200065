"""Online tuning of the FLOP-aware eviction weight ``alpha``.

Bootstrap, as in Marconi (section 4.2): start with ``alpha = 0``. When the
first eviction happens, note how many requests came before it; once
``multiplier`` times that many requests have been served (the bootstrap
window), replay the window from an empty cache for every ``alpha`` of the grid
and keep the one that saved the most prefill FLOPs.

The live run itself is the replay for the live alpha (0 during bootstrap), so
its score is what it actually saved; the other alphas are replayed. The
bootstrap window is capped at ``max_window`` requests, because its cost grows
with the cache size (a larger cache evicts later).

Re-tuning, which Marconi does not do: workloads drift, so every
``retune_every`` requests the tuner compares the live alpha with its
neighbours ``alpha +- step`` and with ``alpha = 0`` (pure recency) on the most
recent window. The utility's recency term, ``1 / (now - t + 1)``, is already
tiny for blocks a few requests old, so any alpha above ~0.1 lets the value
term decide almost alone: the landscape is nearly a step at 0, and a local
search that cannot see 0 would stay on the wrong side of it. The candidates
are replayed from a snapshot of the live cache taken when the window began,
so they start from the same warm state as the live run.

The tuner only decides; replaying and snapshotting are injected, so the
simulator and the engine plugin share it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_admission.core.errors import UserError

__all__ = ["GRIDS", "AlphaTuner", "TuningEvent", "paper_grid"]


def paper_grid(step: float = 0.1, top: float = 2.0) -> tuple[float, ...]:
    """Marconi's grid ``{0, 0.1, ..., 2.0}`` (21 replays)."""
    n = round(top / step)
    return tuple(round(i * step, 10) for i in range(n + 1))


#: Bootstrap grids by name. "coarse" (the default) spends its 6 replays near 0,
#: where the utility changes (see the module docstring); "paper" is Marconi's.
#: The grid the tuner tries unless the user chooses another.
DEFAULT_GRID = "coarse"
#: The bootstrap window, in multiples of the requests served before the first eviction
#: (Marconi section 4.2 uses 5).
DEFAULT_MULTIPLIER = 5

GRIDS: dict[str, tuple[float, ...]] = {
    "coarse": (0.0, 0.1, 0.2, 0.5, 1.0, 2.0),
    "paper": paper_grid(),
}


@dataclass(frozen=True)
class TuningEvent:
    """One tuning decision, made after request number ``at`` (1-based count)."""

    at: int
    window: int
    alpha: float
    scores: dict[float, float]
    kind: str  # "bootstrap" or "retune"


@dataclass
class AlphaTuner:
    """Decides when to tune ``alpha`` and to what.

    Args:
        replay: ``f(alpha, requests, snapshot) -> FLOPs saved``: replay
            ``requests`` with eviction weight ``alpha``, starting from
            ``snapshot`` (``None``: an empty cache).
        snapshot: ``g() -> snapshot`` of the live cache; ``None`` disables
            re-tuning.
        multiplier: bootstrap window = ``multiplier`` x requests served before
            the first eviction (Marconi: 5).
        grid: alphas tried at bootstrap (default ``GRIDS["coarse"]``;
            Marconi's is ``GRIDS["paper"]``).
        retune_every: requests between re-tunes; ``None`` = four bootstrap
            windows; 0 disables re-tuning.
        max_window: longest bootstrap window (requests).
        step: distance to the neighbours tried when re-tuning.
        max_alpha: re-tuning never goes above this.

    Use: after each served request call :meth:`observe`; it returns the new
    alpha when it changed its mind, else ``None``.
    """

    # The requests and snapshots are opaque here: the injected replay reads them.
    replay: Callable[[float, Sequence[Any], Any], float]
    snapshot: Callable[[], Any] | None = None
    multiplier: int = DEFAULT_MULTIPLIER
    grid: tuple[float, ...] = GRIDS[DEFAULT_GRID]
    retune_every: int | None = None
    step: float = 0.1
    max_alpha: float = 2.0
    max_window: int = 1000
    alpha: float = 0.0
    events: list[TuningEvent] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.multiplier < 1:
            raise UserError(f"multiplier must be >= 1, got {self.multiplier}")
        if not self.grid or min(self.grid) < 0:
            raise ValueError(f"grid must be non-empty and >= 0, got {self.grid}")
        self._seen = 0
        self._window_len: int | None = None
        self._history: list[Any] = []
        self._history_saved = 0.0
        self._since_tune = 0
        self._window: list[Any] | None = None
        self._window_snapshot: Any = None
        self._window_saved = 0.0

    @property
    def window_len(self) -> int | None:
        """Bootstrap window length, once the first eviction has fixed it."""
        return self._window_len

    def observe(self, request: Any, evicted_so_far: bool, saved: float) -> float | None:
        """Record one served request and the FLOPs its hit saved; tune when due.

        Returns:
            The new alpha if this call changed it, else ``None``.
        """
        self._seen += 1
        if not self.events:
            self._history.append(request)
            self._history_saved += saved
            if evicted_so_far and self._window_len is None:
                self._window_len = max(self._seen, min(self.multiplier * self._seen, self.max_window))
            if self._window_len is not None and self._seen >= self._window_len:
                scores = {a: (self._history_saved if a == self.alpha
                              else self.replay(a, self._history, None)) for a in self.grid}
                self._history = []
                return self._decide(scores, "bootstrap", self._window_len)
            return None
        if self.snapshot is None:
            return None
        assert self._window_len is not None  # fixed before the first (bootstrap) event
        every = 4 * self._window_len if self.retune_every is None else self.retune_every
        if every < 2:
            return None
        window_len = min(self._window_len, every - 1)
        self._since_tune += 1
        if self._window is not None:
            self._window.append(request)
            self._window_saved += saved
        if self._since_tune == every - window_len:
            # The next request opens the comparison window: remember the state.
            self._window_snapshot = self.snapshot()
            self._window, self._window_saved = [], 0.0
        elif self._since_tune >= every and self._window is not None:
            scores = {self.alpha: self._window_saved}
            for a in (0.0, self.alpha - self.step, self.alpha + self.step):
                a = round(a, 10)
                if 0.0 <= a <= self.max_alpha and a not in scores:
                    scores[a] = self.replay(a, self._window, self._window_snapshot)
            n = len(self._window)
            self._window, self._window_snapshot = None, None
            return self._decide(scores, "retune", n)
        return None

    def _decide(self, scores: dict[float, float], kind: str, window: int) -> float | None:
        best = max(scores.values())
        # Ties keep the current alpha, then prefer the smaller one.
        alpha = min((a for a, v in scores.items() if v == best),
                    key=lambda a: (a != self.alpha, a))
        self.events.append(TuningEvent(self._seen, window, alpha, scores, kind))
        self._since_tune = 0
        changed = alpha != self.alpha
        self.alpha = alpha
        return alpha if changed else None
