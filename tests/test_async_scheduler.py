"""The AdmissionScheduler under vLLM's async scheduling (the GPU default), without a model.

On a GPU engine ``scheduler_config.async_scheduling`` is on and ``EngineCore`` keeps two
batches in flight (``step_with_batch_queue``); vLLM's CPU platform turns it off, so no
engine test here can see it. These tests build the configuration a GPU engine gets
(``make_vllm_config(async_scheduling=True)``) and drive the scheduler with
``FakeEngine``'s queue of two batches, exactly as ``EngineCore`` does.

The reference is the synchronous plugin (``test_plugin_scheduler.py``), itself checked
against the core's cache model: requests served one after another get the same hits,
evictions and checkpoints, for every admission x eviction pair, ``auto``, and both
checkpoint modes. With requests overlapping, async scheduling changes when blocks are
freed and when decode blocks get their hashes (at output time, minus the placeholders
in flight: ``AsyncScheduler._update_request_with_output``), so hits may differ from the
synchronous run for stock vLLM too; there the reference is vLLM's own
``AsyncScheduler`` (``vllm`` + ``lru`` must be identical to it block for block) and, for
every pair, no leaked block after preemptions and aborts with a step in flight.
"""

from __future__ import annotations

import pytest
from scheduler_harness import (
    AUTO,
    EVICTION_CASES,
    POLICIES,
    B,
    assert_counters_match,
    build,
    free_equals_usable,
    mamba_positions,
    random_workload,
    run_engine,
    serve_deciding,
    simulate,
    simulate_auto,
    toks,
)

pytest.importorskip("vllm")

from vllm_admission.core.eviction import ENGINE_EVICTION_POLICIES  # noqa: E402

# The harness's fixtures (model_dir, vllm_config, async_config, costs; tuners stopped
# after each test) are pytest's to inject.
pytest_plugins = ["scheduler_harness"]


def waves(engine, requests, size=4):
    """Serve ``requests`` in waves of ``size`` that overlap (each wave is added at once and
    runs to the end); returns each request's cached tokens."""
    ids = []
    for i in range(0, len(requests), size):
        ids += [engine.add(tokens, out_len) for tokens, out_len in requests[i:i + size]]
        engine.run()
    return [engine.cached_tokens[r] for r in ids]


# ---------------------------------------------------------------- the class vLLM builds
def test_async_scheduling_builds_the_async_variant(vllm_config, async_config, monkeypatch):
    """The user names ``vllm_admission.AdmissionScheduler`` in both cases; vLLM resolves it
    (``SchedulerConfig.get_scheduler_cls``) and the class picks vLLM's async base itself."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from vllm_admission.plugin.scheduler import AdmissionScheduler, AsyncAdmissionScheduler

    for cfg, is_async in ((async_config, True), (vllm_config, False)):
        cfg.scheduler_config.scheduler_cls = "vllm_admission.AdmissionScheduler"
        try:
            cls = cfg.scheduler_config.get_scheduler_cls()
        finally:
            cfg.scheduler_config.scheduler_cls = None
        assert cls is AdmissionScheduler
        engine = build(cfg, monkeypatch, policy="marconi", cls=cls)
        sched = engine.scheduler
        assert isinstance(sched, AdmissionScheduler)
        assert isinstance(sched, AsyncScheduler) is is_async
        assert (type(sched) is AsyncAdmissionScheduler) is is_async
        assert engine.batch_queue == (2 if is_async else 1)


@pytest.mark.parametrize("policy", POLICIES)
def test_decode_batches_stay_whole_as_with_vllms_async_scheduler(vllm_config, async_config,
                                                                 monkeypatch, policy):
    """Four 300-token prompts with 20 output tokens each, under the two-batch queue: every
    engine step of the plugin runs a forward pass but the last two, and it runs the
    synchronous plugin's passes. A plain ``Scheduler`` subclass (the plugin before async
    support; vLLM's own here) adds no output placeholders, so a request with a step in
    flight cannot be scheduled: every other step is empty and each token takes two engine
    steps (42 steps against ``AsyncScheduler``'s 23 for 21 passes)."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    def serve(cfg, cls=None):
        engine = build(cfg, monkeypatch, policy=policy, cls=cls)
        rids = [engine.add(toks(100 + i, 300), 20) for i in range(4)]
        engine.run()
        assert all(len(engine.outputs[r].new_token_ids) >= 1 for r in rids)
        assert free_equals_usable(engine)
        return engine.steps, engine.forward_passes

    steps, passes = serve(async_config)
    assert passes == serve(vllm_config)[1]
    assert steps == passes + 2
    stock_steps, stock_passes = serve(async_config, AsyncScheduler)
    assert stock_steps == stock_passes + 2
    half_steps, half_passes = serve(async_config, Scheduler)
    assert half_passes == stock_passes and half_steps >= 2 * stock_passes


@pytest.mark.parametrize("eviction,alpha", EVICTION_CASES)
@pytest.mark.parametrize("policy", POLICIES)
def test_requests_one_after_another_get_the_simulators_hits(async_config, monkeypatch, costs,
                                                            policy, eviction, alpha):
    """Same requests, one at a time, in a 60-block pool with many evictions: under async
    scheduling every request gets the hit of the core model run with
    ``async_scheduling=True``, with its evictions per KV cache group, checkpoints and
    junctions, and no block leaks. vLLM retires a request's old state blocks on processed
    tokens only (``allocate_slots``: ``remove_skipped_blocks(num_computed -
    num_in_flight)``, v1/core/kv_cache_manager.py), so a retired state block returns to the
    pool a step later than with synchronous scheduling; the model does the same. Every
    registered eviction policy runs here, one from another package included
    (``test_policy_plugins.py``). (``marconi`` also depends on ``AsyncAdmissionScheduler``
    dropping a superseded tentative state before the next step allocates.)"""
    reqs = random_workload(11)
    engine = build(async_config, monkeypatch, policy=policy, eviction=eviction, alpha=alpha,
                   blocks=60)
    hits = run_engine(engine, reqs)
    sim_hits, cache = simulate(policy, eviction, reqs, blocks=60, costs=costs, alpha=alpha,
                               async_scheduling=True)
    assert hits == sim_hits
    assert_counters_match(engine, cache)


def test_the_step_late_retirement_changes_what_is_cached(vllm_config, async_config,
                                                          monkeypatch, costs):
    """Why the model needs the setting: on this workload ``marconi`` + ``flop`` at alpha
    0.7 is served differently under async scheduling than synchronously (the retired block
    takes another place in the eviction order), so the synchronous model would mispredict
    the async engine."""
    reqs = random_workload(11)
    runs = {}
    for name, cfg in (("sync", vllm_config), ("async", async_config)):
        engine = build(cfg, monkeypatch, policy="marconi", eviction="flop", alpha=0.7,
                       blocks=60)
        runs[name] = run_engine(engine, reqs)
    sync_model = simulate("marconi", "flop", reqs, blocks=60, costs=costs, alpha=0.7)[0]
    assert runs["sync"] == sync_model
    assert runs["async"] != sync_model


@pytest.mark.parametrize("policy", POLICIES)
def test_inpass_checkpoints_under_async_scheduling(vllm_config, async_config, monkeypatch,
                                                   policy):
    """``VLLM_ADMISSION_CHECKPOINT=inpass``: the same hits and the same forward passes per
    request as the synchronous in-pass run, and each step carries its own checkpoint plan
    (two plans are in flight at once)."""
    from vllm_admission.plugin.boundary.hooks import step_checkpoints_of

    reqs = random_workload(3, n=20)
    runs = []
    for cfg in (vllm_config, async_config):
        engine = build(cfg, monkeypatch, policy=policy, blocks=60, checkpoint="inpass")
        passes, hits, plans = [], [], 0
        for tokens, out_len in reqs:
            before = engine.forward_passes
            rid = engine.add(tokens, out_len)
            while engine.busy():
                engine.step()
                plans += bool(step_checkpoints_of(engine.last_output))
            hits.append(engine.cached_tokens[rid])
            passes.append(engine.forward_passes - before)
        assert free_equals_usable(engine)
        runs.append((hits, passes, plans, mamba_positions(engine)))
    assert runs[1] == runs[0]


def test_auto_switches_like_the_simulator_under_async_scheduling(async_config, monkeypatch,
                                                                costs):
    """``auto`` + ``auto`` with a batch in flight: the switches (request, pairs, scores) and
    every request's hit equal the simulator's, as in the synchronous test."""
    reqs = random_workload(7, n=170)
    engine = build(async_config, monkeypatch, policy=AUTO, eviction=AUTO, blocks=60)
    hits = serve_deciding(engine, reqs)
    sim_hits, sim = simulate_auto(reqs, blocks=60, costs=costs)
    stats = engine.scheduler.stats()
    assert sim.switches and [d.as_dict() for d in sim.switches] == stats.policy_switches
    assert hits == sim_hits
    assert free_equals_usable(engine)


# ---------------------------------------------------------------- overlapping requests
def test_stock_policy_is_vllms_async_scheduler_block_for_block(async_config, monkeypatch):
    """``vllm`` + ``lru`` with overlapping requests under pressure: the same block ids handed
    out, the same hits, free-queue order and cached states as vLLM's ``AsyncScheduler``."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    reqs = random_workload(5)
    runs = []
    for cls in (AsyncScheduler, None):
        engine = build(async_config, monkeypatch, blocks=60, cls=cls)
        sched = engine.scheduler
        block_ids, hits = [], []
        for i in range(0, len(reqs), 4):
            ids = [engine.add(t, o) for t, o in reqs[i:i + 4]]
            while engine.busy():
                engine.step()
                out = engine.last_output
                block_ids.extend(new.block_ids for new in out.scheduled_new_reqs)
                block_ids.append(out.scheduled_cached_reqs.new_block_ids)
            hits += [engine.cached_tokens[r] for r in ids]
        queue = sched.kv_cache_manager.block_pool.free_block_queue
        runs.append((block_ids, hits, [b.block_id for b in queue.get_all_free_blocks()],
                     mamba_positions(engine), engine.forward_passes))
    assert runs[0] == runs[1]
    assert sum(runs[0][1]) > 0


@pytest.mark.parametrize("checkpoint", ["split", "inpass"])
@pytest.mark.parametrize("eviction", ENGINE_EVICTION_POLICIES)
@pytest.mark.parametrize("policy", POLICIES)
def test_preemption_and_abort_with_a_step_in_flight_leak_nothing(async_config, monkeypatch,
                                                                 policy, eviction, checkpoint):
    """A request is aborted mid-prefill while its next chunk is already in flight; then
    eight concurrent requests overflow a 64-block pool while decoding, so vLLM preempts some
    of them with output in flight. Every other request finishes with all its tokens, every
    block comes back (in-pass checkpoint blocks included), nothing of the plugin's per-request
    state is left, and the scheduler keeps serving with prefix hits."""
    engine = build(async_config, monkeypatch, policy=policy, eviction=eviction, blocks=64,
                   checkpoint=checkpoint)
    sched = engine.scheduler
    victim = engine.add(toks(77, 2600), 10)
    budget, sched.max_num_scheduled_tokens = sched.max_num_scheduled_tokens, 1024
    engine.step()
    engine.step()        # the next chunk is scheduled before the first one's output
    sched.max_num_scheduled_tokens = budget
    assert 0 < sched.requests[victim].num_computed_tokens < 2600
    assert engine.busy() and victim in engine.last_output.num_scheduled_tokens
    engine.abort(victim)
    base = toks(9, 300)
    rids = [engine.add(base + toks(50 + i, 400), 500) for i in range(8)]
    reqs = [sched.requests[r] for r in rids]
    engine.run()
    assert sum(r.num_preemptions for r in reqs) > 0
    assert all(len(r.output_token_ids) == 500 for r in reqs)
    assert all(r.num_output_placeholders == 0 for r in reqs)
    assert free_equals_usable(engine)
    assert not sched._admission.requests.tracks  # noqa: SLF001 - nothing left behind
    for _ in range(2):   # the second sees the first's blocks under any eviction order
        rid = engine.add(base + toks(99, 300), 5)
        engine.run()
    assert engine.cached_tokens[rid] >= (2 * B if policy == "dense" else 0)
    assert free_equals_usable(engine)


@pytest.mark.parametrize("eviction", ENGINE_EVICTION_POLICIES)
@pytest.mark.parametrize("policy", POLICIES)
def test_overlapping_waves_leak_nothing_and_count_every_hit(async_config, monkeypatch, policy,
                                                            eviction):
    """Random requests in overlapping waves of four under eviction pressure: every request
    finishes, no block leaks, and the plugin's token counters agree with what vLLM reported
    per request (``num_cached_tokens``)."""
    reqs = random_workload(13)
    engine = build(async_config, monkeypatch, policy=policy, eviction=eviction, blocks=60)
    hits = waves(engine, reqs)
    stats = engine.scheduler.stats()
    assert free_equals_usable(engine)
    assert stats.requests >= len(reqs)
    assert stats.hit_tokens >= sum(hits)   # a request admitted again counts again
    assert sum(stats.evictions_by_group.values()) > 0
