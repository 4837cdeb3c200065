"""The eviction registry: name -> policy class, and what is derived from it.

A new policy is one :class:`~vllm_admission.core.eviction.base.EvictionPolicy`
subclass and one :func:`register_eviction` call at the end of this module (or
of the module that defines it, imported here). Everything else finds it here:
the simulator's CLI, the plugin's ``VLLM_ADMISSION_EVICTION`` (if it needs no
future), the tests that run every policy; ``auto`` chooses among it only if the
class declares ``auto_candidate``.
"""

from __future__ import annotations

import inspect

from vllm_admission.core.admission import UnknownPolicyError
from vllm_admission.core.eviction.base import EvictionPolicy
from vllm_admission.core.eviction.belady import BeladyEviction
from vllm_admission.core.eviction.conversation import ConversationEviction
from vllm_admission.core.eviction.flop import FlopEviction
from vllm_admission.core.eviction.frequency import LFUEviction
from vllm_admission.core.eviction.lru import LRUEviction
from vllm_admission.core.eviction.mix import ExpertMixEviction
from vllm_admission.core.eviction.reuse import ReuseEviction
from vllm_admission.core.eviction.s3fifo import S3FifoEviction

__all__ = [
    "ENGINE_EVICTION_POLICIES",
    "EVICTION_POLICIES",
    "eviction_class",
    "get_eviction",
    "register_eviction",
    "stock_eviction",
]

#: Registry: name -> policy class, in the order shown to users.
EVICTION_POLICIES: dict[str, type[EvictionPolicy]] = {}

#: Policies a live engine can run: every registered one that needs no future
#: knowledge (the plugin serves ``needs_values``, ``needs_hits``,
#: ``needs_keys`` and ``needs_requests``). Rebuilt by :func:`register_eviction`.
ENGINE_EVICTION_POLICIES: tuple[str, ...] = ()


def register_eviction(cls: type[EvictionPolicy]) -> type[EvictionPolicy]:
    """Add ``cls`` under ``cls.name`` (after the policies registered so far) and
    rebuild :data:`ENGINE_EVICTION_POLICIES`. Call it in this module (or in a
    module imported before this one's names are copied elsewhere), so that
    every ``from ... import ENGINE_EVICTION_POLICIES`` sees the policy.

    Returns:
        ``cls`` (usable as a class decorator).

    Raises:
        TypeError: not a concrete :class:`EvictionPolicy` subclass with a
            ``name`` and a ``summary``.
        ValueError: the name is taken, or an ``auto_candidate`` that needs the
            future (``auto`` runs in the engine too).
    """
    global ENGINE_EVICTION_POLICIES
    if not (isinstance(cls, type) and issubclass(cls, EvictionPolicy)) or inspect.isabstract(cls):
        raise TypeError(f"{cls!r} is not a concrete EvictionPolicy subclass")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name or not isinstance(getattr(cls, "summary", None), str):
        raise TypeError(f"{cls.__name__} must set the class attributes name and summary")
    if name in EVICTION_POLICIES:
        raise ValueError(f"eviction policy {name!r} is already registered")
    if cls.auto_candidate and cls.needs_future:
        raise ValueError(f"{name!r} needs the future: it cannot be an auto candidate")
    EVICTION_POLICIES[name] = cls
    ENGINE_EVICTION_POLICIES = tuple(n for n, c in EVICTION_POLICIES.items()
                                     if not c.needs_future)
    return cls


def eviction_class(name: str) -> type[EvictionPolicy]:
    """The policy class registered under ``name`` (to read its attributes).

    Raises:
        UnknownPolicyError: unknown name; the message lists the valid names.
    """
    try:
        return EVICTION_POLICIES[name]
    except KeyError:
        valid = ", ".join(EVICTION_POLICIES)
        raise UnknownPolicyError(f"unknown eviction policy {name!r}; valid: {valid}") from None


def get_eviction(name: str, **options) -> EvictionPolicy:
    """Build the eviction policy registered under ``name``.

    Args:
        name: a key of :data:`EVICTION_POLICIES`.
        options: constructor options (``alpha`` for ``flop``).

    Raises:
        UnknownPolicyError: unknown name; the message lists the valid names.
        TypeError: an option the policy does not take.
    """
    return eviction_class(name)(**options)


def stock_eviction() -> str:
    """The name of the one registered policy in vLLM's own order (``vllm_order``:
    ``lru``): stock vLLM's eviction.

    Raises:
        LookupError: not exactly one registered policy declares ``vllm_order``.
    """
    names = [n for n, c in EVICTION_POLICIES.items() if c.vllm_order]
    if len(names) != 1:
        raise LookupError(f"expected one eviction policy in vLLM's order, found {names}")
    return names[0]


for _cls in (LRUEviction, FlopEviction, LFUEviction, ReuseEviction, ConversationEviction,
             S3FifoEviction, ExpertMixEviction, BeladyEviction):
    register_eviction(_cls)
del _cls
