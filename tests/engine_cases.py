"""The engine tests' cases and the block size vLLM's CPU platform gives each.

The SSM state dtypes and ``(arch, dtype)`` cases the engine tests run, pinned through vLLM's
own ``mamba_ssm_cache_dtype`` (``tests/conftest.py`` turns them into fixtures), and the
block size the core derives for them, which the tests check against the live engine.
"""

from __future__ import annotations

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


#: vLLM variables a child engine keeps from the test runner's environment: how its worker
#: binds OpenMP threads. ``make test`` sets ``nobind`` so that two xdist workers' engine
#: processes do not both pin their threads to core 0 (vLLM's ``auto`` binding,
#: ``vllm/utils/ompmultiprocessing.py``) and the ``OMP_NUM_THREADS`` it sets holds.
RUNNER_VLLM_VARS = ("VLLM_CPU_OMP_THREADS_BIND",)


def env_without_vllm(**extra: str) -> dict[str, str]:
    """``os.environ`` without vLLM's and the plugin's variables (``VLLM_*``) but for
    :data:`RUNNER_VLLM_VARS`, with ``extra`` set: a child process's clean start."""
    import os

    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VLLM_") or k in RUNNER_VLLM_VARS}
    env.update(extra)
    return env


#: One case per tiny model, so both architectures and both block sizes (128 and 256 tokens):
#: the engine tests of a start-up path that does not depend on the state dtype (an eviction
#: policy's queue, ``auto``'s worker, a refused setting) run these instead of every case.
ENGINE_CASES_EACH_MODEL = (("qwen3-next", "bfloat16"), ("nemotron-h", "float32"))


def engine_case_id(case: tuple[str, str]) -> str:
    """The test id of an engine case: ``"qwen3-next-bfloat16"``."""
    return "-".join(case)
