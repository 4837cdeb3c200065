"""The AdmissionScheduler in a real vLLM 0.32 CPU engine running the tiny hybrid models.

Engines (in-process engine core, so the scheduler is inspectable), one alive at a time:

* ``stock``: vLLM without this plugin (``VLLM_PLUGINS=""``, stock scheduler) in the same
  small pool as ``flop``: the reference outputs;
* ``lru``: the plugin with ``lru`` eviction, a pool of 20,480 tokens; every admission
  policy is run on it by switching the policy on the live scheduler between cases;
* ``flop``: the plugin with ``flop`` eviction (alpha fixed at 0) in a pool of 6,144 tokens,
  small enough for evictions and preemptions;
* one engine start with an invalid setting.

The module runs once per ``engine_cases.ENGINE_CASES`` entry: the tiny Qwen3-Next (Gated
DeltaNet) model with each pinned SSM state dtype, so with the block size B = 128 (bf16 state)
and B = 256 (float32) on any CPU, and the tiny Nemotron-H (Mamba2) model with its default
float32 state (B = 256). Pools are sized in tokens and converted to blocks of B. Derivations
are next to the expected numbers; the fast tests in ``test_plugin_scheduler.py`` check the same
cases without a model.
"""

from __future__ import annotations

import gc
import logging
import os
import random

import pytest
from engine_cases import ENGINE_CASES_EACH_MODEL, engine_block_size, engine_case_id, predicted_block_size
from junction_case import expected_junction, expected_junction_prefill_steps, junction_prompts
from model_output import LOGITS_MODE, assert_same_output, first_tokens
from model_output import generate as one_at_a_time
from sequence_case import expected_states as expected_states_of

from vllm_admission.core.adaptive import AUTO_ADMISSIONS, AUTO_EVICTIONS, Pair, PolicyController
from vllm_admission.core.admission import ADMISSION_POLICIES, stock_admission
from vllm_admission.core.eviction import ENGINE_EVICTION_POLICIES

pytestmark = pytest.mark.engine

#: Every registered admission policy, stock vLLM's first (the engine tests switch among them
#: on one engine).
POLICIES = sorted(ADMISSION_POLICIES, key=lambda name: name != stock_admission())
LRU_POOL_TOKENS = 160 * 128
FLOP_POOL_TOKENS = 48 * 128
MAX_MODEL_LEN = 4096


def toks(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(3, 512) for _ in range(n)]


# The junction case: tests/junction_case.py.
JUNCTION_PROMPTS = junction_prompts(toks)

# One request, P = 1000, O = 40.
SEQ_PROMPT = toks(4, 1000)
SEQ_OUTPUT = 40


def expected_states(B: int) -> dict[str, list[int]]:  # noqa: N803
    """Per policy, the cached state positions after SEQ_PROMPT with SEQ_OUTPUT tokens.

    Prompt end c = floor(999 / B) * B (896 at B = 128, 768 at 256); the sequence reaches token
    1,039, and decode crosses the block boundaries in (1000, 1039] (1,024 in both geometries),
    the last of which, floor(1039 / B) * B, is Marconi's sequence end.
    """
    c = 999 // B * B
    decode = [k * B for k in range(1000 // B + 1, 1039 // B + 1)]
    assert decode, "the output must cross a block boundary"
    written_out = {
        "none": [],
        "vllm": [c],
        "marconi": [1039 // B * B],
        "last": [c] + decode,
        "dense": [B * i for i in range(1, c // B + 1)] + decode,
    }
    # Every registered policy, from its own answers (tests/sequence_case.py).
    derived = {name: expected_states_of(name, 1000, 40, B) for name in POLICIES}
    assert all(derived[n] == states for n, states in written_out.items())
    return derived


# Faults: eight 700-token prompts sharing 300 tokens, 80 output tokens each, all at once in
# the flop pool (a request needs up to ceil(779 / B) KV blocks + 2 states); vLLM preempts some of them
# while they decode and recomputes them (3 preemptions in vLLM's scheduler driven without
# a model, tests/test_plugin_scheduler.py's FakeEngine). Greedy tokens depend on the batch on this CPU backend
# (a request decoded alone and in this batch differ from token 11 on), and a request
# recomputed after a preemption takes other kernels, so the reference is stock vLLM
# running the same batch in the same pool.
FAULT_PROMPTS = [toks(9, 300) + toks(50 + i, 400) for i in range(8)]
FAULT_OUTPUT = 80

#: The start-up tests run once per model (both architectures, both block sizes): what they
#: check does not depend on the state dtype, and the other tests cover every case.
each_model = pytest.mark.parametrize("engine_case", ENGINE_CASES_EACH_MODEL, indirect=True,
                                     ids=engine_case_id)


# ------------------------------------------------------------------ engines
class Engines:
    """At most one engine alive; switching kind closes the previous one.

    ``B`` is the block size vLLM gives the model with ``ssm_dtype`` state, derived by the core
    and checked against every engine started.
    """

    def __init__(self, model_dir, ssm_dtype):
        self.model_dir = model_dir
        self.ssm_dtype = ssm_dtype
        self.B = predicted_block_size(model_dir, ssm_dtype)  # noqa: N806
        self.flop_blocks = FLOP_POOL_TOKENS // self.B
        self.kind = None
        self.llm = None
        self.warnings: dict[str, list[str]] = {}

    def get(self, kind):
        if kind == self.kind:
            return self.llm
        self.close()
        import vllm.plugins

        from vllm_admission.engine.llm import EngineSettings, build_llm

        env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_ADMISSION_LOG_INTERVAL": "0",
               "VLLM_ADMISSION_POLICY": None, "VLLM_ADMISSION_EVICTION": None,
               "VLLM_ADMISSION_ALPHA": None}
        settings = EngineSettings(model=str(self.model_dir), env=env, max_model_len=MAX_MODEL_LEN,
                                  mamba_ssm_cache_dtype=self.ssm_dtype,
                                  engine_args=dict(LOGITS_MODE))
        if kind == "stock":
            env["VLLM_PLUGINS"] = ""
            settings.num_gpu_blocks = self.flop_blocks
        else:
            env["VLLM_PLUGINS"] = None
            settings.scheduler_cls = "vllm_admission.AdmissionScheduler"
            if kind == "lru":
                settings.num_gpu_blocks = LRU_POOL_TOKENS // self.B
                env.update(VLLM_ADMISSION_EVICTION="lru")
            elif kind == "flop":
                settings.num_gpu_blocks = self.flop_blocks
                env.update(VLLM_ADMISSION_EVICTION="flop", VLLM_ADMISSION_ALPHA="0")
            elif kind.startswith("eviction:"):  # a registered policy, its default settings
                settings.num_gpu_blocks = self.flop_blocks
                env.update(VLLM_ADMISSION_EVICTION=kind.removeprefix("eviction:"))
            elif kind == "auto":
                settings.num_gpu_blocks = self.flop_blocks
                env.update(VLLM_ADMISSION_POLICY="auto", VLLM_ADMISSION_EVICTION="auto")
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
        assert engine_block_size(self.llm) == self.B
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
def ssm_dtype(engine_case):
    """This module instance's pinned SSM state dtype (``engine_cases.ENGINE_CASES``)."""
    return engine_case[1]


@pytest.fixture(scope="module")
def engines(engine_model_dir, ssm_dtype):
    pytest.importorskip("vllm")
    saved = dict(os.environ)
    e = Engines(engine_model_dir, ssm_dtype)
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


def scheduler(llm):
    from vllm_admission.engine.llm import inprocess_scheduler

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
    sched = scheduler(llm)
    assert type(sched).__name__ == "Scheduler"
    preempted = spy_preemptions(sched)
    ref = {
        "junction": one_at_a_time(llm, JUNCTION_PROMPTS, 4),
        "seq": one_at_a_time(llm, [SEQ_PROMPT], SEQ_OUTPUT)[0],
    }
    assert not preempted
    ref["faults"] = [out for _, out in generate(llm, FAULT_PROMPTS, FAULT_OUTPUT)]
    ref["faults_preempted"] = len(preempted)
    assert preempted, "the pool was meant to be too small for eight requests at once"
    assert all(len(out.tokens) == 4 for out in ref["junction"])
    return ref


# ------------------------------------------------------------------ lru engine
def test_plugin_variables_cause_no_vllm_warning(engines, reference, monkeypatch):
    monkeypatch.setenv("VLLM_ADMISSION_TUNE_MULTIPLIER", "5")
    llm = engines.get("lru")
    assert type(scheduler(llm)).__name__ == "AdmissionScheduler"
    assert engines.warnings["lru"] == []


@pytest.mark.parametrize("policy", POLICIES)
def test_junction_case_outputs_and_metrics(engines, reference, policy):
    from vllm_admission.engine.llm import prefix_cache_counters
    from vllm_admission.plugin.scheduler import admission_stats

    llm = engines.get("lru")
    sched = scheduler(llm)
    assert llm.reset_prefix_cache()
    sched.set_admission_policy(policy)
    before = admission_stats(llm)
    hits0, queries0 = prefix_cache_counters(llm)
    results = one_at_a_time(llm, JUNCTION_PROMPTS, 4)  # each counted by a PrefillStepCounter
    hits = [o.cached for o in results]
    assert hits == expected_junction(engines.B)[policy]
    assert [o.passes for o in results] == expected_junction_prefill_steps(engines.B)[policy]
    assert "schedule" not in vars(sched)  # the counter put the scheduler back
    assert_same_output(reference["junction"], results, label=policy)
    # vLLM's own counters stay right: hits = the sum of num_cached_tokens.
    hits1, queries1 = prefix_cache_counters(llm)
    assert hits1 - hits0 == sum(hits)
    assert queries1 - queries0 == sum(len(p) for p in JUNCTION_PROMPTS)
    after = admission_stats(llm)
    assert after.admission == policy
    assert after.hit_tokens - before.hit_tokens == sum(hits)
    assert after.hit_requests - before.hit_requests == sum(h > 0 for h in hits)
    assert after.requests - before.requests == 10
    assert_no_leak(llm)


def chained(tokens, B):  # noqa: N803
    """Chained block hashes of ``tokens`` (one per full block of ``B``), as vLLM chains them."""
    out, h = [], 0
    for i in range(len(tokens) // B):
        h = hash((h, tuple(tokens[i * B:(i + 1) * B])))
        out.append(h)
    return out


def test_junction_case_engine_equals_core_model(engines):
    """The core's cache model with this engine's geometry gives the same per-request hits."""
    from vllm_admission.core.admission import get_admission
    from vllm_admission.core.cache import HybridPrefixCache
    from vllm_admission.core.eviction import get_eviction
    from vllm_admission.core.layout import CacheLayout, PoolSpec, SchedulingSpec

    B = engines.B  # noqa: N806
    for policy in POLICIES:
        layout = CacheLayout(PoolSpec(num_blocks=LRU_POOL_TOKENS // B, block_size=B,
                                      group_kinds=("state", "attention")), SchedulingSpec(chunk_size=4096))
        cache = HybridPrefixCache(layout, admission=get_admission(policy), eviction=get_eviction("lru"))
        outs = [cache.serve(chained(p, B), len(p), 4, rid=r, now=float(r))
                for r, p in enumerate(JUNCTION_PROMPTS)]
        assert [o.hit_tokens for o in outs] == expected_junction(B)[policy], policy
        assert ([o.prefill_steps for o in outs]
                == expected_junction_prefill_steps(B)[policy]), policy


@pytest.mark.parametrize("policy", POLICIES)
def test_cached_states_follow_the_policy(engines, reference, policy):
    from vllm_admission.engine.llm import cached_block_positions

    llm = engines.get("lru")
    B = engines.B  # noqa: N806
    states = expected_states(B)[policy]
    assert llm.reset_prefix_cache()
    scheduler(llm).set_admission_policy(policy)
    (out,) = one_at_a_time(llm, [SEQ_PROMPT], SEQ_OUTPUT)
    assert out.cached == 0
    assert_same_output([reference["seq"]], [out], label=policy)
    cached = cached_block_positions(llm)
    assert cached["0:state"] == states
    # Attention KV for 1,039 computed tokens: every full block, whatever the policy.
    assert cached["1:attention"] == [B * i for i in range(1, 1039 // B + 1)]
    # The same prompt again hits the last cached state at or below floor(999 / B) * B.
    (out2,) = one_at_a_time(llm, [SEQ_PROMPT], 4)
    assert out2.cached == max([s for s in states if s <= 999 // B * B], default=0)
    assert_same_output([first_tokens(reference["seq"], 4)], [out2], label=policy)
    assert_no_leak(llm)


# ------------------------------------------------------------------ flop engine
def test_flop_engine_junction_case_matches_core_model(engines, reference):
    """In the flop pool (6,144 tokens) the ten 1,801-token prompts (ceil(1801 / B) KV blocks
    + states each) evict; the core model with the same geometry and alpha = 0 predicts every
    hit."""
    from vllm_admission.core.admission import get_admission
    from vllm_admission.core.cache import HybridPrefixCache
    from vllm_admission.core.costs import ModelCosts
    from vllm_admission.core.eviction import get_eviction
    from vllm_admission.core.layout import CacheLayout, PoolSpec, SchedulingSpec

    llm = engines.get("flop")
    sched = scheduler(llm)
    assert type(sched.kv_cache_manager.block_pool.free_block_queue).__name__ == "PolicyFreeBlockQueue"
    costs = ModelCosts.from_config(llm.llm_engine.vllm_config.model_config.hf_config.to_dict(),
                                   mamba_ssm_cache_dtype=engines.ssm_dtype)
    B = engines.B  # noqa: N806
    groups = sched.kv_cache_config.kv_cache_groups
    bytes_per_block = max(g.kv_cache_spec.page_size_bytes * len(g.layer_names) for g in groups)
    assert bytes_per_block == 2 * (B * 2 * 64 * 2 * 2)  # 2 layers x one attention page

    for policy in POLICIES:
        assert llm.reset_prefix_cache()
        sched.set_admission_policy(policy)
        before = sched.stats()
        results = one_at_a_time(llm, JUNCTION_PROMPTS, 4)
        layout = CacheLayout(PoolSpec(num_blocks=engines.flop_blocks, block_size=B,
                                      group_kinds=("state", "attention"), bytes_per_block=bytes_per_block),
                             SchedulingSpec(chunk_size=4096))
        cache = HybridPrefixCache(layout, admission=get_admission(policy),
                                  eviction=get_eviction("flop", alpha=0.0),
                                  segment_flops=costs.prefill_flops)
        sim = [cache.serve(chained(p, B), len(p), 4, rid=r, now=float(r)).hit_tokens
               for r, p in enumerate(JUNCTION_PROMPTS)]
        assert [o.cached for o in results] == sim, policy
        assert_same_output(reference["junction"], results, label=policy)
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
        # schedule and preemptions as stock vLLM, so the same computation and tokens.
        assert [out for _, out in results] == reference["faults"]
        assert len(preempted) == reference["faults_preempted"]
    assert_no_leak(llm)
    assert not sched._admission.requests.tracks  # noqa: SLF001
    # The engine keeps serving: a request alone gives the reference tokens.
    (out,) = one_at_a_time(llm, [SEQ_PROMPT], 4)
    assert_same_output([first_tokens(reference["seq"], 4)], [out], label=policy)
    assert_no_leak(llm)


# ------------------------------------------------------------------ every eviction policy
@each_model
@pytest.mark.parametrize("eviction", ENGINE_EVICTION_POLICIES)
def test_every_engine_eviction_policy_starts_and_gives_stock_outputs(engines, reference, eviction):
    """Each name VLLM_ADMISSION_EVICTION accepts (the registry, so a new policy is covered
    without editing this test) starts an engine with its default settings, serves the
    junction case in the small pool with evictions, and gives stock vLLM's greedy tokens."""
    from vllm_admission.core.eviction import eviction_class

    llm = engines.get(f"eviction:{eviction}")
    sched = scheduler(llm)
    results = one_at_a_time(llm, JUNCTION_PROMPTS, 4)
    assert_same_output(reference["junction"], results, label=eviction)
    stats = sched.stats()
    assert stats.eviction == eviction and stats.evictions > 0
    queue = type(sched.kv_cache_manager.block_pool.free_block_queue).__name__
    assert (queue == "FreeKVCacheBlockQueue") == eviction_class(eviction).vllm_order
    assert_no_leak(llm)


@each_model
def test_auto_starts_and_gives_stock_outputs(engines, reference):
    """VLLM_ADMISSION_POLICY=auto and VLLM_ADMISSION_EVICTION=auto (the other names the
    variables accept) start an engine that begins as auto's start pair (in ``split`` mode
    stock's, ``vllm`` + ``lru``), serves the junction case with evictions through the
    plugin's free queue, and gives stock's greedy tokens."""
    llm = engines.get("auto")
    sched = scheduler(llm)
    results = one_at_a_time(llm, JUNCTION_PROMPTS, 4)
    assert_same_output(reference["junction"], results)
    stats = sched.stats()
    start = PolicyController.default_start(AUTO_ADMISSIONS, AUTO_EVICTIONS, "split")
    assert start == Pair("vllm", "lru") and not stats.policy_switches   # 4 requests: no decision
    assert stats.adaptive and (stats.admission, stats.eviction) == (start.admission, start.eviction)
    assert stats.evictions > 0
    queue = type(sched.kv_cache_manager.block_pool.free_block_queue).__name__
    assert queue == "PolicyFreeBlockQueue"
    assert sched._admission.drain(timeout=60)  # noqa: SLF001 - the shadows saw every request
    worker = sched._admission.background.controller  # noqa: SLF001
    assert not worker.in_process and worker.error is None   # the shadows ran in a child
    assert_no_leak(llm)


# ------------------------------------------------------------------ start-up errors
@each_model
def test_invalid_setting_stops_the_engine_with_one_line(engines, monkeypatch):
    from vllm_admission.engine.llm import EngineSettings, build_llm
    from vllm_admission.plugin.env import SettingsError

    engines.close()
    settings = EngineSettings(model=str(engines.model_dir), max_model_len=MAX_MODEL_LEN,
                              num_gpu_blocks=engines.flop_blocks,
                              mamba_ssm_cache_dtype=engines.ssm_dtype,
                              scheduler_cls="vllm_admission.AdmissionScheduler",
                              env={"VLLM_ADMISSION_POLICY": "marconni"})
    try:
        with pytest.raises(SettingsError) as info:
            build_llm(settings)
    finally:
        # The half-built engine initialised process-wide distributed state and nothing
        # tears it down: do it, so later engines in this process start clean.
        from vllm.distributed import cleanup_dist_env_and_memory

        gc.collect()
        cleanup_dist_env_and_memory()
    # build_llm read the setting once and never put it into this process's environment
    assert os.environ.get("VLLM_ADMISSION_POLICY") != "marconni"
    msg = str(info.value)
    assert msg == ("VLLM_ADMISSION_POLICY='marconni' is invalid; "
                   "valid: none, last, vllm, block, marconi, dense, written, auto")
