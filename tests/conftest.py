"""Fixtures shared by test modules."""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence

import pytest

#: Set by ``.ci/run``: a test skipped because ``../shared`` (traces, model configs, vLLM's
#: tests) is missing fails instead, naming what is missing; outside CI it skips.
REQUIRE_SHARED_ENV = "CI_REQUIRE_SHARED"


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


def chained_hashes(tokens: Sequence, block_size: int) -> list[int]:
    """Chained block hashes of the full blocks of ``tokens`` (token ids or any hashable
    content labels), as the core model's keys: block ``i``'s hash covers blocks ``0..i``."""
    out, h = [], 0
    for i in range(len(tokens) // block_size):
        h = hash((h, tuple(tokens[i * block_size:(i + 1) * block_size])))
        out.append(h)
    return out


@pytest.fixture
def engine_env(monkeypatch):
    """A test that starts vLLM engines: in-process engine core, general plugins reloaded,
    and ``os.environ`` restored afterwards.

    The plugin's settings no longer travel through ``os.environ`` in one process
    (``build_llm`` hands the in-process scheduler an ``AdmissionConfig``). What still
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


# ---------------------------------------------------------------- engine geometry
#: The SSM state dtypes the engine tests pin through vLLM's own ``mamba_ssm_cache_dtype``.
#: vLLM's CPU platform keeps the tiny model's GDN state in bf16 on CPUs without AVX-512 BF16
#: and resets it to float32 on CPUs with it (``vllm/platforms/cpu.py``
#: ``check_and_update_config``); the float32 state page is larger, so vLLM raises the block
#: size (``vllm/platforms/interface.py`` ``_align_hybrid_block_size``). Pinning each in turn
#: runs both geometries on any CPU; ``test_tiny_model_engine.py`` also covers the platform
#: default ("auto") of whatever CPU runs it.
ENGINE_SSM_DTYPES = ("bfloat16", "float32")

#: The (tiny model arch, pinned SSM state dtype) cases the engine tests of both families run:
#: the Qwen3-Next (Gated DeltaNet) model in both geometries, and the Nemotron-H (Mamba2)
#: model in its own default, a float32 state (its config's ``mamba_ssm_cache_dtype``, which
#: vLLM applies on every CPU: ``model_executor/models/config.py``
#: ``NemotronHForCausalLMConfig``). Its bf16 geometry is the GDN model's bf16 one (the same
#: state page); ``test_tiny_model_engine.py`` starts it too.
ENGINE_CASES = (("qwen3-next", "bfloat16"), ("qwen3-next", "float32"), ("nemotron-h", "float32"))


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


@pytest.fixture(scope="module", params=ENGINE_CASES, ids=lambda case: "-".join(case))
def engine_case(request) -> tuple[str, str]:
    """One ``(arch, ssm_dtype)`` of :data:`ENGINE_CASES` per module instance."""
    return request.param


@pytest.fixture(scope="module")
def engine_model_dir(engine_case, tiny_model_of):
    """The tiny model of this module instance's arch."""
    return tiny_model_of(engine_case[0])


def predicted_block_size(model_dir, ssm_dtype: str) -> int:
    """The block size vLLM's CPU platform gives ``model_dir`` with ``ssm_dtype`` state.

    The core's derivation (``core/geometry.py`` ``aligned_block_size``, vLLM's
    ``_align_hybrid_block_size``) from the CPU default of 128 tokens; the engine tests assert
    the live engine agrees before deriving any expected number from it.
    """
    from vllm_admission.core.costs import ModelCosts
    from vllm_admission.core.geometry import CPU_BLOCK_SIZE, CPU_KERNEL_BLOCK_SIZE, aligned_block_size

    costs = ModelCosts.from_config(f"{model_dir}/config.json", mamba_ssm_cache_dtype=ssm_dtype)
    return aligned_block_size(costs, CPU_BLOCK_SIZE, kernel_block_size=CPU_KERNEL_BLOCK_SIZE)


def engine_block_size(llm) -> int:
    """Tokens per KV block of a started ``vllm.LLM``."""
    return int(llm.llm_engine.vllm_config.cache_config.block_size)


def greedy_one_at_a_time(model, scheduler: str | None, env: dict, *, engine_args: dict,
                         prompts: Sequence[Sequence[int]], max_tokens: int,
                         ssm_dtype: str = "float32", check=None) -> list:
    """Start an in-process engine on ``model`` (stock vLLM when ``scheduler`` is None:
    no general plugin), serve ``prompts`` one at a time with greedy decoding, shut it
    down. ``check(llm)`` runs on the started engine first. Returns a
    ``model_output.Output`` per prompt (cached tokens, tokens, top logits, prefill passes),
    to compare with ``model_output.assert_same_output``."""
    from model_output import LOGITS_MODE, generate

    from vllm_admission.engine.llm import EngineSettings, build_llm, shutdown_llm

    settings = EngineSettings(model=str(model), scheduler_cls=scheduler, max_model_len=4096,
                              mamba_ssm_cache_dtype=ssm_dtype,
                              engine_args={**LOGITS_MODE, **engine_args},
                              env={"VLLM_PLUGINS": "" if scheduler is None else None, **env})
    llm = build_llm(settings)
    try:
        if check is not None:
            check(llm)
        return generate(llm, prompts, max_tokens)
    finally:
        shutdown_llm(llm)
        del llm
        gc.collect()
