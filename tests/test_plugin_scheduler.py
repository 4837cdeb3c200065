"""AdmissionScheduler inside vLLM's real scheduler, driven without a model.

``vllm_admission_testing.harness.FakeEngine`` runs vLLM 0.32's ``Scheduler``
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

import pytest
from junction_case import (
    expected_junction,
    expected_junction_prefill_steps,
    expected_junction_state_miss,
    junction_prompts,
)

pytest.importorskip("vllm")

from scheduler_harness import (  # noqa: E402
    AUTO,
    CHUNK,
    EVICTION_CASES,
    POLICIES,
    B,
    assert_counters_match,
    auto_in_engine_and_simulator,
    build,
    free_equals_usable,
    mamba_positions,
    plugin_lines,
    random_workload,
    run_engine,
    serve_deciding,
    simulate,
    simulate_auto,
    toks,
)
from sequence_case import expected_states, expected_superseded  # noqa: E402

from vllm_admission.core.adaptive import AUTO_EVICTIONS, LiveEvictions  # noqa: E402
from vllm_admission.core.admission import ADMISSION_POLICIES, get_admission  # noqa: E402
from vllm_admission.core.cache import HybridPrefixCache  # noqa: E402
from vllm_admission.core.eviction import ENGINE_EVICTION_POLICIES, get_eviction  # noqa: E402

# The harness's fixtures (model_dir, vllm_config, async_config, costs; tuners stopped
# after each test) are pytest's to inject.
pytest_plugins = ["scheduler_harness"]


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
    misses, sim_misses = [], []
    with PrefillStepCounter(engine.scheduler) as counter:
        hits = run_engine(engine, reqs, misses)
    assert hits == expected_junction(B)[policy]
    sim_steps = []
    assert simulate(policy, eviction, reqs, blocks=160, costs=costs, alpha=0.5,
                    steps=sim_steps, misses=sim_misses)[0] == hits
    # State misses (attention-KV hit minus hybrid hit), request by request.
    assert misses == sim_misses == expected_junction_state_miss(B)[policy]
    # Prefill steps (docs/engine-facts.md rule 6): the scheduler's and the core model's.
    assert list(counter.counts.values()) == expected_junction_prefill_steps(B)[policy]
    assert sim_steps == expected_junction_prefill_steps(B)[policy]
    stats = engine.scheduler.stats()
    assert stats.hit_tokens == sum(hits)
    assert stats.hit_requests == sum(h > 0 for h in hits)
    assert stats.requests == 10
    assert stats.prefill_steps == sum(expected_junction_prefill_steps(B)[policy])
    assert stats.state_miss_tokens == sum(misses)
    assert free_equals_usable(engine)


# ---------------------------------------------------------------- sequence-end states
# P = 1000, O = 300: prompt end floor(999 / 128) * 128 = 896; the sequence reaches token
# 1,299, so its last block boundary is floor(1299 / 128) * 128 = 1,280 (a decode boundary).
# tests/sequence_case.py derives the states for every registered policy; written out:
WRITTEN_OUT_STATES = {
    "none": [],
    "vllm": [896],
    "marconi": [1280],                       # the sequence end only
    "last": [896, 1024, 1152, 1280],         # prompt end + every decode boundary
    "dense": [128 * i for i in range(1, 8)] + [1024, 1152, 1280],
}


@pytest.mark.parametrize("policy", POLICIES)
def test_cached_states_per_policy(vllm_config, monkeypatch, costs, policy):
    states = expected_states(policy, 1000, 300, B)
    assert states == WRITTEN_OUT_STATES.get(policy, states)
    engine = build(vllm_config, monkeypatch, policy=policy)
    run_engine(engine, [(toks(4, 1000), 300)])
    assert mamba_positions(engine) == states
    _, cache = simulate(policy, "lru", [(toks(4, 1000), 300)], blocks=160, costs=costs)
    assert cache.state_checkpoints == len(states)
    assert engine.scheduler.stats().state_checkpoints == len(states)
    # marconi: 896, 1024 and 1152 were kept tentatively, then replaced
    assert engine.scheduler.stats().superseded == expected_superseded(policy, 1000, 300, B)
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
    misses, sim_misses = [], []
    hits = run_engine(engine, reqs, misses)
    sim_hits, cache = simulate(policy, eviction, reqs, blocks=60, costs=costs, alpha=alpha,
                               misses=sim_misses)
    assert hits == sim_hits
    assert misses == sim_misses
    assert sum(misses) > 0 or get_admission(policy).every_block  # dense keeps every block
    assert_counters_match(engine, cache)


def test_learned_trains_in_the_plugin_and_matches_the_core_model(vllm_config, monkeypatch, costs):
    """``learned`` with a schedule short enough to train several models on 120 requests:
    the plugin (whose fits run in a background thread) and the simulator make the same
    decisions, request by request, because the model serving each request is fixed by
    the requests before it."""
    from vllm_admission.core.eviction.learned import LearnedEviction

    built = []
    init = LearnedEviction.__init__

    def small(self, *args, **kwargs):
        kwargs.update(retrain_every=10, lag=3, min_samples=40, record=32)
        init(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(LearnedEviction, "__init__", small)
    reqs = random_workload(11, n=120)
    engine = build(vllm_config, monkeypatch, policy="vllm", eviction="learned", blocks=60)
    hits = run_engine(engine, reqs)
    sim_hits, cache = simulate("vllm", "learned", reqs, blocks=60, costs=costs)
    assert hits == sim_hits
    assert_counters_match(engine, cache)
    trained = [pol.schedule.trainings for pol in built]
    assert len(trained) >= 2 and min(trained) >= 3 and len(set(trained)) == 1
    assert all(any(p < 1.0 for p in pol._prob) for pol in built)   # the models ranked blocks


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
    # The plugin's counters count first admissions only, as vLLM's prefix-cache counters do.
    vllm_counts = engine.prefix_cache
    assert vllm_counts["preempted_requests"] > 0
    stats = sched.stats()
    assert (stats.requests, stats.prompt_tokens, stats.hit_tokens) == (
        vllm_counts["requests"], vllm_counts["queries"], vllm_counts["hits"]) == (
        9, 2600 + 8 * 700, sum(engine.cached_tokens.values()))
    assert all(len(r.output_token_ids) == 500 for r in reqs)
    assert victim not in engine.outputs or engine.outputs[victim].finish_reason is not None
    assert free_equals_usable(engine)
    assert not sched._admission.requests.tracks  # noqa: SLF001 - nothing left behind
    for _ in range(2):   # the second sees the first's blocks under any valid eviction order
        rid = engine.add(base + toks(99, 300), 5)
        engine.run()
    assert engine.cached_tokens[rid] >= (2 * B if get_admission(policy).every_block else 0)
    assert free_equals_usable(engine)


# ---------------------------------------------------------------- configuration
def test_bad_environment_values_give_one_line(vllm_config, monkeypatch):
    from vllm_admission.plugin.env import SettingsError

    for var, value, valid in [("VLLM_ADMISSION_POLICY", "bogus", ", ".join(ADMISSION_POLICIES)),
                              ("VLLM_ADMISSION_EVICTION", "belady", ", ".join(ENGINE_EVICTION_POLICIES)),
                              ("VLLM_ADMISSION_ALPHA", "-1", ">= 0")]:
        monkeypatch.setenv(var, value)
        with pytest.raises(SettingsError) as info:
            build(vllm_config, monkeypatch, policy=value if var.endswith("POLICY") else "vllm",
                  eviction=value if var.endswith("EVICTION") else "lru",
                  alpha=value if var.endswith("ALPHA") else None)
        msg = str(info.value)
        assert "\n" not in msg and var in msg and valid in msg
        monkeypatch.delenv(var)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_settings_given_as_an_object_win_over_the_environment(vllm_config, async_config,
                                                               monkeypatch, asynchronous):
    """``AdmissionScheduler.configured(config)`` (what ``build_llm`` passes to an in-process
    engine core): the scheduler runs with the object and reads no ``VLLM_ADMISSION_*``
    variable; the async variant vLLM's async scheduling picks keeps it."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from vllm_admission.plugin.env import Settings
    from vllm_admission.plugin.scheduler import AdmissionScheduler
    from vllm_admission_testing.harness import make_kv_cache_config, make_scheduler

    cfg = async_config if asynchronous else vllm_config
    monkeypatch.setenv("VLLM_ADMISSION_POLICY", "bogus")       # would refuse to start
    config = Settings(admission="marconi", eviction="flop", alpha=0.25, log_interval=0)
    cls = AdmissionScheduler.configured(config)
    sched = make_scheduler(cls, cfg, make_kv_cache_config(cfg, 80))
    try:
        assert sched.admission_config is config
        assert isinstance(sched, AsyncScheduler) is asynchronous
        assert type(sched).__name__ == ("AsyncAdmissionScheduler" if asynchronous
                                        else "AdmissionScheduler")
        stats = sched.stats()
        assert (stats.admission, stats.eviction, stats.alpha) == ("marconi", "flop", 0.25)
    finally:
        sched.shutdown()


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


def test_an_unsupported_vllm_refuses_changes_and_runs_truly_stock_otherwise(vllm_config,
                                                                           monkeypatch, caplog):
    """surface.py's version gate: a release line outside 0.32/0.33 gets one line, and with
    vLLM's own settings the scheduler built is vLLM's own class, so no override of the
    plugin's runs (0.33's new ``_get_local_prefix_cache_hit`` argument broke exactly that)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_admission.plugin.boundary import surface

    monkeypatch.setattr(surface, "installed_version", lambda: "0.34.0")
    with pytest.raises(surface.UnsupportedVllmError) as info:
        build(vllm_config, monkeypatch, policy="marconi", eviction="lru")
    assert str(info.value) == (
        "vllm_admission supports vLLM 0.32.x and 0.33.x, found 0.34.0; the AdmissionScheduler "
        "refuses to change vLLM's caching on it (valid here: VLLM_ADMISSION_POLICY=vllm with "
        "VLLM_ADMISSION_EVICTION=lru)")
    with caplog.at_level(logging.INFO, logger="vllm_admission"):
        engine = build(vllm_config, monkeypatch, policy="vllm", eviction="lru")
    sched = engine.scheduler
    assert type(sched) is Scheduler
    assert "found 0.34.0; AdmissionScheduler builds vLLM's own Scheduler instead" in caplog.text
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
    from vllm_admission.plugin.boundary import surface

    assert surface.check_version()  # the suite runs against a supported release
    assert surface.check_version("0.32.3+cpu") and surface.check_version("0.33.0")
    assert not surface.check_version("0.34.0") and not surface.check_version("0.31.9")
    assert surface.missing_members() == []
    # Every override takes what the installed release passes (make compat: 0.33's).
    assert surface.override_mismatches() == []


def test_every_instance_member_the_plugin_relies_on_exists(vllm_config, monkeypatch):
    """The instance attributes of ``PRIVATE_MEMBERS`` (``missing_members`` checks class
    members only), on a live scheduler in ``inpass`` mode (every hook installed)."""
    import vllm.envs
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager

    from vllm_admission.plugin.boundary import surface

    engine = build(vllm_config, monkeypatch, policy="dense", eviction="flop", alpha=0.0,
                   checkpoint="inpass")
    coordinator = engine.scheduler.kv_cache_manager.coordinator
    present = {
        "HybridKVCacheCoordinator.single_type_managers": coordinator.single_type_managers,
        "BlockPool.free_block_queue": coordinator.block_pool.free_block_queue,
        "BlockHashToBlockMap._cache": coordinator.block_pool.cached_block_hash_to_block._cache,
        "environment_variables": vllm.envs.environment_variables,
        "MambaManager.req_to_blocks": [m.req_to_blocks for m in coordinator.single_type_managers
                                       if isinstance(m, MambaManager)],
    }
    engine_side = {"LLMEngine.engine_core", "InprocClient.engine_core", "EngineCore.scheduler"}
    # Read on a live OffloadingConnector: tests/test_offload_engine.py (host_tier).
    connector_side = {"OffloadingConnector.connector_scheduler", "CPUOffloadingManager._num_chunks"}
    assert set(present) | engine_side | connector_side == set(surface._INSTANCE_ATTRIBUTES)  # noqa: SLF001
    assert all(v is not None for v in present.values()) and present["MambaManager.req_to_blocks"]


def test_an_override_that_cannot_take_vllms_arguments_is_reported(monkeypatch):
    """The 0.33 failure of issue 21: an override taking only ``request`` where vLLM passes
    ``(request, max_cache_hit_length)``; and one requiring what vLLM never passes."""
    from vllm_admission.plugin.boundary import surface

    class Theirs:
        def hit(self, request, max_cache_hit_length=None): ...

    class Narrow:
        def hit(self, request): ...

    class Greedy:
        def hit(self, request, max_cache_hit_length=None, *, extra): ...

    class Open:
        def hit(self, request, *args, **kwargs): ...

    assert surface.accepts(Theirs.hit, Narrow.hit) == [
        "positional 'max_cache_hit_length' (argument 2)"]
    assert surface.accepts(Theirs.hit, Greedy.hit) == [
        "requires 'extra', which vLLM does not pass"]
    assert surface.accepts(Theirs.hit, Open.hit) == []


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
    assert ctl.background.tuner.drain(timeout=60)
    assert ctl.background.tuner.error is None
    events = ctl.background.tuner.events
    assert events and events[0]["kind"] == "bootstrap"
    # The first eviction fixes the window: 2 x the requests served before it.
    assert events[0]["window"] % 2 == 0
    engine.add(toks(5, 200), 2)
    engine.run()  # the scheduler applies the decision at its next step
    assert engine.scheduler.stats().alpha == events[-1]["alpha"]
    assert engine.scheduler.stats().tuning == events


# ---------------------------------------------------------------- auto: engine against core
def test_auto_switches_like_the_simulator_request_for_request(vllm_config, monkeypatch, costs):
    """VLLM_ADMISSION_POLICY=auto and VLLM_ADMISSION_EVICTION=auto: the plugin's controller
    (shadow caches fed the finished requests) switches after the same requests as the
    simulator's, to the same pairs, and every request gets the simulator's hit."""
    reqs = random_workload(7, n=170)
    engine, hits, sim_hits, sim = auto_in_engine_and_simulator(vllm_config, monkeypatch, costs, reqs)
    ctl = engine.scheduler._admission
    assert not ctl.background.controller.in_process     # the shadows run in a child process
    stats = engine.scheduler.stats()
    assert [d.as_dict() for d in sim.switches] == stats.policy_switches
    assert len(sim.decisions) >= 3 and sim.switches, "the workload should make auto switch"
    assert hits == sim_hits
    assert (stats.admission, stats.eviction) == (sim.pair.admission, sim.pair.eviction)
    assert stats.adaptive and "auto" in stats.summary()
    assert free_equals_usable(engine)


def test_sampled_shadows_in_the_engine_decide_as_in_the_simulator(vllm_config, monkeypatch, costs):
    """VLLM_ADMISSION_SHADOW_RATE=0.5: the engine's shadow process samples the same requests
    as the simulator's controller, although it sees vLLM's block hashes and the simulator
    its own keys (the sample is keyed by request order, core/sampling.py), so both switch
    alike and every request gets the simulator's hit."""
    reqs = random_workload(7, n=170)
    engine, hits, sim_hits, sim = auto_in_engine_and_simulator(
        vllm_config, monkeypatch, costs, reqs, interval=25, shadow_rate=0.5)
    assert sim.rate == 0.5 and 0 < sim.sampler.kept < len(reqs)
    assert [d.as_dict() for d in sim.switches] == engine.scheduler.stats().policy_switches
    assert sim.switches and any(d.error > 0 for d in sim.decisions)
    assert hits == sim_hits


def test_a_margin_over_stock_in_the_engine_decides_as_in_the_simulator(vllm_config, monkeypatch, costs):
    """VLLM_ADMISSION_AUTO_MARGIN=0.2 reaches the engine's controller: it switches where the
    simulator's controller with the same margin does (later than without one, on this
    workload), and every request gets the simulator's hit."""
    reqs = random_workload(2, n=170)
    engine, hits, sim_hits, sim = auto_in_engine_and_simulator(
        vllm_config, monkeypatch, costs, reqs, interval=25, margin=0.2)
    _, free = simulate_auto(reqs, blocks=60, costs=costs, interval=25)
    assert sim.switches and [d.at for d in sim.switches] != [d.at for d in free.switches]
    assert [d.as_dict() for d in sim.switches] == engine.scheduler.stats().policy_switches
    assert hits == sim_hits


def test_auto_among_named_admissions_in_the_engine_decides_as_in_the_simulator(
        vllm_config, monkeypatch, costs):
    """VLLM_ADMISSION_AUTO_ADMISSIONS reaches the engine's controller: with ``written``
    among the candidates (no candidate by default) and a margin over stock, the engine
    switches where the simulator's controller does, and every request gets its hit."""
    reqs = random_workload(2, n=170)
    named = ("vllm", "last", "marconi", "dense", "written")
    engine, hits, sim_hits, sim = auto_in_engine_and_simulator(
        vllm_config, monkeypatch, costs, reqs, interval=25, margin=0.2, auto_admissions=named)
    assert sim.switches
    assert {p.admission for p in sim.pairs} == set(named)
    assert [d.as_dict() for d in sim.switches] == engine.scheduler.stats().policy_switches
    assert hits == sim_hits
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
    engine, hits, sim_hits, sim = auto_in_engine_and_simulator(vllm_config, monkeypatch, costs, reqs)
    assert sim.switches
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
    from vllm_admission.plugin.env import SettingsError

    seen = []
    real = plugin_scheduler.AdmissionControl

    def spy(**kwargs):
        seen.append(kwargs["plan"].evictions)
        return real(**kwargs)

    monkeypatch.setattr(plugin_scheduler, "AdmissionControl", spy)
    engine = build(vllm_config, monkeypatch, policy="vllm", eviction="auto")
    assert "reuse" in seen[-1]
    engine.scheduler.shutdown()
    monkeypatch.setattr(plugin_scheduler.AdmissionScheduler, "_admission_key_problems",
                        lambda self: ["KV cache groups of different block sizes"])
    with pytest.raises(SettingsError, match="KV cache groups of different block sizes"):
        build(vllm_config, monkeypatch, policy="vllm", eviction="reuse")
    caplog.set_level(logging.WARNING, logger="vllm_admission")
    logger = logging.getLogger("vllm_admission")
    logger.addHandler(caplog.handler)
    try:
        engine = build(vllm_config, monkeypatch, policy="vllm", eviction="auto")
    finally:
        logger.removeHandler(caplog.handler)
    assert set(seen[-1]) == set(AUTO_EVICTIONS) - {"reuse"}
    assert any("leaves out reuse" in r.getMessage()
               and "KV cache groups of different block sizes" in r.getMessage()
               for r in caplog.records)
    engine.scheduler.shutdown()


# ---------------------------------------------------------------- what users trip over (issue 21)
def test_start_up_names_the_smallest_cacheable_prefix(vllm_config, monkeypatch, caplog):
    """The start-up line gives the shortest prefix that can hit, per KV cache group, and it is
    the truth: a prompt one token longer than it hits it when sent again, a prompt as long as
    it never hits (vLLM recomputes the last prompt token, so the state at the block boundary
    is never reached by a prompt of exactly one block)."""
    engine, lines = plugin_lines(caplog, lambda: build(vllm_config, monkeypatch))
    block = vllm_config.cache_config.block_size
    assert (logging.INFO,
            f"vllm_admission: smallest cacheable prefix: {block} tokens (per KV cache group: "
            f"state0={block} attention1={block}; a hit ends where every group can reuse a "
            f"block), so only prompts of {block + 1} tokens or more can hit (vLLM recomputes "
            f"at least the last prompt token)") in lines
    assert not [m for level, m in lines if level >= logging.WARNING]  # 4 * 129 < 8192
    hits = run_engine(engine, [(toks(3, block), 2), (toks(3, block), 2),
                               (toks(4, block + 1), 2), (toks(4, block + 1), 2)])
    assert hits == [0, 0, 0, block]


def test_start_up_warns_when_short_prompts_can_never_hit(model_dir, monkeypatch, caplog):
    from vllm_admission_testing.harness import make_vllm_config

    cfg = make_vllm_config(model_dir, block_size=B, max_model_len=4 * B,
                           max_num_batched_tokens=CHUNK)
    _, lines = plugin_lines(caplog, lambda: build(cfg, monkeypatch))
    assert (logging.WARNING,
            f"vllm_admission: prompts shorter than {B + 1} tokens never hit the prefix cache, "
            f"more than a quarter of max_model_len={4 * B}") in lines


@pytest.fixture(scope="module")
def connector_config(model_dir, tmp_path_factory):
    """The module's engine configuration plus a KV connector that supports hybrid models
    (vLLM's ``DecodeBenchConnector``; any connector makes the scheduler build one)."""
    from vllm.config import KVTransferConfig

    from vllm_admission_testing.harness import make_vllm_config

    cfg = make_vllm_config(model_dir, block_size=B, max_model_len=8192,
                           max_num_batched_tokens=CHUNK)
    cfg.kv_transfer_config = KVTransferConfig(kv_connector="DecodeBenchConnector",
                                              kv_role="kv_both")
    return cfg


def test_auto_under_a_kv_connector_runs_every_candidate(connector_config, monkeypatch, caplog):
    """``auto`` under a KV connector keeps every candidate pair and switches through the
    plugin's free queue, which a connector walking vLLM's free queue then walks
    (``iter_blocks_after``, in eviction order: ``test_plugin_connectors.py``); nothing is
    left out, nothing is said."""
    from vllm_admission.core.adaptive import AUTO_ADMISSIONS

    engine, lines = plugin_lines(caplog, lambda: build(connector_config, monkeypatch,
                                                        policy="auto", eviction="auto"))
    sched = engine.scheduler
    assert sched.connector is not None
    assert sched.stats().adaptive
    assert set(sched._admission.plan.admissions) == set(AUTO_ADMISSIONS)  # noqa: SLF001
    assert set(sched._admission.plan.evictions) == set(AUTO_EVICTIONS)  # noqa: SLF001
    assert not [m for level, m in lines if level == logging.WARNING]
    assert type(sched.kv_cache_manager.block_pool.free_block_queue).__name__ == \
        "PolicyFreeBlockQueue"
