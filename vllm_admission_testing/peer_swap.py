"""A pytest plugin that runs vLLM's own scheduler tests on the AdmissionScheduler.

Loaded with ``-p vllm_admission_testing.peer_swap`` by ``scripts/vllm_peer_tests.py``
(see there). It rebinds ``Scheduler`` and ``AsyncScheduler`` in vLLM's test helper
modules ``tests.v1.core.utils`` and ``tests.v1.kv_connector.unit.utils`` (whose
``create_scheduler`` builds the scheduler under test by those names) to the plugin's
classes (``AsyncAdmissionScheduler`` for
``AsyncScheduler``, ``AdmissionScheduler`` for ``Scheduler``), and checks after each
test that every scheduler it built was the plugin's.

With ``VLLM_ADMISSION_PEER_LAYOUT=hybrid`` it also gives every scheduler a second KV
cache group, a ``MambaSpec`` state group in vLLM's ``align`` mode
(``vllm/v1/kv_cache_interface.py``), and turns prefix caching on, so that the plugin
is active rather than inert. ``VLLM_ADMISSION_PEER_CLASSES=vllm`` keeps vLLM's own
classes (the same layout without the plugin: the reference for what the layout alone
changes).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import pytest

BUILT: list[Any] = []


def _hybrid_groups(groups: list[Any]) -> list[Any]:
    import torch
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec, MambaSpec

    attention = groups[0].kv_cache_spec
    state = MambaSpec(block_size=attention.block_size, shapes=((4, 8),),
                      dtypes=(torch.float32,), page_size_padded=attention.page_size_bytes,
                      mamba_cache_mode="align")
    return [*groups, KVCacheGroupSpec(["peer_state_layer"], state)]


def _helper_modules() -> list[Any]:
    """vLLM's test helper modules that build schedulers: ``tests.v1.core.utils`` and,
    where the tree has it, ``tests.v1.kv_connector.unit.utils`` (the connector tests')."""
    import importlib

    modules = [importlib.import_module("tests.v1.core.utils")]
    with contextlib.suppress(ModuleNotFoundError):
        modules.append(importlib.import_module("tests.v1.kv_connector.unit.utils"))
    return modules


def pytest_configure(config: Any) -> None:
    for utils in _helper_modules():
        _swap(utils)


def _swap(utils: Any) -> None:
    from vllm_admission.plugin.scheduler import AdmissionScheduler, AsyncAdmissionScheduler

    hybrid = os.environ.get("VLLM_ADMISSION_PEER_LAYOUT", "stock") == "hybrid"
    real_config, real_cache = utils.KVCacheConfig, utils.CacheConfig

    def kv_cache_config(*args: Any, **kwargs: Any) -> Any:
        if hybrid and "kv_cache_groups" in kwargs:
            kwargs["kv_cache_groups"] = _hybrid_groups(list(kwargs["kv_cache_groups"]))
        return real_config(*args, **kwargs)

    def cache_config(*args: Any, **kwargs: Any) -> Any:
        if hybrid:
            kwargs["enable_prefix_caching"] = True
            kwargs["mamba_cache_mode"] = "align"
        return real_cache(*args, **kwargs)

    def builder(cls: type) -> Any:
        def build(*args: Any, **kwargs: Any) -> Any:
            scheduler = cls(*args, **kwargs)
            BUILT.append((scheduler, cls is AsyncAdmissionScheduler))
            return scheduler
        return build

    # vLLM's CPU platform turns ``async_scheduling`` off in every config it builds
    # (``vllm/platforms/cpu.py``), so the tests pick the class by name, and so does this.
    if os.environ.get("VLLM_ADMISSION_PEER_CLASSES", "plugin") == "plugin":
        utils.AsyncScheduler = builder(AsyncAdmissionScheduler)
        utils.Scheduler = builder(AdmissionScheduler)
    utils.KVCacheConfig = kv_cache_config
    utils.CacheConfig = cache_config


@pytest.fixture(autouse=True)
def _built_by_the_plugin():
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from vllm_admission.plugin.scheduler import AdmissionScheduler

    BUILT.clear()
    yield
    if os.environ.get("VLLM_ADMISSION_PEER_CLASSES", "plugin") != "plugin":
        return
    for scheduler, is_async in BUILT:
        assert isinstance(scheduler, AdmissionScheduler), type(scheduler)
        assert isinstance(scheduler, AsyncScheduler) is is_async
