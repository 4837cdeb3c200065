"""What the scheduler-level tests share: vLLM's real scheduler driven without a model.

``vllm_admission_testing.harness.FakeEngine`` runs vLLM's ``Scheduler`` (or, with
async scheduling on, the plugin's ``AsyncScheduler`` variant under a queue of two
batches) with made-up model outputs, on a hand-built hybrid KV cache layout
identical to the tiny Qwen3-Next engine's (block size 128, group 0 = GDN state,
group 1 = full attention, 128 KiB per block id). The core's cache model
(``HybridPrefixCache``) is the reference: the same requests, one at a time, must
get the same hits in both.

Test modules register this module as a pytest plugin (``pytest_plugins``), which gives
them its fixtures.
"""

from __future__ import annotations

import logging
import random

import pytest
from block_hashes import chained_hashes

from vllm_admission.core.adaptive import (
    AUTO,
    DEFAULT_INTERVAL,
)
from vllm_admission.core.admission import ADMISSION_POLICIES, get_admission
from vllm_admission.core.cache import HybridPrefixCache
from vllm_admission.core.cache_inputs import CacheRequest
from vllm_admission.core.costs import ModelCosts
from vllm_admission.core.eviction import (
    ENGINE_EVICTION_POLICIES,
    eviction_class,
    get_eviction,
)
from vllm_admission.core.layout import CacheLayout, PoolSpec, SchedulingSpec
from vllm_admission.core.run import RunPlan, auto_run
from vllm_admission.core.settings import AutoSettings

B = 128  # pinned through vLLM's block_size (and bf16 state) below: the same on every CPU
GROUPS = ("state", "attention")
BYTES_PER_BLOCK = 2 * 65536  # 2 layers x 64 KiB pages (docs/engine-facts.md)
CHUNK = 4096
POLICIES = list(ADMISSION_POLICIES)
#: Every eviction policy the engine accepts (a new registry entry is covered automatically),
#: a tunable one at two fixed alphas.
EVICTION_CASES = [(name, alpha) for name in ENGINE_EVICTION_POLICIES
                  for alpha in ((0.0, 0.7) if eviction_class(name).tunable else (None,))]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from vllm_admission_testing.harness import write_config_only_model

    return write_config_only_model(tmp_path_factory.mktemp("tiny_config"))


@pytest.fixture(scope="module")
def vllm_config(model_dir):
    return scheduler_config(model_dir, async_scheduling=False)


@pytest.fixture(scope="module")
def async_config(model_dir):
    """The same engine configuration with vLLM's async scheduling on (the GPU default)."""
    return scheduler_config(model_dir, async_scheduling=True)


def scheduler_config(model_dir, *, async_scheduling):
    from vllm_admission_testing.harness import make_vllm_config

    cfg = make_vllm_config(model_dir, block_size=B, max_model_len=8192,
                           max_num_batched_tokens=CHUNK, async_scheduling=async_scheduling)
    assert cfg.cache_config.block_size == B
    assert cfg.cache_config.mamba_cache_mode == "align"
    assert cfg.scheduler_config.async_scheduling is async_scheduling
    # No runner here; the inpass mode checks that a real one would share the scheduler's process.
    cfg.parallel_config.distributed_executor_backend = "uni"
    return cfg


@pytest.fixture(scope="module")
def costs(model_dir):
    return ModelCosts.from_config(model_dir / "config.json")


_BUILT: list = []


@pytest.fixture(autouse=True)
def _finish_tuners():
    """After each test, let its schedulers' alpha tuners finish and stop.

    A tuner thread left running logs its decision whenever it gets there, which can
    fall inside a later test's log capture.
    """
    yield
    while _BUILT:
        ctl = getattr(_BUILT.pop().scheduler, "_admission", None)
        if ctl is not None:
            ctl.drain(timeout=60)
            ctl.stop()


def build(vllm_config, monkeypatch, *, policy="vllm", eviction="lru", alpha=None, blocks=160,
          kinds=GROUPS, cls=None, checkpoint="split", export=None):
    """A ``FakeEngine`` over the plugin's scheduler with these settings. ``export``: the
    ``prefill_checkpoint_alignment`` of vLLM's one-checkpoint export on the state groups
    (``None``: no export)."""
    from vllm_admission.plugin.scheduler import AdmissionScheduler
    from vllm_admission_testing.harness import (
        FakeEngine,
        make_kv_cache_config,
        make_scheduler,
    )

    monkeypatch.setenv("VLLM_ADMISSION_POLICY", policy)
    monkeypatch.setenv("VLLM_ADMISSION_EVICTION", eviction)
    monkeypatch.setenv("VLLM_ADMISSION_CHECKPOINT", checkpoint)
    if alpha is None:
        monkeypatch.delenv("VLLM_ADMISSION_ALPHA", raising=False)
    else:
        monkeypatch.setenv("VLLM_ADMISSION_ALPHA", str(alpha))
    sched = make_scheduler(cls or AdmissionScheduler, vllm_config,
                           make_kv_cache_config(vllm_config, blocks, kinds=kinds,
                                                prefill_checkpoint_alignment=export))
    engine = FakeEngine(sched)
    _BUILT.append(engine)
    return engine


def toks(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(8, 512) for _ in range(n)]  # 7 is the fake engine's output token


def chained(tokens):
    return chained_hashes(tokens, B)


def simulate(policy, eviction, requests, *, blocks, costs, alpha=None, steps=None, misses=None,
             export=False, async_scheduling=False):
    """The core model's hits; with ``steps`` / ``misses`` (lists), each request's prefill steps /
    state-miss tokens (attention-KV hit minus hybrid hit) are appended to them. ``export``:
    model vLLM's one-checkpoint export (``prompt_end_export``)."""
    tunable = eviction_class(eviction).tunable
    ev = get_eviction(eviction, **({"alpha": alpha} if alpha is not None and tunable else {}))
    layout = CacheLayout(PoolSpec(num_blocks=blocks, block_size=B, group_kinds=GROUPS,
                                  bytes_per_block=BYTES_PER_BLOCK),
                         SchedulingSpec(chunk_size=CHUNK, prompt_end_export=export,
                                        async_scheduling=async_scheduling))
    cache = HybridPrefixCache(layout, admission=get_admission(policy), eviction=ev,
                              segment_flops=costs.prefill_flops)
    hits = []
    for r, (tokens, out_len) in enumerate(requests):
        out = cache.serve(chained(tokens), len(tokens), out_len, rid=r, now=float(r))
        hits.append(out.hit_tokens)
        if steps is not None:
            steps.append(out.prefill_steps)
        if misses is not None:
            misses.append(out.state_miss_tokens)
    return hits, cache


def run_engine(engine, requests, misses=None):
    """Each request's hit, one request at a time; with ``misses`` (a list), each request's
    state-miss tokens (the step of the plugin's counter) are appended to it."""
    hits = []
    for tokens, out_len in requests:
        before = engine.scheduler.stats().state_miss_tokens
        rid = engine.add(tokens, out_len)
        engine.run()
        hits.append(engine.cached_tokens[rid])
        if misses is not None:
            misses.append(engine.scheduler.stats().state_miss_tokens - before)
    return hits


def assert_counters_match(engine, cache):
    """The engine's evictions per group, checkpoints and junctions are the core model's
    (``cache``, run on the same requests); the workload evicted; no block leaked."""
    stats = engine.scheduler.stats()
    assert stats.evictions_by_group == {"state0": cache.pool.evictions_by_group[0],
                                        "attention1": cache.pool.evictions_by_group[1]}
    assert stats.evictions > 0
    assert stats.state_checkpoints == cache.state_checkpoints
    assert stats.junctions == cache.junctions
    assert free_equals_usable(engine)


def plugin_lines(caplog, build_it):
    """``(level, message)`` of the vllm_admission records logged while ``build_it()`` runs."""
    caplog.set_level(logging.INFO, logger="vllm_admission")
    logger = logging.getLogger("vllm_admission")
    logger.addHandler(caplog.handler)
    try:
        result = build_it()
    finally:
        logger.removeHandler(caplog.handler)
    records = {id(r): r for r in caplog.records if r.name == "vllm_admission"}
    return result, [(r.levelno, r.getMessage()) for r in records.values()]


def free_equals_usable(engine):
    pool = engine.scheduler.kv_cache_manager.block_pool
    return pool.get_num_free_blocks() == pool.num_gpu_blocks - 1


def mamba_positions(engine):
    from vllm.v1.core.kv_cache_utils import get_group_id

    from vllm_admission.plugin.boundary.hooks import cached_blocks

    pool = engine.scheduler.kv_cache_manager.block_pool
    return sorted(b.block_hash_num_tokens for key, b in cached_blocks(pool)
                  if get_group_id(key) == 0)


def random_workload(seed, n=36):
    rng = random.Random(seed)
    prefixes = [toks(seed * 100 + k, rng.randrange(300, 1500)) for k in range(3)]
    reqs = []
    history = []
    for i in range(n):
        roll = rng.random()
        if history and roll < 0.2:
            tokens = list(rng.choice(history))                      # resend
        elif history and roll < 0.35:
            tokens = list(rng.choice(history)) + toks(seed * 1000 + i, rng.randrange(1, 400))
        else:
            tokens = rng.choice(prefixes) + toks(seed * 1000 + i, rng.randrange(1, 1200))
        tokens = tokens[:2700]
        history.append(tokens)
        reqs.append((tokens, rng.randrange(1, 300)))
    return reqs



def simulate_auto(requests, *, blocks, costs, admission=AUTO, interval=DEFAULT_INTERVAL,
                  shadow_rate=None, margin=0.0, auto_admissions=None):
    """The simulator's auto run (``core/run.py``'s ``auto_run``, as ``sim/simulator.py`` runs it
    on a trace), on the harness's pool."""
    layout = CacheLayout(PoolSpec(num_blocks=blocks, block_size=B, group_kinds=GROUPS,
                                  bytes_per_block=BYTES_PER_BLOCK), SchedulingSpec(chunk_size=CHUNK))
    plan = RunPlan.from_settings(admission, AUTO, auto_admissions=auto_admissions)
    cache, ctl = auto_run(plan, layout, costs.prefill_flops,
                          AutoSettings(interval=interval, shadow_rate=shadow_rate, margin=margin))
    hits = []
    for r, (tokens, out_len) in enumerate(requests):
        out = cache.serve(chained(tokens), len(tokens), out_len, rid=r, now=float(r))
        hits.append(out.hit_tokens)
        ctl.observe(r, CacheRequest(chained(tokens), len(tokens), out_len))
    return hits, ctl


def auto_in_engine_and_simulator(vllm_config, monkeypatch, costs, requests, *, blocks=60,
                                 interval=DEFAULT_INTERVAL, shadow_rate=None, margin=0.0,
                                 auto_admissions=None):
    """``auto`` + ``auto`` on ``requests`` in the engine (its settings given as the plugin's
    environment variables) and in the simulator (the same settings as arguments);
    returns ``(engine, engine hits, simulator hits, simulator controller)``."""
    env = {"VLLM_ADMISSION_AUTO_INTERVAL": interval, "VLLM_ADMISSION_SHADOW_RATE": shadow_rate,
           "VLLM_ADMISSION_AUTO_MARGIN": margin or None,
           "VLLM_ADMISSION_AUTO_ADMISSIONS": ",".join(auto_admissions) if auto_admissions else None}
    for name, value in env.items():
        if value is not None:
            monkeypatch.setenv(name, str(value))
    engine = build(vllm_config, monkeypatch, policy=AUTO, eviction=AUTO, blocks=blocks)
    hits = serve_deciding(engine, requests)
    sim_hits, sim = simulate_auto(requests, blocks=blocks, costs=costs, interval=interval,
                                  shadow_rate=shadow_rate, margin=margin,
                                  auto_admissions=auto_admissions)
    return engine, hits, sim_hits, sim


def serve_deciding(engine, requests):
    """Run ``requests`` one at a time, letting auto's decision land before the next
    (as the simulator does); returns each request's cached tokens."""
    ctl = engine.scheduler._admission  # noqa: SLF001
    hits = []
    for tokens, out_len in requests:
        rid = engine.add(tokens, out_len)
        engine.run()
        hits.append(engine.cached_tokens[rid])
        assert ctl.drain(timeout=60)
    return hits


