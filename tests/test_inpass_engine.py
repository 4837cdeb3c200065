"""``VLLM_ADMISSION_CHECKPOINT=inpass`` against ``split`` on the real CPU engine, both families.

Per model (the tiny Qwen3-Next with bf16 state, Gated DeltaNet layers run in segments; the
tiny Nemotron-H with its float32 state, Mamba2 layers through vLLM's own checkpoint export;
B from the live engine), two engine starts (``split``, then ``inpass``), each running
every admission policy on the junction case's first three prompts (tests/junction_case.py:
a fresh prompt, the junction, a hit) by switching the policy
on the live scheduler. Per policy the two modes must give the same model output (greedy
tokens and logits within rounding: tests/model_output.py) and the same cached tokens per
request (the budget, 4,096, is a multiple of B, so ``last`` keeps the same
states too), one prefill step per prompt in ``inpass`` against rule 6's counts in ``split``,
and no block leaked. With ``dense`` the recurrent states cached after prompt 1 (one per block
boundary: every one of them written by the in-pass copy in ``inpass`` mode, at a chunk end in
``split``) are read from the engine's state tensors and compared within rounding. The
``inpass`` engine then survives an abort mid-prefill and a batch of eight requests without
leaking a block.
"""

from __future__ import annotations

import gc
import os
import random

import pytest
from engine_cases import engine_block_size, predicted_block_size
from junction_case import (
    expected_junction,
    expected_junction_inpass_prefill_steps,
    expected_junction_prefill_steps,
    junction_prompts,
)
from model_output import LOGITS_MODE, assert_same_output, generate, logit_roundoff, state_rows

from vllm_admission.core.admission import ADMISSION_POLICIES, stock_admission

pytestmark = pytest.mark.engine

#: Every registered admission policy, stock vLLM's first (switched on one live engine).
POLICIES = sorted(ADMISSION_POLICIES, key=lambda name: name != stock_admission())
POOL_TOKENS = 160 * 128


def toks(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(3, 512) for _ in range(n)]


#: The first three junction prompts: a fresh prompt, the junction (vllm, marconi) and a hit;
#: prompts 4..10 repeat prompt 3 (kept short: the CPU engine is slow on a shared machine).
PROMPTS = junction_prompts(toks)[:3]


#: ``(arch, pinned SSM state dtype)`` per module instance: one Gated DeltaNet, one Mamba2 model.
INPASS_CASES = (("qwen3-next", "bfloat16"), ("nemotron-h", "float32"))


def run_mode(model_dir, mode, ssm_dtype):
    """Start an engine in ``mode``, run the junction case for every policy; return the results."""
    import vllm.plugins

    from vllm_admission.engine.llm import EngineSettings, build_llm, inprocess_scheduler

    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_ADMISSION_LOG_INTERVAL": "0",
           "VLLM_ADMISSION_POLICY": "vllm", "VLLM_ADMISSION_EVICTION": "lru",
           "VLLM_ADMISSION_CHECKPOINT": mode, "VLLM_PLUGINS": None}
    B = predicted_block_size(model_dir, ssm_dtype)  # noqa: N806
    settings = EngineSettings(model=str(model_dir), env=env, max_model_len=4096,
                              mamba_ssm_cache_dtype=ssm_dtype, num_gpu_blocks=POOL_TOKENS // B,
                              scheduler_cls="vllm_admission.AdmissionScheduler",
                              engine_args=dict(LOGITS_MODE))
    vllm.plugins.plugins_loaded = False
    llm = build_llm(settings)
    try:
        assert engine_block_size(llm) == B
        sched = inprocess_scheduler(llm)
        pool = sched.kv_cache_manager.block_pool
        out = {"B": B, "u": logit_roundoff(llm), "policies": {}}
        for policy in POLICIES:
            assert llm.reset_prefix_cache()
            sched.set_admission_policy(policy)
            first = generate(llm, PROMPTS[:1], 4)
            if policy == "dense":
                out["dense_states"] = state_rows(llm)
            results = first + generate(llm, PROMPTS[1:], 4)
            assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1, (mode, policy)
            out["policies"][policy] = {"hits": [o.cached for o in results],
                                       "outputs": results,
                                       "steps": [o.passes for o in results]}
        if mode == "inpass":
            out["faults"] = faults(llm, sched)
        return out
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def faults(llm, sched):
    """Abort a request mid-prefill, then run eight requests at once: no block may leak."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    pool = sched.kv_cache_manager.block_pool
    sched.set_admission_policy("dense")
    assert llm.reset_prefix_cache()
    engine = llm.llm_engine
    engine.add_request("victim", TokensPrompt(prompt_token_ids=toks(77, 2600)),
                       SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, detokenize=False))
    # inpass would prefill 2,600 tokens in one step of 4,096: a smaller budget for this step
    budget, sched.max_num_scheduled_tokens = sched.max_num_scheduled_tokens, 1024
    try:
        engine.step()
    finally:
        sched.max_num_scheduled_tokens = budget
    (victim,) = sched.requests.values()
    computed = victim.num_computed_tokens
    engine.abort_request(["victim"])
    while engine.has_unfinished_requests():
        engine.step()
    leaked_after_abort = pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()
    sp = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, detokenize=False)
    batch = llm.generate([TokensPrompt(prompt_token_ids=toks(9, 300) + toks(50 + i, 400))
                          for i in range(8)], sp, use_tqdm=False)
    leaked_after_batch = pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()
    return {"victim_computed": computed, "leaked_after_abort": leaked_after_abort,
            "leaked_after_batch": leaked_after_batch,
            "batch_lengths": [len(o.outputs[0].token_ids) for o in batch]}


@pytest.fixture(scope="module", params=INPASS_CASES, ids=lambda case: "-".join(case))
def modes(request, tiny_model_of):
    pytest.importorskip("vllm")
    arch, ssm_dtype = request.param
    saved = dict(os.environ)
    try:
        yield {mode: run_mode(tiny_model_of(arch), mode, ssm_dtype) for mode in ("split", "inpass")}
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.mark.parametrize("policy", POLICIES)
def test_inpass_equals_split_on_the_junction_case(modes, policy):
    split, inpass = modes["split"]["policies"][policy], modes["inpass"]["policies"][policy]
    B = modes["split"]["B"]  # noqa: N806
    # One pass against rule 6's chunks: the same model output (tests/model_output.py).
    assert_same_output(split["outputs"], inpass["outputs"], label=policy)
    n = len(PROMPTS)
    assert split["hits"] == inpass["hits"] == expected_junction(B)[policy][:n]
    assert split["steps"] == expected_junction_prefill_steps(B)[policy][:n]
    assert inpass["steps"] == expected_junction_inpass_prefill_steps(B)[policy][:n]
    assert sum(inpass["steps"]) < sum(split["steps"])


def test_inpass_states_equal_split_states(modes):
    """Every state ``dense`` caches after prompt 1, captured inside one pass, equals the one
    written at a chunk end in ``split`` to within rounding.

    Not the same computation: ``split`` reaches position ``p`` in ``p / B`` passes, each
    resuming from the last, ``inpass`` in one, and vLLM's CPU kernels may sum in another
    order for other pass lengths (tests/model_output.py; on one AVX2-only EPYC a conv row of
    the tiny Nemotron-H's second Mamba2 layer moved by more than 1 % of an element near zero,
    its input having passed through the first layer's scan in the other cut). Every state is
    fed by activations in the model's dtype, so the bound is norm-wise, one rounding of the
    row's largest element per pass of either mode: ``(p / B + 1) * u * max |row|``. A state of
    another position, or a conv window shifted by a token, is off by about the row's size."""
    split, inpass = modes["split"]["dense_states"], modes["inpass"]["dense_states"]
    B, u = modes["split"]["B"], modes["split"]["u"]  # noqa: N806
    positions = sorted({pos for _, pos in split})
    assert positions == [B * i for i in range(1, 1800 // B + 1)]
    assert split.keys() == inpass.keys()
    for key, (conv, ssm) in split.items():
        passes = key[1] // B + 1
        for name, want, got in (("conv", conv, inpass[key][0]), ("ssm", ssm, inpass[key][1])):
            bound = passes * u * float(want.abs().max())
            assert float((want - got).abs().max()) <= bound, (key, name, bound)
            # The bound tells states apart: the next position's state lies outside it.
            following = inpass.get((key[0], key[1] + B))
            if following is not None:
                other = following[0 if name == "conv" else 1]
                assert float((want - other).abs().max()) > bound, (key, name, "next")
        assert ssm.abs().sum() > 0, key


def test_inpass_survives_abort_and_a_batch(modes):
    f = modes["inpass"]["faults"]
    assert 0 < f["victim_computed"] < 2600
    assert f["leaked_after_abort"] == 0
    assert f["leaked_after_batch"] == 0
    assert f["batch_lengths"] == [16] * 8
