"""The base class of every eviction policy: the hooks the cache calls, and the
few facts a policy declares.

In vLLM 0.32 every KV cache group allocates from one ``BlockPool``. A block whose
request finished keeps its block hash and waits in ``free_block_queue``; the
queue's order is the eviction order (``vllm/v1/core/block_pool.py``:
``free_blocks`` appends cached blocks at the tail, ``get_new_blocks`` pops the
head and drops its hash). Blocks without a hash are put at the head and reused
first; they are not the eviction policy's business. An :class:`EvictionPolicy`
orders the *cached* free blocks only.

Blocks are identified by integer ids; time is injected (``now``: the index of
the latest request, in the simulator and in the engine alike).

**Hooks.** The cache model (``core/cache/``, ``core/free_blocks.py``) and
the plugin (``plugin/free_queue.py``, ``plugin/control.py``) call the same
methods on every policy, as cachetools' ``Cache`` calls ``popitem``:

* the order (abstract: every policy implements them): :meth:`~EvictionPolicy.add`
  when a cached block's reference count drops to zero, :meth:`~EvictionPolicy.remove`
  when a prefix hit takes it back, :meth:`~EvictionPolicy.pop` when an allocation
  needs a block, ``__len__``, ``__contains__`` and :meth:`~EvictionPolicy.clone`;
  :meth:`~EvictionPolicy.add_many` and :meth:`~EvictionPolicy.pop_n` have loops
  over those as defaults, which a policy may replace by a faster equivalent;
* what the cache hears (no-ops here): :meth:`~EvictionPolicy.on_hit` (a prefix
  hit referenced a cached block: vLLM's ``BlockPool.touch``),
  :meth:`~EvictionPolicy.forget` (a block lost its hash without being popped),
  :meth:`~EvictionPolicy.on_cache` (a block got its hash key),
  :meth:`~EvictionPolicy.on_request` (a request arrived, with its prompt's block hashes);
* :meth:`~EvictionPolicy.bind_future` (no-op): the oracle of next uses;
* the tuning hook :attr:`~EvictionPolicy.alpha` (none here): a weight that an
  online tuner (:class:`~vllm_admission.core.tuning.AlphaTuner`) sets;
* :meth:`~EvictionPolicy.with_history` (none here): build the policy on a
  shared :class:`~vllm_admission.core.eviction.history.ReuseHistory`, for a
  policy that keeps history by block hash itself.

**Derived attributes.** Calling a no-op hook for every block costs time on the
cache's hot path, so whether a class overrides a hook is found once, when the
class is created (:meth:`EvictionPolicy.__init_subclass__`), and kept as a class
attribute that the callers read. They are never declared by hand (declaring one
raises ``TypeError``):

=================  ===============================================  ===========================
attribute          true when the class overrides                     the cache then
=================  ===============================================  ===========================
``needs_hits``     :meth:`~EvictionPolicy.on_hit` or ``forget``      reports hits and lost hashes
``needs_keys``     :meth:`~EvictionPolicy.on_cache`                  reports each block's hash key
``tunable``        :attr:`~EvictionPolicy.alpha`                     tunes alpha online unless fixed
``keeps_history``  :meth:`~EvictionPolicy.with_history`              ``auto`` shares its history
``needs_requests`` :meth:`~EvictionPolicy.on_request`                tells it each request's prompt
=================  ===============================================  ===========================

**Declarations.** What is a fact about the policy rather than a hook is
declared as a class attribute, here and nowhere else:

* ``needs_values``: reads the FLOP-efficiency ``value`` passed to ``add``,
  which the cache must compute (a cost it pays only for such a policy);
* ``needs_future``: reads ``next_use`` (an oracle of the future): simulator only;
* ``vllm_order``: orders exactly as vLLM's ``FreeKVCacheBlockQueue``, so the
  engine keeps vLLM's own queue and calls no policy code;
* ``auto_candidate``: ``auto`` chooses among the registered policies that
  declare it (off unless the class says so: a new policy does not join
  ``auto``, and its shadow caches, by being registered).

A new policy is one subclass plus one registry entry
(:mod:`vllm_admission.core.eviction.registry`); nothing outside the registries
branches on a policy's name.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from vllm_admission.core.registry import PolicyClass, overrides

if TYPE_CHECKING:
    from vllm_admission.core.eviction.history import ReuseHistory

__all__ = ["DERIVED", "OWN_DECLARATIONS", "EvictionPolicy"]

#: Declarations a class states for itself: a subclass that does not repeat them has
#: them off (:class:`~vllm_admission.core.registry.PolicyClass`).
OWN_DECLARATIONS = ("vllm_order", "auto_candidate")

#: Derived attribute -> the hooks whose override makes it true.
DERIVED: dict[str, tuple[str, ...]] = {
    "needs_hits": ("on_hit", "forget"),
    "needs_keys": ("on_cache",),
    "tunable": ("alpha",),
    "keeps_history": ("with_history",),
    "needs_requests": ("on_request",),
}


class EvictionPolicy(PolicyClass, ABC):
    """Orders free cached blocks; :meth:`pop` returns the next victim.

    Subclasses set :attr:`name` and :attr:`summary`, implement the abstract
    methods and override the hooks they need (module docstring). ``value``
    (FLOP efficiency, FLOPs saved per byte held) and ``next_use`` (logical time
    of the next request that needs the block's hash) are supplied by the cache
    model only to a policy that declares :attr:`needs_values` /
    :attr:`needs_future` (0.0 and infinity otherwise).
    """

    OWN_DECLARATIONS = OWN_DECLARATIONS

    # -- declarations (facts about the policy) --------------------------------
    #: Whether the cache model must compute FLOP-efficiency values for ``add``.
    needs_values: ClassVar[bool] = False
    #: Whether the policy needs future knowledge (simulator only).
    needs_future: ClassVar[bool] = False
    #: Whether the order is exactly vLLM's free-block queue order (the engine
    #: then keeps vLLM's own queue and calls no policy code).
    vllm_order: ClassVar[bool] = False

    # -- derived from the hooks a class overrides (see DERIVED) ---------------
    #: Overrides :meth:`on_hit` or :meth:`forget`: the cache reports hits.
    needs_hits: ClassVar[bool] = False
    #: Overrides :meth:`on_cache`: the cache reports each block's hash key.
    needs_keys: ClassVar[bool] = False
    #: Overrides the tuning hook :attr:`alpha`.
    tunable: ClassVar[bool] = False
    #: Overrides :meth:`with_history`: keeps history by block hash itself.
    keeps_history: ClassVar[bool] = False
    #: Overrides :meth:`on_request`: the cache tells it each request's prompt.
    needs_requests: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Derive :data:`DERIVED` attributes from the hooks ``cls`` overrides.

        A class may answer one of them per instance with a ``property`` (a
        wrapper such as ``HistoryKeeper`` answers for the policy it wraps).

        The identity declarations (:data:`OWN_DECLARATIONS`: ``vllm_order``,
        ``auto_candidate``) are not inherited: a class states them in its own body
        or has neither, so that a subclass registered under a new name neither
        claims to be vLLM's order nor joins ``auto`` unasked.

        Raises:
            TypeError: the class body declares a derived attribute as a value.
        """
        super().__init_subclass__(**kwargs)  # the own declarations (PolicyClass)
        for attr, hooks in DERIVED.items():
            own = cls.__dict__.get(attr)
            if isinstance(own, property):
                continue
            if attr in cls.__dict__:
                raise TypeError(
                    f"{cls.__name__}.{attr} is derived from the hooks the class overrides "
                    f"({', '.join(hooks)}); override those instead of declaring it")
            setattr(cls, attr, any(overrides(cls, EvictionPolicy, h) for h in hooks))

    # -- the order -------------------------------------------------------------
    @abstractmethod
    def add(self, block_id: int, now: float, value: float = 0.0,
            next_use: float = math.inf) -> None:
        """Make ``block_id`` an eviction candidate (its ref count reached 0).

        Raises:
            KeyError: ``block_id`` is already a candidate.
        """

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

    @abstractmethod
    def clone(self) -> EvictionPolicy:
        """An independent copy with the same candidates in the same order."""

    def pop_n(self, n: int, now: float) -> list[int]:
        """Pop ``n`` victims in eviction order (IndexError past the end)."""
        return [self.pop(now) for _ in range(n)]

    def add_many(self, block_ids: Sequence[int], now: float, values: Sequence[float],
                 next_uses: Sequence[float]) -> None:
        """:meth:`add` for several blocks, in order (``values``/``next_uses`` aligned)."""
        for b, v, nu in zip(block_ids, values, next_uses, strict=True):
            self.add(b, now, v, nu)

    # -- what the cache hears (no-ops here) -------------------------------------
    def on_hit(self, block_id: int, now: float) -> None:
        """A prefix hit referenced cached block ``block_id`` (after :meth:`remove`
        if it was a candidate). Called only for a class that overrides it or
        :meth:`forget` (:attr:`needs_hits`)."""
        return None

    def forget(self, block_id: int) -> None:
        """``block_id`` lost its hash without being popped (the plugin drops a
        superseded state, or the prefix cache is reset); it is not a candidate.
        Called only for a class that :attr:`needs_hits`."""
        return None

    def on_cache(self, block_id: int, key: Hashable) -> None:
        """Block ``block_id`` (in use) was given a hash; ``key`` is hashable and
        equal for equal hashes in one KV cache group: ``(group, block_hash)``
        for a block of prompt tokens (the engine's ``block_hash`` is
        ``vllm_admission.plugin.translate.hash_key`` of vLLM's hash), a key never
        seen again for a block holding generated tokens. Called only for a
        class that overrides it (:attr:`needs_keys`), before the block is a
        candidate; not called for a state cached only as a ``marconi`` sequence
        end (see :class:`~vllm_admission.core.eviction.reuse.ReuseEviction`).
        A block cached without a report has no key."""
        return None

    def on_request(self, hashes: Sequence[int], now: float) -> None:
        """A request arrived: ``hashes`` are the chained block hashes of its
        prompt's full blocks, in order (the keys' second half in
        :meth:`on_cache`). Called once per request, before any of its blocks is
        cached or freed: by the simulator when it starts the request, by the
        plugin at the request's first prefix lookup. Called only for a class
        that overrides it (:attr:`needs_requests`)."""
        return None

    def bind_future(self, refresh: Callable[[int, float], float]) -> None:
        """Give a policy that :attr:`needs_future` its oracle: ``refresh(block_id,
        now)`` is the block's next use after ``now``. Others ignore it."""
        return None

    # -- the tuning hook ----------------------------------------------------------
    @property
    def alpha(self) -> float:
        """The weight an online tuner sets (>= 0). A policy with a tuned
        parameter overrides this property, getter and setter (:attr:`tunable`).

        Raises:
            AttributeError: the policy has no tuned parameter (reading or setting).
        """
        raise AttributeError(f"eviction policy {self.name!r} has no alpha to tune")

    @alpha.setter
    def alpha(self, value: float) -> None:
        raise AttributeError(f"eviction policy {self.name!r} has no alpha to tune")

    # -- a shared hash history ---------------------------------------------------
    @classmethod
    def with_history(cls, history: ReuseHistory, **options: Any) -> EvictionPolicy:
        """The policy built with ``options`` on ``history``, shared with other
        policies, which it keeps up to date itself. Overridden by a policy that
        keeps history by block hash (:attr:`keeps_history`); ``auto`` wraps
        every other one in a ``HistoryKeeper`` instead.

        Raises:
            TypeError: the policy keeps no hash history.
        """
        raise TypeError(f"eviction policy {cls.name!r} keeps no hash history")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(candidates={len(self)})"
