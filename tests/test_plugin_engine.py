"""The AdmissionScheduler in a real vLLM 0.32 CPU engine running the tiny Qwen3-Next model.

Engines (in-process engine core, so the scheduler is inspectable), one alive at a time:

* ``stock``: vLLM without this plugin (``VLLM_PLUGINS=""``, stock scheduler) in the same
  48-block pool as ``flop``: the reference outputs;
* ``lru``: the plugin with ``lru`` eviction, a 160-block pool; every admission policy is
  run on it by switching the policy on the live scheduler between cases;
* ``flop``: the plugin with ``flop`` eviction (alpha fixed at 0) in a 48-block pool, small
  enough for evictions and preemptions;
* one engine start with an invalid setting.

Block size 128 (the CPU default for this model, asserted). Derivations are next to the
expected numbers; the fast tests in ``test_plugin_scheduler.py`` check the same cases
without a model.
"""

from __future__ import annotations

import gc
import logging
import os
import random

import pytest
from junction_case import EXPECTED_JUNCTION, junction_prompts

pytestmark = pytest.mark.engine

B = 128
POLICIES = ["vllm", "last", "marconi", "dense", "none"]
FLOP_BLOCKS = 48


def toks(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(3, 512) for _ in range(n)]


# The junction case: tests/junction_case.py.
JUNCTION_PROMPTS = junction_prompts(toks)

# One request, P = 1000, O = 40: prompt end floor(999/128)*128 = 896; the sequence reaches
# token 1,039, whose last block boundary floor(1039/128)*128 = 1,024 is crossed in decode.
SEQ_PROMPT = toks(4, 1000)
SEQ_OUTPUT = 40
EXPECTED_STATES = {
    "none": [],
    "vllm": [896],
    "marconi": [1024],
    "last": [896, 1024],
    "dense": [128 * i for i in range(1, 8)] + [1024],
}

# Faults: eight 700-token prompts sharing 300 tokens, 80 output tokens each, all at once in
# a 48-block pool (a request needs up to 7 KV blocks + 2 states); vLLM preempts some of them
# while they decode and recomputes them (3 preemptions in vLLM's scheduler driven without
# a model, tests/test_plugin_scheduler.py's FakeEngine). Greedy tokens depend on the batch on this CPU backend
# (a request decoded alone and in this batch differ from token 11 on), and a request
# recomputed after a preemption takes other kernels, so the reference is stock vLLM
# running the same batch in the same pool.
FAULT_PROMPTS = [toks(9, 300) + toks(50 + i, 400) for i in range(8)]
FAULT_OUTPUT = 80


# ------------------------------------------------------------------ engines
class Engines:
    """At most one engine alive; switching kind closes the previous one."""

    def __init__(self, model_dir):
        self.model_dir = model_dir
        self.kind = None
        self.llm = None
        self.warnings: dict[str, list[str]] = {}

    def get(self, kind):
        if kind == self.kind:
            return self.llm
        self.close()
        import vllm.plugins

        from vllm_admission.engine.replay import EngineSettings, build_llm

        env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_ADMISSION_LOG_INTERVAL": "0",
               "VLLM_ADMISSION_POLICY": None, "VLLM_ADMISSION_EVICTION": None,
               "VLLM_ADMISSION_ALPHA": None}
        settings = EngineSettings(model=str(self.model_dir), env=env, max_model_len=4096)
        if kind == "stock":
            env["VLLM_PLUGINS"] = ""
            settings.num_gpu_blocks = FLOP_BLOCKS
        else:
            env["VLLM_PLUGINS"] = None
            settings.scheduler_cls = "vllm_admission.AdmissionScheduler"
            if kind == "lru":
                settings.num_gpu_blocks = 160
                env.update(VLLM_ADMISSION_EVICTION="lru")
            elif kind == "flop":
                settings.num_gpu_blocks = FLOP_BLOCKS
                env.update(VLLM_ADMISSION_EVICTION="flop", VLLM_ADMISSION_ALPHA="0")
            else:
                raise ValueError(kind)
        # Another test module may have loaded vLLM's general plugins with VLLM_PLUGINS=""
        # in this process; let the next engine load them again (register() is idempotent).
        vllm.plugins.plugins_loaded = False
        records: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda r: records.append(r.getMessage())
        vllm_logger = logging.getLogger("vllm")
        vllm_logger.addHandler(handler)
        try:
            self.llm = build_llm(settings)
        finally:
            vllm_logger.removeHandler(handler)
        self.kind = kind
        # (vLLM itself leaves VLLM_DIST_IDENT behind after an in-process engine, which it
        # then warns about; only the plugin's variables matter here.)
        self.warnings[kind] = [m for m in records
                               if "environment variable" in m and "VLLM_ADMISSION" in m]
        return self.llm

    def close(self):
        if self.llm is not None:
            # Shut the engine core down now: it tears down process-wide distributed state,
            # and a late garbage collection would do that under the next engine's feet.
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None
            self.kind = None
            gc.collect()


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    pytest.importorskip("vllm")
    pytest.importorskip("transformers")
    from vllm_admission.engine.tiny_model import make_tiny_model

    saved = dict(os.environ)
    e = Engines(make_tiny_model(tmp_path_factory.mktemp("tiny_qwen3_next_plugin")))
    yield e
    e.close()
    os.environ.clear()
    os.environ.update(saved)


def generate(llm, prompts, max_tokens):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
    return [(int(o.num_cached_tokens), list(o.outputs[0].token_ids)) for o in outs]


def one_at_a_time(llm, prompts, max_tokens):
    return [generate(llm, [p], max_tokens)[0] for p in prompts]


def scheduler(llm):
    from vllm_admission.engine.replay import inprocess_scheduler

    return inprocess_scheduler(llm)


def assert_no_leak(llm):
    pool = scheduler(llm).kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1


def spy_preemptions(sched):
    """Record ``request_id -> output tokens`` at each request's first preemption."""
    seen: dict[str, int] = {}
    original = sched._preempt_request  # noqa: SLF001

    def spy(request, *args, **kwargs):
        seen.setdefault(request.request_id, len(request.output_token_ids))
        return original(request, *args, **kwargs)

    sched._preempt_request = spy  # noqa: SLF001
    return seen


@pytest.fixture(scope="module")
def reference(engines):
    """Stock vLLM's greedy outputs for the prompts below (one at a time, and the batch)."""
    llm = engines.get("stock")
    assert llm.llm_engine.vllm_config.cache_config.block_size == B
    sched = scheduler(llm)
    assert type(sched).__name__ == "Scheduler"
    preempted = spy_preemptions(sched)
    ref = {
        "junction": [out for _, out in one_at_a_time(llm, JUNCTION_PROMPTS, 4)],
        "seq": one_at_a_time(llm, [SEQ_PROMPT], SEQ_OUTPUT)[0][1],
    }
    assert not preempted
    ref["faults"] = [out for _, out in generate(llm, FAULT_PROMPTS, FAULT_OUTPUT)]
    ref["faults_preempted"] = len(preempted)
    assert preempted, "the pool was meant to be too small for eight requests at once"
    assert all(len(out) == 4 for out in ref["junction"])
    return ref


# ------------------------------------------------------------------ lru engine
def test_plugin_variables_cause_no_vllm_warning(engines, reference, monkeypatch):
    monkeypatch.setenv("VLLM_ADMISSION_TUNE_MULTIPLIER", "5")
    llm = engines.get("lru")
    assert type(scheduler(llm)).__name__ == "AdmissionScheduler"
    assert engines.warnings["lru"] == []


@pytest.mark.parametrize("policy", POLICIES)
def test_junction_case_outputs_and_metrics(engines, reference, policy):
    from vllm_admission.engine.replay import prefix_cache_counters
    from vllm_admission.plugin.scheduler import admission_stats

    llm = engines.get("lru")
    sched = scheduler(llm)
    assert llm.reset_prefix_cache()
    sched.set_admission_policy(policy)
    before = admission_stats(llm)
    hits0, queries0 = prefix_cache_counters(llm)
    results = one_at_a_time(llm, JUNCTION_PROMPTS, 4)
    hits = [h for h, _ in results]
    assert hits == EXPECTED_JUNCTION[policy]
    assert [out for _, out in results] == reference["junction"]
    # vLLM's own counters stay right: hits = the sum of num_cached_tokens.
    hits1, queries1 = prefix_cache_counters(llm)
    assert hits1 - hits0 == sum(hits)
    assert queries1 - queries0 == sum(len(p) for p in JUNCTION_PROMPTS)
    after = admission_stats(llm)
    assert after.admission == policy
    assert after.tokens_saved - before.tokens_saved == sum(hits)
    assert after.state_hits - before.state_hits == sum(h > 0 for h in hits)
    assert after.requests - before.requests == 10
    assert_no_leak(llm)


def test_junction_case_engine_equals_core_model():
    """The core's cache model with this engine's geometry gives the same per-request hits."""
    from vllm_admission.core.admission import get_admission
    from vllm_admission.core.cache import HybridPrefixCache
    from vllm_admission.core.eviction import get_eviction

    def chained(tokens):
        out, h = [], 0
        for i in range(len(tokens) // B):
            h = hash((h, tuple(tokens[i * B:(i + 1) * B])))
            out.append(h)
        return out

    for policy in POLICIES:
        cache = HybridPrefixCache(num_blocks=160, block_size=B, group_kinds=("state", "attention"),
                                  admission=get_admission(policy), eviction=get_eviction("lru"),
                                  chunk_size=4096)
        hits = [cache.serve(chained(p), len(p), 4, rid=r, now=float(r)).hit_tokens
                for r, p in enumerate(JUNCTION_PROMPTS)]
        assert hits == EXPECTED_JUNCTION[policy], policy


@pytest.mark.parametrize("policy", POLICIES)
def test_cached_states_follow_the_policy(engines, reference, policy):
    from vllm_admission.engine.replay import cached_block_positions

    llm = engines.get("lru")
    assert llm.reset_prefix_cache()
    scheduler(llm).set_admission_policy(policy)
    ((hit, out),) = one_at_a_time(llm, [SEQ_PROMPT], SEQ_OUTPUT)
    assert hit == 0 and out == reference["seq"]
    cached = cached_block_positions(llm)
    assert cached["0:mamba"] == EXPECTED_STATES[policy]
    # Attention KV for 1,039 computed tokens: 8 full blocks, whatever the policy.
    assert cached["1:full_attention"] == [B * i for i in range(1, 9)]
    # The same prompt again hits the last cached state at or below floor(999/128)*128 = 896.
    ((again, out2),) = one_at_a_time(llm, [SEQ_PROMPT], 4)
    assert again == max([s for s in EXPECTED_STATES[policy] if s <= 896], default=0)
    assert out2 == reference["seq"][:4]
    assert_no_leak(llm)


# ------------------------------------------------------------------ flop engine
def test_flop_engine_junction_case_matches_core_model(engines, reference):
    """With a 48-block pool the ten 1,801-token prompts (15 KV blocks + states each) evict;
    the core model with the same geometry and alpha = 0 predicts every hit."""
    from vllm_admission.core.admission import get_admission
    from vllm_admission.core.cache import HybridPrefixCache
    from vllm_admission.core.costs import ModelCosts
    from vllm_admission.core.eviction import get_eviction

    llm = engines.get("flop")
    sched = scheduler(llm)
    assert type(sched.kv_cache_manager.block_pool.free_block_queue).__name__ == "FlopFreeBlockQueue"
    costs = ModelCosts.from_config(llm.llm_engine.vllm_config.model_config.hf_config.to_dict())

    def chained(tokens):
        out, h = [], 0
        for i in range(len(tokens) // B):
            h = hash((h, tuple(tokens[i * B:(i + 1) * B])))
            out.append(h)
        return out

    for policy in POLICIES:
        assert llm.reset_prefix_cache()
        sched.set_admission_policy(policy)
        before = sched.stats()
        results = one_at_a_time(llm, JUNCTION_PROMPTS, 4)
        cache = HybridPrefixCache(num_blocks=FLOP_BLOCKS, block_size=B,
                                  group_kinds=("state", "attention"),
                                  admission=get_admission(policy),
                                  eviction=get_eviction("flop", alpha=0.0), chunk_size=4096,
                                  segment_flops=costs.prefill_flops, bytes_per_block=2 * 65536)
        sim = [cache.serve(chained(p), len(p), 4, rid=r, now=float(r)).hit_tokens
               for r, p in enumerate(JUNCTION_PROMPTS)]
        assert [h for h, _ in results] == sim, policy
        assert [out for _, out in results] == reference["junction"], policy
        after = sched.stats()
        assert after.evictions > before.evictions, policy
        assert_no_leak(llm)


@pytest.mark.parametrize("policy", POLICIES)
def test_flop_engine_survives_preemption_and_abort(engines, reference, policy):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = engines.get("flop")
    sched = scheduler(llm)
    assert llm.reset_prefix_cache()
    sched.set_admission_policy(policy)
    engine = llm.llm_engine
    # Abort a request in the middle of its prefill.
    engine.add_request("victim", TokensPrompt(prompt_token_ids=toks(77, 2600)),
                       SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True,
                                      detokenize=False))
    engine.step()
    (victim,) = sched.requests.values()
    assert 0 < victim.num_computed_tokens < 2600
    engine.abort_request(["victim"])
    while engine.has_unfinished_requests():
        engine.step()
    assert_no_leak(llm)
    assert llm.reset_prefix_cache()
    # Eight requests at once overflow the pool while decoding: vLLM preempts and recomputes.
    preempted = spy_preemptions(sched)
    try:
        results = generate(llm, FAULT_PROMPTS, FAULT_OUTPUT)
    finally:
        del sched._preempt_request  # noqa: SLF001
    assert preempted
    assert all(len(out) == FAULT_OUTPUT for _, out in results)
    if policy == "vllm":
        # Stock caching, and flop with alpha = 0 orders like vLLM's queue: the very same
        # schedule, preemptions and tokens as stock vLLM.
        assert [out for _, out in results] == reference["faults"]
        assert len(preempted) == reference["faults_preempted"]
    assert_no_leak(llm)
    assert not sched._admission.tracks  # noqa: SLF001
    # The engine keeps serving: a request alone gives the reference tokens.
    ((_, out),) = one_at_a_time(llm, [SEQ_PROMPT], 4)
    assert out == reference["seq"][:4]
    assert_no_leak(llm)


# ------------------------------------------------------------------ start-up errors
def test_invalid_setting_stops_the_engine_with_one_line(engines, monkeypatch):
    from vllm_admission.engine.replay import EngineSettings, build_llm
    from vllm_admission.plugin.config import AdmissionConfigError

    engines.close()
    settings = EngineSettings(model=str(engines.model_dir), max_model_len=4096, num_gpu_blocks=64,
                              scheduler_cls="vllm_admission.AdmissionScheduler",
                              env={"VLLM_ADMISSION_POLICY": "marconni"})
    try:
        with pytest.raises(AdmissionConfigError) as info:
            build_llm(settings)
    finally:
        # The half-built engine initialised process-wide distributed state and nothing
        # tears it down: do it, so later engines in this process start clean.
        from vllm.distributed import cleanup_dist_env_and_memory

        gc.collect()
        cleanup_dist_env_and_memory()
    monkeypatch.delenv("VLLM_ADMISSION_POLICY")
    msg = str(info.value)
    assert msg == ("VLLM_ADMISSION_POLICY='marconni' is invalid; "
                   "valid: none, last, vllm, marconi, dense")
