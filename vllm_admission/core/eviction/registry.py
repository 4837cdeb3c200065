"""The eviction registry: name -> policy class, and what is derived from it.

A new policy is one :class:`~vllm_admission.core.eviction.base.EvictionPolicy`
subclass and one :func:`register_eviction` call at the end of this module (or
of the module that defines it, imported here). Everything else finds it here:
the simulator's CLI, the plugin's ``VLLM_ADMISSION_EVICTION`` (if it needs no
future), the tests that run every policy; ``auto`` chooses among it only if the
class declares ``auto_candidate``.
"""

from __future__ import annotations

from typing import Any

from vllm_admission.core.eviction.base import EvictionPolicy
from vllm_admission.core.eviction.belady import BeladyEviction
from vllm_admission.core.eviction.conversation import ConversationEviction
from vllm_admission.core.eviction.flop import FlopEviction
from vllm_admission.core.eviction.frequency import LFUEviction
from vllm_admission.core.eviction.learned import LearnedEviction
from vllm_admission.core.eviction.lru import LRUEviction
from vllm_admission.core.eviction.mix import ExpertMixEviction
from vllm_admission.core.eviction.reuse import ReuseEviction
from vllm_admission.core.eviction.s3fifo import S3FifoEviction
from vllm_admission.core.registry import PolicyRegistry

__all__ = [
    "ENTRY_POINT_GROUP",
    "EVICTION_POLICIES",
    "engine_eviction_policies",
    "eviction_class",
    "get_eviction",
    "load_entry_points",
    "register_eviction",
    "stock_eviction",
]

def _check_eviction(cls: type[EvictionPolicy]) -> None:
    """What :data:`EVICTION_POLICIES` asks of an eviction class beyond a name and a summary."""
    if cls.auto_candidate and cls.needs_future:
        raise ValueError(f"{cls.name!r} needs the future: it cannot be an auto candidate")


#: The entry-point group through which another package adds eviction policies
#: (``[project.entry-points."vllm_admission.eviction_policies"]``: ``name =
#: "package.module:PolicyClass"``).
ENTRY_POINT_GROUP = "vllm_admission.eviction_policies"

#: Registry: name -> eviction policy class, in the order shown to users
#: (:class:`~vllm_admission.core.registry.PolicyRegistry`; other packages' policies join it
#: when a front end loads the entry points).
EVICTION_POLICIES: PolicyRegistry[EvictionPolicy] = PolicyRegistry(
    "eviction", EvictionPolicy, ENTRY_POINT_GROUP, check=_check_eviction)


def engine_eviction_policies() -> tuple[str, ...]:
    """The policies a live engine can run: every one registered now that needs no future
    knowledge (the plugin serves ``needs_values``, ``needs_hits``, ``needs_keys`` and
    ``needs_requests``). Asked at call time, so a policy registered later (an entry
    point, :func:`load_entry_points`) is in it. ``ENGINE_EVICTION_POLICIES`` is the same,
    read as an attribute."""
    return tuple(n for n, c in EVICTION_POLICIES.items() if not c.needs_future)


def __getattr__(name: str) -> tuple[str, ...]:
    if name == "ENGINE_EVICTION_POLICIES":
        return engine_eviction_policies()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register_eviction(cls: type[EvictionPolicy]) -> type[EvictionPolicy]:
    """Add ``cls`` under ``cls.name``, after the policies registered so far; every
    consumer asks the registry when it needs it, so a policy registered from
    another package (:func:`load_entry_points`) runs everywhere a built-in does.
    Registering the same class again under its name is a no-op.

    Returns:
        ``cls`` (usable as a class decorator).

    Raises:
        TypeError: not a concrete :class:`EvictionPolicy` subclass with a
            ``name`` and a ``summary``.
        ValueError: the name is taken, or an ``auto_candidate`` that needs the
            future (``auto`` runs in the engine too).
    """
    return EVICTION_POLICIES.register(cls)


def eviction_class(name: str) -> type[EvictionPolicy]:
    """The policy class registered under ``name`` (to read its attributes).

    Raises:
        UnknownPolicyError: unknown name; the message lists the valid names.
    """
    return EVICTION_POLICIES.policy_class(name)


def get_eviction(name: str, **options: Any) -> EvictionPolicy:
    """Build the eviction policy registered under ``name``.

    Args:
        name: a key of :data:`EVICTION_POLICIES`.
        **options: constructor options (``alpha`` for ``flop``).

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
    return EVICTION_POLICIES.only("vllm_order", "in vLLM's order")


EVICTION_POLICIES.register_all(LRUEviction, FlopEviction, LFUEviction, ReuseEviction, ConversationEviction,
                               S3FifoEviction, ExpertMixEviction, LearnedEviction, BeladyEviction)


def load_entry_points() -> list[str]:
    """Register the eviction policies other installed packages declare in
    :data:`ENTRY_POINT_GROUP` (once per process; a front end asks,
    :func:`vllm_admission.core.policies.load_policy_plugins`). One that fails to load or
    register is left out with one warning naming it and why.

    Returns:
        The names registered now.
    """
    return EVICTION_POLICIES.load_entry_points()
