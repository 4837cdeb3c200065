"""Fixtures shared by test modules."""

from __future__ import annotations

import gc
import os
from collections import Counter

import pytest
from engine_cases import ENGINE_CASES, ENGINE_SSM_DTYPES, engine_case_id
from shared_data import SHARED, require

# Helper modules with asserts of their own, imported by test modules before pytest would
# rewrite them as plugins.
pytest.register_assert_rewrite("scheduler_harness", "model_output")

# The test suite is a front end: policies other installed packages declare are registered
# before any test module lists the registries (vllm_admission.core.policies).
from vllm_admission.core.policies import load_policy_plugins  # noqa: E402

load_policy_plugins()

#: Set by ``.ci/run``: a test skipped because ``../shared`` (traces, model configs, vLLM's
#: tests) is missing fails instead, naming what is missing; outside CI it skips.
REQUIRE_SHARED_ENV = "CI_REQUIRE_SHARED"


def pytest_collection_modifyitems(config, items):
    """Run the modules with the most engine and slow tests first, the rest after, each
    module's tests in file order. ``make test`` hands whole modules to its xdist workers
    in this order (``--dist loadfile --no-loadscope-reorder``): the long modules start at
    once and the short ones fill the end, instead of one long module running alone last."""
    def module(item) -> str:
        return item.nodeid.split("::", 1)[0]

    heavy = Counter(module(item) for item in items
                    if item.get_closest_marker("engine") or item.get_closest_marker("slow"))
    items.sort(key=lambda item: (-heavy[module(item)], module(item)))


def pytest_runtest_setup(item):
    """Before the first engine test of a process: keep vLLM's garbage-collector freeze
    across the engines that process starts (:func:`_freeze_heap_after_engine_shutdowns`)."""
    if item.get_closest_marker("engine") is not None:
        _freeze_heap_after_engine_shutdowns()


_ENGINE_SHUTDOWN_FREEZES = False


def _freeze_heap_after_engine_shutdowns() -> None:
    """Make every in-process engine's shutdown end with ``gc.freeze()``.

    vLLM's ``EngineCore`` freezes the process heap for the garbage collector when it starts
    (``freeze_gc_heap``: full collections, then ``gc.freeze()``) and unfreezes it when it
    shuts down (``EngineCore.shutdown`` and ``cleanup_dist_env_and_memory``, which collect
    again), ``vllm/v1/engine/core.py``. In a test process that starts dozens of engines, each
    start and shutdown then walks the whole heap (torch's and vLLM's import-time objects,
    about 725,000) several times: about 1.7 s of CPU per engine on these machines, more than
    a small test's requests. Freezing again after each shutdown, as vLLM itself does after
    start-up, keeps those collections to what the next engine allocates. The engine just shut
    down stays frozen until the next shutdown unfreezes and collects it, so a process holds
    at most two engines' objects (and their finalizers run after the next engine's
    distributed state is torn down, not under its feet)."""
    global _ENGINE_SHUTDOWN_FREEZES
    if _ENGINE_SHUTDOWN_FREEZES:
        return
    _ENGINE_SHUTDOWN_FREEZES = True
    try:
        from vllm.v1.engine.core import EngineCore
    except ImportError:
        return
    shutdown = EngineCore.shutdown

    def shutdown_then_freeze(self):
        shutdown(self)
        gc.freeze()

    EngineCore.shutdown = shutdown_then_freeze
    gc.collect()
    gc.freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and os.environ.get(REQUIRE_SHARED_ENV) == "1"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if "shared" in reason:
        report.outcome = "failed"
        report.longrepr = (f"{REQUIRE_SHARED_ENV}=1 and this test needs the shared/ checkout "
                           f"beside the repository: {reason}")


@pytest.fixture
def engine_env(monkeypatch):
    """A test that starts vLLM engines: in-process engine core, general plugins reloaded,
    and ``os.environ`` restored afterwards.

    The plugin's settings no longer travel through ``os.environ`` in one process
    (``build_llm`` hands the in-process scheduler an ``Settings``). What still
    writes there is vLLM's side of an engine start: ``build_llm`` sets vLLM's own
    variables (``VLLM_CPU_KVCACHE_SPACE``, ``VLLM_PLUGINS``, ...), the general plugin names
    ``VLLM_ADMISSION_METRICS_DIR`` for engine-core processes to inherit, and vLLM's CPU
    platform sets its own (``VLLM_WORKER_MULTIPROC_METHOD``, ``LD_PRELOAD``, ...,
    ``vllm/platforms/cpu.py``). Those are restored here."""
    pytest.importorskip("vllm")
    import vllm.plugins

    saved = dict(os.environ)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    # Another test module may have loaded vLLM's general plugins with VLLM_PLUGINS="".
    vllm.plugins.plugins_loaded = False
    yield
    os.environ.clear()
    os.environ.update(saved)
    gc.collect()


@pytest.fixture(scope="module", params=ENGINE_SSM_DTYPES)
def ssm_dtype(request) -> str:
    """One pinned SSM state dtype per module instance (the engine tests run once per value)."""
    return request.param


@pytest.fixture(scope="session")
def tiny_model_of(tmp_path_factory):
    """``arch -> directory`` of the tiny model of that arch (weights and tokenizer), each
    written once per test session on first use."""
    pytest.importorskip("transformers")
    from model_output import route_to_every_expert

    from vllm_admission.engine.tiny_model import make_tiny_model

    built: dict[str, object] = {}

    def get(arch: str):
        if arch not in built:
            # Every expert on every token: tests compare outputs across prefill cuts
            # (tests/model_output.py).
            built[arch] = route_to_every_expert(
                make_tiny_model(tmp_path_factory.mktemp(f"tiny_{arch}"), arch=arch))
        return built[arch]

    return get


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model_of):
    """The tiny Qwen3-Next model (weights and tokenizer), written once per test session."""
    return tiny_model_of("qwen3-next")


@pytest.fixture(scope="module", params=ENGINE_CASES, ids=engine_case_id)
def engine_case(request) -> tuple[str, str]:
    """One ``(arch, ssm_dtype)`` of :data:`ENGINE_CASES` per module instance."""
    return request.param


@pytest.fixture(scope="module")
def engine_model_dir(engine_case, tiny_model_of):
    """The tiny model of this module instance's arch."""
    return tiny_model_of(engine_case[0])


@pytest.fixture(scope="session")
def shared_dir():
    """The shared data beside the checkout (``../shared``: traces, model configs, vLLM's
    tests); skips, or under ``.ci/run`` fails, when it is missing."""
    return require(SHARED)
