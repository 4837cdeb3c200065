"""Online tuning of the FLOP-aware eviction weight ``alpha``.

Marconi (section 4.2) starts with ``alpha = 0``. When the first eviction
happens it notes how many requests came before; once ``multiplier`` times that
many requests have been seen (the bootstrap window), it replays the window for
every ``alpha`` in a grid and keeps the one that saved the most prefill FLOPs.

Marconi tunes once. Workloads drift, so this tuner also re-tunes every
``retune_every`` requests on the most recent window, searching a small grid
around the current alpha (a local search: ``alpha +- step``, ``+- 2 step``),
which costs a few window replays instead of the full grid.

Replays start from an empty cache with the same geometry, as Marconi's
bootstrap replay does; the tuner is told how to replay through an injected
function, so the simulator and the engine plugin share it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["AlphaTuner", "TuningEvent", "paper_grid"]


def paper_grid(step: float = 0.1, top: float = 2.0) -> tuple[float, ...]:
    """Marconi's grid ``{0, 0.1, ..., 2.0}``."""
    n = round(top / step)
    return tuple(round(i * step, 10) for i in range(n + 1))


@dataclass(frozen=True)
class TuningEvent:
    """One tuning decision: at request ``at``, over ``window`` requests."""

    at: int
    window: int
    alpha: float
    scores: dict[float, float]
    kind: str  # "bootstrap" or "retune"


@dataclass
class AlphaTuner:
    """Decides when to tune ``alpha`` and to what.

    Args:
        replay: ``f(alpha, requests) -> FLOPs saved`` replaying ``requests``
            from an empty cache with eviction weight ``alpha``.
        multiplier: bootstrap window = ``multiplier`` x requests seen before
            the first eviction (Marconi: 5).
        grid: alphas tried at bootstrap (Marconi: 0, 0.1, ..., 2.0).
        retune_every: re-tune after this many requests since the last tuning;
            ``None`` = one bootstrap window length; 0 disables re-tuning.
        local_step: step of the local grid used when re-tuning.

    Use: call :meth:`observe` once per served request with whether an eviction
    has happened so far; it returns the new alpha when it tuned, else None.
    """

    replay: Callable[[float, Sequence], float]
    multiplier: int = 5
    grid: tuple[float, ...] = field(default_factory=paper_grid)
    retune_every: int | None = None
    local_step: float = 0.1
    alpha: float = 0.0
    events: list[TuningEvent] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.multiplier < 1:
            raise ValueError(f"multiplier must be >= 1, got {self.multiplier}")
        if not self.grid or min(self.grid) < 0:
            raise ValueError(f"grid must be non-empty and >= 0, got {self.grid}")
        self._seen = 0
        self._window_len: int | None = None
        self._last_tune = 0
        self._history: list = []      # requests since the start, until bootstrap
        self._recent: deque = deque()  # the last window, after bootstrap

    @property
    def window_len(self) -> int | None:
        """Bootstrap window length, once known."""
        return self._window_len

    def observe(self, request, evicted_so_far: bool) -> float | None:
        """Record one served request; tune when due. Returns the new alpha or None."""
        self._seen += 1
        if not self.events:  # still in the bootstrap window
            self._history.append(request)
            if evicted_so_far and self._window_len is None:
                self._window_len = max(1, self.multiplier * self._seen)
            if self._window_len is not None and self._seen >= self._window_len:
                return self._tune(self._history, self.grid, "bootstrap")
            return None
        self._recent.append(request)
        if len(self._recent) > self._window_len:
            self._recent.popleft()
        every = self._window_len if self.retune_every is None else self.retune_every
        if every and self._seen - self._last_tune >= every:
            s = self.local_step
            local = sorted({max(0.0, round(self.alpha + d * s, 10)) for d in (-2, -1, 0, 1, 2)})
            return self._tune(list(self._recent), tuple(local), "retune")
        return None

    def _tune(self, window: Sequence, grid: tuple[float, ...], kind: str) -> float:
        scores = {a: self.replay(a, window) for a in grid}
        best = max(scores.values())
        # Ties go to the alpha closest to the current one, then the smallest.
        alpha = min((a for a, v in scores.items() if v == best),
                    key=lambda a: (abs(a - self.alpha), a))
        self.events.append(TuningEvent(self._seen, len(window), alpha, scores, kind))
        self.alpha = alpha
        self._last_tune = self._seen
        if kind == "bootstrap":
            self._recent = deque(window[-self._window_len:])
            self._history = []
        return alpha
