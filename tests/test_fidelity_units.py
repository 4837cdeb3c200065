"""Fidelity under the settings that change what a lookup can match: vLLM's
``prefix_match_unit``, MTP speculative decoding and the hidden-state cache. Each case runs
pairs of the plugin against the simulator configured from the live engine, on the small
synthetic workload in a pool that evicts (``fidelity_cases``)."""

from __future__ import annotations

import pytest
from fidelity_cases import MTP_PAIRS, assert_mirrored, mtp_fidelity, small_synthetic


@pytest.mark.engine
@pytest.mark.parametrize("arch, ssm_dtype, pairs", [
    ("qwen3-next", "bfloat16", (("vllm", "lru"), ("marconi", "lru"), ("dense", "flop"),
                                ("dense", "s3fifo"))),
    ("nemotron-h", "float32", (("vllm", "lru"), ("last", "lru"), ("block", "lru"),
                               ("last", "reuse"))),
])
def test_a_sub_block_hash_unit_is_mirrored_exactly(arch, ssm_dtype, pairs, tiny_model_of,
                                                   engine_env):
    """vLLM's ``prefix_match_unit`` of 32 tokens, given to the engine and read back by the
    simulator: every request's cached tokens (hits inside blocks among them), prefill
    steps and the evictions agree, for stock vLLM and the plugin's admissions, and for
    evictions that hear block keys (the keys at the prompt's unit end and the keys a copied block
    takes over reach them as in the simulator: ``s3fifo``'s ghosts, ``reuse``). 40 blocks
    and a 512-token prefill budget make the pool evict and the chunks end below the
    prompt end; the SSM dtype is pinned so the block size is the same on every CPU."""
    from engine_cases import predicted_block_size

    from vllm_admission.fidelity import FidelitySpec, run_fidelity

    model = tiny_model_of(arch)
    B = predicted_block_size(model, ssm_dtype)
    synthetic = small_synthetic()
    spec = FidelitySpec(model=str(model), trace="synthetic", num_gpu_blocks=(40,), pairs=pairs,
                        max_output_len=8, synthetic=synthetic, mamba_ssm_cache_dtype=ssm_dtype,
                        engine_args={"prefix_match_unit": 32, "max_num_batched_tokens": 512})
    records = run_fidelity(spec)["records"]
    assert_mirrored(records, pairs)
    assert {rec["block_size"] for rec in records} == {B}
    assert any(h % B for rec in records for h in rec["per_request"]["engine"])  # inside a block


#: vLLM's hidden-state cache on the tiny models: layer 1's hidden states, cached per token.
HIDDEN_STATES = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                 "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [1]}}}


@pytest.mark.engine
@pytest.mark.parametrize("arch, ssm_dtype, pairs", [
    ("qwen3-next", "bfloat16", (("vllm", "lru"), ("marconi", "lru"), ("dense", "s3fifo"),
                                ("last", "reuse"), ("auto", "auto"))),
    ("nemotron-h", "float32", (("vllm", "lru"), ("marconi", "flop"), ("block", "lru"),
                               ("dense", "conversation"))),
])
def test_the_hidden_state_cache_is_mirrored_exactly(arch, ssm_dtype, pairs, tiny_model_of,
                                                    engine_env):
    """vLLM's ``extract_hidden_states``: a third KV cache group of per-token hidden states
    (the core's kind ``"hidden"``), one draft token a step without EAGLE's rules. Every
    request's cached tokens, prefill steps and the evictions agree, in a 40-block pool
    that evicts from all three groups, for stock, every admission, key- and FLOP-valued
    evictions and ``auto``."""
    from vllm_admission.fidelity import FidelitySpec, run_fidelity

    synthetic = small_synthetic()
    spec = FidelitySpec(model=str(tiny_model_of(arch)), trace="synthetic", num_gpu_blocks=(40,),
                        pairs=pairs, max_output_len=8, synthetic=synthetic,
                        mamba_ssm_cache_dtype=ssm_dtype,
                        engine_args={"max_num_batched_tokens": 512,
                                     "speculative_config": HIDDEN_STATES})
    assert_mirrored(run_fidelity(spec)["records"], pairs)


@pytest.mark.engine
def test_mtp_is_mirrored_exactly(tmp_path_factory, engine_env):
    """MTP with one draft token on the tiny Qwen3-Next with an MTP layer, given to the
    engine as vLLM's ``speculative_config`` and read back by the simulator (EAGLE's
    dropped block, the prompt checkpoints a block lower, the speculative state blocks,
    the draft tokens each decode step verifies, the lookahead slots, the MTP layer's KV):
    every request's cached tokens, prefill steps and the evictions agree for stock,
    ``marconi`` and ``dense``, and with ``s3fifo`` (whose order depends on when a decode
    step allocates), in a 40-block pool that evicts."""
    assert_mirrored(mtp_fidelity(tmp_path_factory, "tiny_mtp_fidelity"), MTP_PAIRS)


@pytest.mark.engine
def test_mtp_with_a_sub_block_hash_unit_is_mirrored_exactly(tmp_path_factory, engine_env):
    """MTP and ``prefix_match_unit`` 32 together (the lookup drops one hash block, the state
    at the prompt's unit end a unit lower, the attention sub-block key a unit above it, a
    block-aligned unit end a state of its own): every request's cached tokens, prefill steps and the evictions
    agree for stock, ``marconi`` (whose tentative sequence end may be that unit end),
    ``dense`` and ``last`` + ``s3fifo``, in a 40-block pool that evicts."""
    records = mtp_fidelity(tmp_path_factory, "tiny_mtp_unit", prefix_match_unit=32)
    assert_mirrored(records, MTP_PAIRS, min_requests=18)  # one request may not fit at its peak
    assert any(h % 32 == 0 and h % 128 for rec in records for h in rec["per_request"]["engine"]
               if h)  # hits inside a block
