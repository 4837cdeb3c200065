"""Policies from other packages, loaded when a front end asks.

Importing :mod:`vllm_admission` registers the built-in policies only. The front ends (the
CLI, the plugin's settings, the test suite) call :func:`load_policy_plugins` once before
they list or check names, so that a policy another installed package declares in the
entry-point group ``vllm_admission.admission_policies`` or
``vllm_admission.eviction_policies`` (or a router in
``vllm_admission.routing_policies``) runs everywhere a built-in does (the model of pytest's
and pluggy's ``load_setuptools_entrypoints``). A lookup of an unknown name loads them too
(:meth:`PolicyRegistry.policy_class <vllm_admission.core.registry.PolicyRegistry.policy_class>`).
"""

from __future__ import annotations

from vllm_admission.core.admission import ADMISSION_POLICIES
from vllm_admission.core.eviction.registry import EVICTION_POLICIES
from vllm_admission.core.routing import ROUTERS

__all__ = ["load_policy_plugins"]


def load_policy_plugins() -> list[str]:
    """Register the admission, eviction and routing policies other installed packages
    declare (each registry once per process). An entry that fails is left out with one
    warning.

    Returns:
        The names registered by this call, admission policies first, routing policies last.
    """
    return (ADMISSION_POLICIES.load_entry_points() + EVICTION_POLICIES.load_entry_points()
            + ROUTERS.load_entry_points())
