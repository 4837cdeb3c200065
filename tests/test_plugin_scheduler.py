"""AdmissionScheduler inside vLLM's real scheduler, driven without a model.

``vllm_admission.plugin.testing.FakeEngine`` runs vLLM 0.32's ``Scheduler``
(``schedule()`` + ``update_from_output()``) with made-up model outputs, on a
hand-built hybrid KV cache layout identical to the tiny Qwen3-Next engine's
(block size 128, group 0 = GDN state, group 1 = full attention, 128 KiB per
block id). Everything vLLM decides about blocks runs for real; only the
forward pass is missing. No engine start: these tests are fast.

The core's cache model (``HybridPrefixCache``) is the reference: the same
requests, one at a time, must get the same hits in both.
"""

from __future__ import annotations

import logging
import random

import pytest
from conftest import chained_hashes
from junction_case import (
    expected_junction,
    expected_junction_prefill_steps,
    junction_prompts,
)

pytest.importorskip("vllm")

from vllm_admission.core.adaptive import (  # noqa: E402
    AUTO,
    AUTO_EVICTIONS,
    DEFAULT_INTERVAL,
    LiveEvictions,
    PolicyController,
    candidate_policies,
)
from vllm_admission.core.admission import ADMISSION_POLICIES, get_admission  # noqa: E402
from vllm_admission.core.cache import HybridPrefixCache  # noqa: E402
from vllm_admission.core.costs import ModelCosts  # noqa: E402
from vllm_admission.core.eviction import (  # noqa: E402
    ENGINE_EVICTION_POLICIES,
    eviction_class,
    get_eviction,
)
from vllm_admission.core.geometry import CacheLayout  # noqa: E402
from vllm_admission.core.replay import CacheRequest, CacheSetup  # noqa: E402

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
    from vllm_admission.plugin.testing import write_config_only_model

    return write_config_only_model(tmp_path_factory.mktemp("tiny_config"))


@pytest.fixture(scope="module")
def vllm_config(model_dir):
    from vllm_admission.plugin.testing import make_vllm_config

    cfg = make_vllm_config(model_dir, block_size=B, max_model_len=8192,
                           max_num_batched_tokens=CHUNK)
    assert cfg.cache_config.block_size == B
    assert cfg.cache_config.mamba_cache_mode == "align"
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
          kinds=GROUPS, cls=None, checkpoint="split"):
    from vllm_admission.plugin.scheduler import AdmissionScheduler
    from vllm_admission.plugin.testing import (
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
                           make_kv_cache_config(vllm_config, blocks, kinds=kinds))
    engine = FakeEngine(sched)
    _BUILT.append(engine)
    return engine


def toks(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(8, 512) for _ in range(n)]  # 7 is the fake engine's output token


def chained(tokens):
    return chained_hashes(tokens, B)


def simulate(policy, eviction, requests, *, blocks, costs, alpha=None, steps=None):
    """The core model's hits; with ``steps`` (a list), its prefill steps are appended to it."""
    tunable = eviction_class(eviction).tunable
    ev = get_eviction(eviction, **({"alpha": alpha} if alpha is not None and tunable else {}))
    cache = HybridPrefixCache(num_blocks=blocks, block_size=B, group_kinds=GROUPS,
                              admission=get_admission(policy), eviction=ev, chunk_size=CHUNK,
                              segment_flops=costs.prefill_flops, bytes_per_block=BYTES_PER_BLOCK)
    hits = []
    for r, (tokens, out_len) in enumerate(requests):
        out = cache.serve(chained(tokens), len(tokens), out_len, rid=r, now=float(r))
        hits.append(out.hit_tokens)
        if steps is not None:
            steps.append(out.prefill_steps)
    return hits, cache


def run_engine(engine, requests):
    hits = []
    for tokens, out_len in requests:
        rid = engine.add(tokens, out_len)
        engine.run()
        hits.append(engine.cached_tokens[rid])
    return hits


def free_equals_usable(engine):
    pool = engine.scheduler.kv_cache_manager.block_pool
    return pool.get_num_free_blocks() == pool.num_gpu_blocks - 1


def mamba_positions(engine):
    from vllm.v1.core.kv_cache_utils import get_group_id

    from vllm_admission.plugin.vllm_hooks import cached_blocks

    pool = engine.scheduler.kv_cache_manager.block_pool
    return sorted(b.block_hash_num_tokens for key, b in cached_blocks(pool)
                  if get_group_id(key) == 0)


# ---------------------------------------------------------------- the junction case
# tests/junction_case.py derives the expected hits.
def junction_requests():
    return [(p, 4) for p in junction_prompts(toks)]


@pytest.mark.parametrize("eviction", ["lru", "flop"])
@pytest.mark.parametrize("policy", POLICIES)
def test_junction_case_exact_hits(vllm_config, monkeypatch, costs, policy, eviction):
    from vllm_admission.engine.llm import PrefillStepCounter

    reqs = junction_requests()
    engine = build(vllm_config, monkeypatch, policy=policy, eviction=eviction, alpha=0.5)
    with PrefillStepCounter(engine.scheduler) as counter:
        hits = run_engine(engine, reqs)
    assert hits == expected_junction(B)[policy]
    sim_steps = []
    assert simulate(policy, eviction, reqs, blocks=160, costs=costs, alpha=0.5,
                    steps=sim_steps)[0] == hits
    # Prefill steps (docs/engine-facts.md rule 6): the scheduler's and the core model's.
    assert list(counter.counts.values()) == expected_junction_prefill_steps(B)[policy]
    assert sim_steps == expected_junction_prefill_steps(B)[policy]
    stats = engine.scheduler.stats()
    assert stats.tokens_saved == sum(hits)
    assert stats.state_hits == sum(h > 0 for h in hits)
    assert stats.requests == 10
    assert free_equals_usable(engine)


# ---------------------------------------------------------------- sequence-end states
# P = 1000, O = 300: prompt end floor(999 / 128) * 128 = 896; the sequence reaches token
# 1,299, so its last block boundary is floor(1299 / 128) * 128 = 1,280 (a decode boundary).
EXPECTED_STATES = {
    "none": [],
    "vllm": [896],
    "marconi": [1280],                       # the sequence end only
    "last": [896, 1024, 1152, 1280],         # prompt end + every decode boundary
    "dense": [128 * i for i in range(1, 8)] + [1024, 1152, 1280],
}


@pytest.mark.parametrize("policy", POLICIES)
def test_cached_states_per_policy(vllm_config, monkeypatch, costs, policy):
    engine = build(vllm_config, monkeypatch, policy=policy)
    run_engine(engine, [(toks(4, 1000), 300)])
    assert mamba_positions(engine) == EXPECTED_STATES[policy]
    _, cache = simulate(policy, "lru", [(toks(4, 1000), 300)], blocks=160, costs=costs)
    assert cache.checkpoints == len(EXPECTED_STATES[policy])
    assert engine.scheduler.stats().checkpoints == len(EXPECTED_STATES[policy])
    if policy == "marconi":  # 896, 1024 and 1152 were kept tentatively, then replaced
        assert engine.scheduler.stats().superseded == 3
    assert free_equals_usable(engine)


def test_dense_prefill_chunks_end_at_every_block(vllm_config, monkeypatch):
    engine = build(vllm_config, monkeypatch, policy="dense")
    engine.add(toks(5, 700), 2)
    sizes = []
    while engine.scheduler.has_requests():
        out = engine.scheduler.schedule()
        sizes.append(sum(out.num_scheduled_tokens.values()))
        engine.scheduler.update_from_output(out, _outputs(engine, out))
    # 700 tokens: chunks end at 128, 256, ..., 640 (= prompt end floor(699/128)*128), then
    # 640..700, then one decode step.
    assert [n for n in sizes if n] == [128] * 5 + [60, 1]


def _outputs(engine, out):
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(out.num_scheduled_tokens)
    reqs = engine.scheduler.requests
    sampled = [[7] if reqs[r].num_computed_tokens >= reqs[r].num_tokens else [] for r in ids]
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=sampled)


# ---------------------------------------------------------------- random workloads vs the core
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


@pytest.mark.parametrize("eviction,alpha", EVICTION_CASES)
@pytest.mark.parametrize("policy", POLICIES)
def test_random_workload_matches_core_model(vllm_config, monkeypatch, costs, policy, eviction,
                                            alpha):
    """Same requests, same hits, same evictions per group as the simulator, request by request.

    A 60-block pool (59 usable, a request needs up to 26) forces many evictions. The plugin's
    default eviction clock counts arriving requests, as the simulator's ``now`` does, so
    ``flop`` orders alike without any test hook.
    """
    reqs = random_workload(11)
    engine = build(vllm_config, monkeypatch, policy=policy, eviction=eviction, alpha=alpha,
                   blocks=60)
    hits = run_engine(engine, reqs)
    sim_hits, cache = simulate(policy, eviction, reqs, blocks=60, costs=costs, alpha=alpha)
    assert hits == sim_hits
    stats = engine.scheduler.stats()
    assert stats.evictions_by_group == {"state0": cache.pool.evictions_by_group[0],
                                        "attention1": cache.pool.evictions_by_group[1]}
    assert stats.evictions > 0
    assert stats.checkpoints == cache.checkpoints
    assert stats.junctions == cache.junctions
    assert free_equals_usable(engine)


def test_stock_policy_leaves_vllm_untouched(vllm_config, monkeypatch):
    """``vllm`` + ``lru``: the same hits, the same block ids handed to every request, the same
    free-queue order and the same cached states as vLLM's own scheduler."""
    from vllm.v1.core.sched.scheduler import Scheduler

    reqs = random_workload(5)
    runs = []
    for cls in (Scheduler, None):
        engine = build(vllm_config, monkeypatch, blocks=60, cls=cls)
        sched = engine.scheduler
        block_ids, free = [], []
        for tokens, out_len in reqs:
            engine.add(tokens, out_len)
            while sched.has_requests():
                engine.step()
                out = engine.last_output
                block_ids.extend(new.block_ids for new in out.scheduled_new_reqs)
                block_ids.append(out.scheduled_cached_reqs.new_block_ids)
            free.append(sched.kv_cache_manager.block_pool.get_num_free_blocks())
        queue = sched.kv_cache_manager.block_pool.free_block_queue
        runs.append((block_ids, free, list(engine.cached_tokens.values()),
                     [b.block_id for b in queue.get_all_free_blocks()], mamba_positions(engine)))
    assert runs[0] == runs[1]
    assert sum(runs[0][2]) > 0


# ---------------------------------------------------------------- faults
@pytest.mark.parametrize("checkpoint", ["split", "inpass"])
@pytest.mark.parametrize("eviction", ENGINE_EVICTION_POLICIES)
@pytest.mark.parametrize("policy", POLICIES)
def test_preemption_and_abort_leak_nothing(vllm_config, monkeypatch, policy, eviction, checkpoint):
    """A 2,600-token request is aborted after its first prefill chunk (1,024-token budget
    for that step, so that ``inpass`` too stops mid-prefill); then eight concurrent
    requests (700 prompt tokens sharing 300, 500 output tokens each) overflow a 64-block
    pool while decoding, so vLLM preempts some of them. Every request but the aborted one
    finishes with all its tokens, every block comes back (the in-pass checkpoint blocks
    included), and the scheduler keeps serving."""
    engine = build(vllm_config, monkeypatch, policy=policy, eviction=eviction, blocks=64,
                   checkpoint=checkpoint)
    sched = engine.scheduler
    victim = engine.add(toks(77, 2600), 10)
    budget, sched.max_num_scheduled_tokens = sched.max_num_scheduled_tokens, 1024
    engine.step()
    sched.max_num_scheduled_tokens = budget
    assert 0 < sched.requests[victim].num_computed_tokens < 2600  # mid-prefill
    engine.abort(victim)
    base = toks(9, 300)
    rids = [engine.add(base + toks(50 + i, 400), 500) for i in range(8)]
    reqs = [sched.requests[r] for r in rids]
    engine.run()
    assert sum(r.num_preemptions for r in reqs) > 0
    assert all(len(r.output_token_ids) == 500 for r in reqs)
    assert victim not in engine.outputs or engine.outputs[victim].finish_reason is not None
    assert free_equals_usable(engine)
    assert not sched._admission.tracks  # noqa: SLF001 - nothing left behind
    rid = engine.add(base + toks(99, 300), 5)
    engine.run()
    assert engine.cached_tokens[rid] >= (256 if policy in ("dense",) else 0)
    assert free_equals_usable(engine)


# ---------------------------------------------------------------- configuration
def test_bad_environment_values_give_one_line(vllm_config, monkeypatch):
    from vllm_admission.plugin.config import AdmissionConfigError

    for var, value, valid in [("VLLM_ADMISSION_POLICY", "bogus", "none, last, vllm, marconi, dense"),
                              ("VLLM_ADMISSION_EVICTION", "belady", ", ".join(ENGINE_EVICTION_POLICIES)),
                              ("VLLM_ADMISSION_ALPHA", "-1", ">= 0")]:
        monkeypatch.setenv(var, value)
        with pytest.raises(AdmissionConfigError) as info:
            build(vllm_config, monkeypatch, policy=value if var.endswith("POLICY") else "vllm",
                  eviction=value if var.endswith("EVICTION") else "lru",
                  alpha=value if var.endswith("ALPHA") else None)
        msg = str(info.value)
        assert "\n" not in msg and var in msg and valid in msg
        monkeypatch.delenv(var)


def test_model_without_recurrent_layers_runs_stock(vllm_config, monkeypatch, caplog):
    from vllm.v1.core.kv_cache_coordinator import UnitaryKVCacheCoordinator

    caplog.set_level(logging.INFO, logger="vllm_admission")
    logger = logging.getLogger("vllm_admission")
    logger.addHandler(caplog.handler)
    try:
        engine = build(vllm_config, monkeypatch, policy="marconi", eviction="flop",
                       kinds=("attention",))
    finally:
        logger.removeHandler(caplog.handler)
    records = {id(r): r for r in caplog.records if r.name == "vllm_admission"}
    lines = [r.getMessage() for r in records.values()]
    assert len(lines) == 1 and "no recurrent" in lines[0] and "nothing for the plugin" in lines[0]
    sched = engine.scheduler
    assert type(sched.kv_cache_manager.coordinator) is UnitaryKVCacheCoordinator
    assert not sched.stats().active
    rid = engine.add(toks(1, 500), 3)
    engine.run()
    rid2 = engine.add(toks(1, 500), 3)
    engine.run()
    assert engine.cached_tokens[rid] == 0 and engine.cached_tokens[rid2] == 384


def test_an_unsupported_vllm_refuses_changes_and_runs_stock_otherwise(vllm_config, monkeypatch):
    """vllm_hooks' version gate: another release line than 0.32 gets one line and no patching."""
    from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue

    from vllm_admission.plugin import vllm_hooks
    from vllm_admission.plugin.scheduler import AdmissionScheduler

    monkeypatch.setattr(vllm_hooks, "installed_version", lambda: "0.34.0")
    with pytest.raises(vllm_hooks.UnsupportedVllmError) as info:
        build(vllm_config, monkeypatch, policy="marconi", eviction="lru")
    assert str(info.value) == (
        "vllm_admission supports vLLM 0.32.x and 0.33.x, found 0.34.0; the AdmissionScheduler "
        "refuses to change vLLM's caching on it (valid here: VLLM_ADMISSION_POLICY=vllm with "
        "VLLM_ADMISSION_EVICTION=lru)")
    engine = build(vllm_config, monkeypatch, policy="vllm", eviction="lru")
    sched = engine.scheduler
    assert isinstance(sched, AdmissionScheduler) and not sched.stats().active
    assert type(sched.kv_cache_manager.coordinator) is HybridKVCacheCoordinator
    assert type(sched.kv_cache_manager.block_pool.free_block_queue) is FreeKVCacheBlockQueue
    engine.add(toks(2, 500), 3)
    engine.run()
    assert free_equals_usable(engine)


@pytest.mark.parametrize("eviction, scoped", [("reuse", False), ("lfu", False), ("flop", True)])
def test_only_a_policy_that_reads_values_replaces_vllms_coordinator(vllm_config, monkeypatch,
                                                                     eviction, scoped):
    """Free scopes value a request's blocks; a policy without values keeps vLLM's
    coordinator (its blocks get the same time from the request clock), and both
    kinds free every block."""
    from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator

    from vllm_admission.plugin.free_queue import PolicyFreeBlockQueue
    from vllm_admission.plugin.kv_cache import AdmissionCoordinator

    engine = build(vllm_config, monkeypatch, policy="marconi", eviction=eviction,
                   alpha=0.5 if eviction == "flop" else None)
    sched = engine.scheduler
    assert sched._admission.reads_values is scoped   # noqa: SLF001
    assert type(sched.kv_cache_manager.coordinator) is (
        AdmissionCoordinator if scoped else HybridKVCacheCoordinator)
    assert type(sched.kv_cache_manager.block_pool.free_block_queue) is PolicyFreeBlockQueue
    for i in range(4):
        engine.add(toks(1, 400 + 100 * i), 3)
    engine.run()
    assert free_equals_usable(engine)
    assert sched.kv_cache_manager.block_pool.free_block_queue.num_cached_candidates > 0


def test_every_private_vllm_member_the_plugin_relies_on_exists():
    from vllm_admission.plugin import vllm_hooks

    assert vllm_hooks.check_version()  # the suite runs against the supported release
    assert vllm_hooks.check_version("0.32.3+cpu") and vllm_hooks.check_version("0.33.0")
    assert not vllm_hooks.check_version("0.34.0") and not vllm_hooks.check_version("0.31.2")
    assert vllm_hooks.missing_members() == []
    # Every override takes what the installed release passes (make compat: 0.33's).
    assert vllm_hooks.override_mismatches() == []


def test_an_override_that_cannot_take_vllms_arguments_is_reported(monkeypatch):
    """The 0.33 failure of issue 21: an override taking only ``request`` where vLLM passes
    ``(request, max_cache_hit_length)``; and one requiring what vLLM never passes."""
    from vllm_admission.plugin import vllm_hooks

    class Theirs:
        def hit(self, request, max_cache_hit_length=None): ...

    class Narrow:
        def hit(self, request): ...

    class Greedy:
        def hit(self, request, max_cache_hit_length=None, *, extra): ...

    class Open:
        def hit(self, request, *args, **kwargs): ...

    assert vllm_hooks._accepts(Theirs.hit, Narrow.hit) == [  # noqa: SLF001
        "positional 'max_cache_hit_length' (argument 2)"]
    assert vllm_hooks._accepts(Theirs.hit, Greedy.hit) == [  # noqa: SLF001
        "requires 'extra', which vLLM does not pass"]
    assert vllm_hooks._accepts(Theirs.hit, Open.hit) == []  # noqa: SLF001


def test_switching_policy_needs_an_idle_scheduler(vllm_config, monkeypatch):
    from vllm_admission.core.admission import UnknownPolicyError

    engine = build(vllm_config, monkeypatch, policy="vllm")
    engine.add(toks(1, 300), 3)
    with pytest.raises(RuntimeError):
        engine.scheduler.set_admission_policy("last")
    engine.run()
    engine.scheduler.set_admission_policy("last")
    assert engine.scheduler.stats().admission == "last"
    with pytest.raises(UnknownPolicyError):
        engine.scheduler.set_admission_policy("bogus")


# ---------------------------------------------------------------- alpha tuning
def test_alpha_is_tuned_online_after_the_first_evictions(vllm_config, monkeypatch):
    monkeypatch.setenv("VLLM_ADMISSION_TUNE_MULTIPLIER", "2")
    engine = build(vllm_config, monkeypatch, policy="marconi", eviction="flop", blocks=60)
    run_engine(engine, random_workload(3, n=30))
    ctl = engine.scheduler._admission  # noqa: SLF001
    assert ctl.tuner.drain(timeout=60)
    assert ctl.tuner.error is None
    events = ctl.tuner.events
    assert events and events[0]["kind"] == "bootstrap"
    # The first eviction fixes the window: 2 x the requests served before it.
    assert events[0]["window"] % 2 == 0
    engine.add(toks(5, 200), 2)
    engine.run()  # the scheduler applies the decision at its next step
    assert engine.scheduler.stats().alpha == events[-1]["alpha"]
    assert engine.scheduler.stats().tuning == events


# ---------------------------------------------------------------- auto: engine against core
def simulate_auto(requests, *, blocks, costs, admission=AUTO, interval=DEFAULT_INTERVAL):
    """The simulator's auto run (sim/simulator.py does the same on a trace)."""
    layout = CacheLayout(num_blocks=blocks, block_size=B, group_kinds=GROUPS,
                         bytes_per_block=BYTES_PER_BLOCK, chunk_size=CHUNK)
    admissions, evictions = candidate_policies(admission, AUTO)
    start = PolicyController.default_start(admissions, evictions)
    setup = CacheSetup(layout=layout, admission=start.admission, eviction=start.eviction,
                       segment_flops=costs.prefill_flops)
    cache = setup.build(switchable=True)
    ctl = PolicyController(cache, setup, admissions, evictions, prefill_flops=costs.prefill_flops,
                           min_window=interval)
    hits = []
    for r, (tokens, out_len) in enumerate(requests):
        out = cache.serve(chained(tokens), len(tokens), out_len, rid=r, now=float(r))
        hits.append(out.hit_tokens)
        ctl.observe(r, CacheRequest(chained(tokens), len(tokens), out_len))
    return hits, ctl


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


def test_auto_switches_like_the_simulator_request_for_request(vllm_config, monkeypatch, costs):
    """VLLM_ADMISSION_POLICY=auto and VLLM_ADMISSION_EVICTION=auto: the plugin's controller
    (shadow caches fed the finished requests) switches after the same requests as the
    simulator's, to the same pairs, and every request gets the simulator's hit."""
    reqs = random_workload(7, n=170)
    engine = build(vllm_config, monkeypatch, policy=AUTO, eviction=AUTO, blocks=60)
    ctl = engine.scheduler._admission
    assert not ctl.controller.in_process     # the shadows run in a child process
    hits = serve_deciding(engine, reqs)
    sim_hits, sim = simulate_auto(reqs, blocks=60, costs=costs)
    stats = engine.scheduler.stats()
    assert [d.as_dict() for d in sim.switches] == stats.policy_switches
    assert len(sim.decisions) >= 3 and sim.switches, "the workload should make auto switch"
    assert hits == sim_hits
    assert (stats.admission, stats.eviction) == (sim.pair.admission, sim.pair.eviction)
    assert stats.adaptive and "auto" in stats.summary()
    assert free_equals_usable(engine)


def test_auto_hands_reuse_the_history_the_engine_heard(vllm_config, monkeypatch, costs):
    """``vllm`` + ``auto``: the engine's block pool keeps the hash history under ``lru`` and
    ``lfu`` as the simulator's live cache does, so ``reuse`` switched in mid-run orders the
    free blocks as in the simulator, request for request. A cold hand-over (a fresh
    history) would give other hits on this workload: the test tells the two apart."""
    reqs = random_workload(2, n=170)
    monkeypatch.setenv("VLLM_ADMISSION_AUTO_INTERVAL", "25")
    engine = build(vllm_config, monkeypatch, policy="vllm", eviction=AUTO, blocks=60)
    hits = serve_deciding(engine, reqs)
    sim_hits, sim = simulate_auto(reqs, blocks=60, costs=costs, admission="vllm", interval=25)
    into_reuse = [d for d in sim.switches if d.after.eviction == "reuse" and d.before.eviction != "reuse"]
    assert into_reuse, "the workload should switch into reuse after another policy ran"
    assert [d.as_dict() for d in sim.switches] == engine.scheduler.stats().policy_switches
    assert hits == sim_hits
    with monkeypatch.context() as m:
        m.setattr(LiveEvictions, "make", lambda self, name, **o: get_eviction(name, **o))
        cold_hits, _ = simulate_auto(reqs, blocks=60, costs=costs, admission="vllm", interval=25)
    assert cold_hits != sim_hits
    assert free_equals_usable(engine)


def test_auto_switch_demotes_in_the_engine_what_the_simulator_demotes(vllm_config, monkeypatch, costs):
    """At a switch the engine's free queue hands over first the cached blocks whose hash
    the new pair's shadow (in the child process) does not hold, as the simulator's live
    cache does: request for request the same hits. Without the demotion the simulator
    gives other hits on this workload, so the test tells the two apart."""
    reqs = random_workload(3, n=170)
    engine = build(vllm_config, monkeypatch, policy=AUTO, eviction=AUTO, blocks=60)
    hits = serve_deciding(engine, reqs)
    sim_hits, sim = simulate_auto(reqs, blocks=60, costs=costs)
    assert sim.switches and all(d.held is not None for d in sim.switches)
    assert [d.as_dict() for d in sim.switches] == engine.scheduler.stats().policy_switches
    assert hits == sim_hits
    switch = HybridPrefixCache.switch
    with monkeypatch.context() as m:
        m.setattr(HybridPrefixCache, "switch",
                  lambda self, admission=None, eviction=None, held=None:
                  switch(self, admission=admission, eviction=eviction))
        kept_hits, _ = simulate_auto(reqs, blocks=60, costs=costs)
    assert kept_hits != sim_hits
    assert free_equals_usable(engine)


def test_auto_leaves_reuse_out_where_blocks_get_hashes_elsewhere(vllm_config, monkeypatch, caplog):
    """``reuse`` needs one key per full block; where the engine hashes blocks otherwise,
    a fixed ``reuse`` is refused in one line and ``auto`` runs without it, saying so."""
    import vllm_admission.plugin.scheduler as plugin_scheduler
    from vllm_admission.plugin.config import AdmissionConfigError

    seen = []
    real = plugin_scheduler.AdmissionControl

    def spy(**kwargs):
        seen.append(kwargs["adaptive"])
        return real(**kwargs)

    monkeypatch.setattr(plugin_scheduler, "AdmissionControl", spy)
    engine = build(vllm_config, monkeypatch, policy="vllm", eviction="auto")
    assert "reuse" in seen[-1][1]
    engine.scheduler.shutdown()
    monkeypatch.setattr(plugin_scheduler.AdmissionScheduler, "_admission_key_problems",
                        lambda self: ["partial hash hits"])
    with pytest.raises(AdmissionConfigError, match="partial hash hits"):
        build(vllm_config, monkeypatch, policy="vllm", eviction="reuse")
    caplog.set_level(logging.WARNING, logger="vllm_admission")
    logger = logging.getLogger("vllm_admission")
    logger.addHandler(caplog.handler)
    try:
        engine = build(vllm_config, monkeypatch, policy="vllm", eviction="auto")
    finally:
        logger.removeHandler(caplog.handler)
    assert set(seen[-1][1]) == set(AUTO_EVICTIONS) - {"reuse"}
    assert any("leaves out reuse" in r.getMessage() and "partial hash hits" in r.getMessage()
               for r in caplog.records)
    engine.scheduler.shutdown()
