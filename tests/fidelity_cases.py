"""The fidelity cases' shared parts: the small synthetic workload, the exactness check, and
the host-tier and MTP runs (``tests/test_fidelity*.py``)."""

from __future__ import annotations

import json
from typing import Any

from vllm_admission.core.costs import ModelCosts
from vllm_admission.core.geometry import CPU_BLOCK_SIZE, CPU_KERNEL_BLOCK_SIZE, aligned_block_size

#: A short synthetic workload (chats and few-shot prompts over shared prefixes).
SMALL = ["num_requests=24", "agent_fraction=0", "chat_fraction=0.6", "fewshot_fraction=0.4",
         "system_prompt_len=[600,0.5,200,1500]", "template_len=[900,0.5,300,2000]",
         "user_message_len=[100,1.0,8,600]", "max_prompt_len=4000"]


def small_synthetic() -> dict[str, Any]:
    """:data:`SMALL` as ``FidelitySpec.synthetic`` takes it (values parsed as JSON)."""
    return {k: json.loads(v) for k, v in (s.split("=", 1) for s in SMALL)}


def assert_mirrored(records: list, pairs: tuple, min_requests: int = 20) -> None:
    """Each pair's record: at least ``min_requests`` requests, and every request's cached
    tokens, every prefill step count and the evictions (some) equal on both sides."""
    assert len(records) == len(pairs)
    for rec in records:
        pr = rec["per_request"]
        assert rec["requests"] == len(pr["engine"]) >= min_requests
        assert pr["engine"] == pr["simulator"], (rec["admission"], rec["first_difference"])
        assert pr["engine_prefill_steps"] == pr["simulator_prefill_steps"], rec["admission"]
        assert rec["engine"]["evictions"] == rec["simulator"]["evictions"] > 0


#: The pairs the MTP fidelity cases check: stock, two admissions, and an eviction that
#: hears block keys and whose order depends on when a decode step allocates.
MTP_PAIRS = (("vllm", "lru"), ("marconi", "lru"), ("dense", "lru"), ("last", "s3fifo"))


def host_fidelity(tiny_model_of, pairs: tuple, chunks: int, **spec) -> list:
    """``run_fidelity``'s records for ``pairs`` with a host tier of ``chunks`` chunks
    (``fidelity --offload``; the project's CPU worker) on the tiny Qwen3-Next: the SMALL
    synthetic trace, 40 GPU blocks, a 512-token budget, bf16 state (the same block size on
    every CPU); ``spec``: further ``FidelitySpec`` fields."""
    from vllm_admission.core.geometry import geometry_from_blocks
    from vllm_admission.fidelity import FidelitySpec, run_fidelity

    model = tiny_model_of("qwen3-next")
    costs = ModelCosts.from_config(model / "config.json", mamba_ssm_cache_dtype="bfloat16")
    B = aligned_block_size(costs, CPU_BLOCK_SIZE, kernel_block_size=CPU_KERNEL_BLOCK_SIZE)  # noqa: N806
    bytes_per_block = geometry_from_blocks(costs, 40, B).bytes_per_block
    synthetic = small_synthetic()
    return run_fidelity(FidelitySpec(
        model=str(model), trace="synthetic", num_gpu_blocks=(40,), pairs=pairs,
        max_output_len=8, synthetic=synthetic, mamba_ssm_cache_dtype="bfloat16",
        offload=chunks * bytes_per_block, engine_args={"max_num_batched_tokens": 512},
        **spec))["records"]


def mtp_fidelity(tmp_path_factory, name: str, **engine_args) -> list:
    """``run_fidelity``'s records for :data:`MTP_PAIRS` on the tiny Qwen3-Next with an MTP
    layer, one draft token, ``engine_args`` besides: the SMALL synthetic trace, 40 blocks,
    a 512-token budget, bf16 state (so the block size is the same on every CPU)."""
    from vllm_admission.engine.tiny_model import make_tiny_model
    from vllm_admission.fidelity import FidelitySpec, run_fidelity

    model = make_tiny_model(tmp_path_factory.mktemp(name), arch="qwen3-next", mtp=True)
    synthetic = small_synthetic()
    spec = FidelitySpec(model=str(model), trace="synthetic", num_gpu_blocks=(40,),
                        pairs=MTP_PAIRS, max_output_len=8, synthetic=synthetic,
                        mamba_ssm_cache_dtype="bfloat16",
                        engine_args={"max_num_batched_tokens": 512, "speculative_config":
                                     {"method": "mtp", "num_speculative_tokens": 1},
                                     **engine_args})
    return run_fidelity(spec)["records"]
