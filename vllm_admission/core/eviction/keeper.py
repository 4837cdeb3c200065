"""An eviction policy that orders like another and keeps a shared
:class:`~vllm_admission.core.eviction.history.ReuseHistory` up to date
(:class:`HistoryKeeper`)."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

from vllm_admission.core.eviction.base import EvictionPolicy
from vllm_admission.core.eviction.history import ReuseHistory

__all__ = ["HistoryKeeper"]


def _inner_attribute(attr: str) -> Any:
    """A property that answers the wrapped policy's ``attr``, with a setter that refuses, as
    a read-only property does, so that it may stand where the base has a class attribute."""

    def get(self: HistoryKeeper) -> Any:
        return getattr(self.inner, attr)

    def refuse(self: HistoryKeeper, value: object) -> None:
        raise AttributeError(f"HistoryKeeper.{attr} is the wrapped policy's; set it there")

    return property(get, refuse, doc=f"The wrapped policy's :attr:`~EvictionPolicy.{attr}`.")


class HistoryKeeper(EvictionPolicy):
    """Orders like ``inner`` and keeps a :class:`ReuseHistory` up to date.

    ``auto`` serves its live cache with one of these around every policy
    that keeps no hash history itself (all but ``reuse``), all sharing one
    history, so that a switch to ``reuse`` finds the use counts and ghosts of
    everything the cache cached, hit and evicted so far, not an empty history
    (``core/adaptive.py``). It hears hash keys and hits whatever ``inner``
    needs, and passes them on only where ``inner`` asks for them.

    It overrides the hit and key hooks (so it :attr:`~EvictionPolicy.needs_hits`
    and :attr:`~EvictionPolicy.needs_keys`); :attr:`name`, :attr:`summary`,
    :attr:`needs_values` and :attr:`tunable` are the wrapped policy's (read-only: set
    them on the wrapped policy).

    Args:
        inner: the policy that orders the candidates (not one that keeps a hash
            history itself, and not one that needs the future).
        history: the history to keep up to date.

    Raises:
        ValueError: ``inner`` keeps a hash history or needs the future.
    """

    def __init__(self, inner: EvictionPolicy, history: ReuseHistory) -> None:
        if inner.keeps_history or inner.needs_future:
            raise ValueError(f"{inner.name!r} cannot be wrapped: it keeps its own history "
                             f"or needs the future")
        self.inner = inner
        self.hist = history
        self._pass_keys = inner.needs_keys
        self._pass_hits = inner.needs_hits

    # The base class's class attributes, answered per instance (EvictionPolicy's
    # __init_subclass__ leaves a property alone): see _inner_attribute.
    name = _inner_attribute("name")
    summary = _inner_attribute("summary")
    needs_values = _inner_attribute("needs_values")
    tunable = _inner_attribute("tunable")

    def add(self, block_id: int, now: float, value: float = 0.0,
            next_use: float = math.inf) -> None:
        self.inner.add(block_id, now, value, next_use)

    def add_many(self, block_ids: Sequence[int], now: float, values: Sequence[float],
                 next_uses: Sequence[float]) -> None:
        self.inner.add_many(block_ids, now, values, next_uses)

    def remove(self, block_id: int) -> None:
        self.inner.remove(block_id)

    def pop(self, now: float) -> int:
        return self.pop_n(1, now)[0]

    def pop_n(self, n: int, now: float) -> list[int]:
        out = self.inner.pop_n(n, now)
        self.hist.age()   # statistics halve when victims are chosen, as in ReuseEviction
        self.hist.evicted(out)
        return out

    def on_cache(self, block_id: int, key: Hashable) -> None:
        self.hist.cached(block_id, key)
        if self._pass_keys:
            self.inner.on_cache(block_id, key)

    def on_hit(self, block_id: int, now: float) -> None:
        self.hist.hit(block_id)
        if self._pass_hits:
            self.inner.on_hit(block_id, now)

    def forget(self, block_id: int) -> None:
        self.hist.dropped(block_id)
        if self._pass_hits:
            self.inner.forget(block_id)

    def clone(self) -> HistoryKeeper:
        return HistoryKeeper(self.inner.clone(), self.hist.copy())

    def __len__(self) -> int:
        return len(self.inner)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self.inner

    @property
    def alpha(self) -> float:
        """The wrapped policy's ``alpha`` (a :attr:`tunable` one): a tuner or the
        plugin setting it here sets it there (AttributeError for another)."""
        return self.inner.alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        self.inner.alpha = value

    def __repr__(self) -> str:
        return f"HistoryKeeper({self.inner!r})"
