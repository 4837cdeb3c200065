"""Fixtures shared by test modules."""

from __future__ import annotations

import gc
import os

import pytest


@pytest.fixture
def engine_env(monkeypatch):
    """A test that starts vLLM engines: in-process engine core, general plugins reloaded,
    and ``os.environ`` restored afterwards (``build_llm`` writes into it)."""
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
