"""The ``kv_transfer_config`` of a host tier on this project's CPU-capable offloading spec.

Kept apart from :mod:`vllm_admission.plugin.repairs.cpu_offload` (which imports vLLM and
torch) so that the command line and the simulator's callers can build it cheaply.
"""

from __future__ import annotations

from typing import Any

__all__ = ["HOST_POLICY_MODULE", "HOST_SPEC_MODULE", "HOST_SPEC_NAME", "VLLM_HOST_POLICIES",
           "host_policy_name", "host_tier", "offloading_connector_config"]

#: The out-of-tree offloading spec vLLM loads (``v1/kv_offload/factory.py``).
HOST_SPEC_NAME = "HostCopyOffloadingSpec"
HOST_SPEC_MODULE = "vllm_admission.plugin.repairs.cpu_offload"
#: The module vLLM loads the project's host policies from (``cache_policy_module_path``).
HOST_POLICY_MODULE = "vllm_admission.plugin.boundary.host_policy"
#: Host policies vLLM 0.32 registers itself (``v1/kv_offload/cpu/policies/factory.py``).
VLLM_HOST_POLICIES = ("lru", "arc")


def offloading_connector_config(host_bytes: int, *, eviction_policy: str | None = None,
                                extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """vLLM's ``kv_transfer_config`` for its ``OffloadingConnector`` with a host tier of
    ``host_bytes`` bytes, run by
    :class:`~vllm_admission.plugin.repairs.cpu_offload.HostCopyOffloadingSpec` (vLLM's
    own worker on CUDA and XPU, host copies elsewhere).

    Args:
        host_bytes: host-tier capacity in bytes (vLLM's ``cpu_bytes_to_use``; the tier
            holds ``host_bytes // bytes per block`` chunks, each block rounded up to a
            host page).
        eviction_policy: the host policy: vLLM's ``"lru"`` (its default) or ``"arc"``, or
            a registered eviction policy of this project, which vLLM then loads from
            :data:`HOST_POLICY_MODULE` (``cache_policy_module_path``).
        extra: further ``kv_connector_extra_config`` keys, kept as given.

    Raises:
        ValueError: ``host_bytes`` is not a positive integer.
    """
    if isinstance(host_bytes, bool) or not isinstance(host_bytes, int) or host_bytes <= 0:
        raise ValueError(f"the host tier needs a positive number of bytes, got {host_bytes!r}")
    config: dict[str, Any] = {"cpu_bytes_to_use": host_bytes, "spec_name": HOST_SPEC_NAME,
                              "spec_module_path": HOST_SPEC_MODULE}
    if eviction_policy is not None:
        config["eviction_policy"] = eviction_policy
        if eviction_policy not in VLLM_HOST_POLICIES:
            config["cache_policy_module_path"] = HOST_POLICY_MODULE
    config.update(extra or {})
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": config}


def host_tier(scheduler: Any) -> tuple[int, str | None]:
    """``(chunks, eviction policy name)`` of the host tier of a vLLM scheduler's
    ``OffloadingConnector`` (its ``OffloadingConnectorScheduler.manager``, a
    ``CPUOffloadingManager``, and the connector's ``eviction_policy``); ``(0, None)``
    without one (no connector, another connector, or a manager of another kind). A policy
    loaded from a module other than :data:`HOST_POLICY_MODULE` is named
    ``"module:name"``, which no host-tier model accepts."""
    connector = getattr(scheduler, "connector", None)
    side = getattr(connector, "connector_scheduler", None)
    manager = getattr(side, "manager", None)
    chunks = getattr(manager, "_num_chunks", None)
    if not isinstance(chunks, int):
        return 0, None
    transfer = scheduler.vllm_config.kv_transfer_config
    extra = (transfer.kv_connector_extra_config or {}) if transfer is not None else {}
    return chunks, host_policy_name(extra)


def host_policy_name(extra: dict[str, Any]) -> str:
    """The host policy an ``OffloadingConnector``'s ``kv_connector_extra_config`` asks
    for, as the host-tier model names it: ``eviction_policy`` (default ``"lru"``), or
    ``"module:name"`` for a policy vLLM would load from a ``cache_policy_module_path``
    other than :data:`HOST_POLICY_MODULE` (vLLM's own names are resolved before the
    module is asked)."""
    name = str(extra.get("eviction_policy", "lru"))
    module = extra.get("cache_policy_module_path")
    if module and module != HOST_POLICY_MODULE and name not in VLLM_HOST_POLICIES:
        return f"{module}:{name}"
    return name
