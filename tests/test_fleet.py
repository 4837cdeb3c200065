"""Routing policies and the fleet simulator (issue 64): replicas of the cache behind a router."""

from __future__ import annotations

import json

import pytest

from vllm_admission.cli import main
from vllm_admission.core.costs import load_model
from vllm_admission.core.errors import UserError
from vllm_admission.core.registry import UnknownPolicyError
from vllm_admission.core.routing import (
    ROUTERS,
    ReplicaView,
    Router,
    RouteRequest,
    get_router,
    register_router,
)
from vllm_admission.core.traces import SyntheticConfig, generate
from vllm_admission.sim.fleet import FleetSettings, simulate_fleet
from vllm_admission.sim.simulation_settings import SimulationSettings
from vllm_admission.sim.simulator import simulate

B = 16


@pytest.fixture(scope="module")
def qwen():
    return load_model("qwen3-next-80b-a3b")


@pytest.fixture(scope="module")
def trace():
    return generate(SyntheticConfig(num_requests=300), 3)


def test_the_built_in_routers_are_registered_in_order():
    assert list(ROUTERS)[:4] == ["round_robin", "least_loaded", "kv_prefix", "hybrid"]


def test_hybrid_routing_goes_where_the_state_is_and_kv_routing_where_the_kv_is():
    """The issue's example: a replica holding 30 KV blocks of the prompt but no state past
    block 4 gives a 4-block hit; one holding 12 blocks with a state at block 12 gives 12."""
    req = RouteRequest(index=0, prompt_len=40 * B, output_len=10, block_size=B)
    replicas = [ReplicaView(0, kv_hit=30 * B, hybrid_hit=4 * B, active_blocks=0),
                ReplicaView(1, kv_hit=12 * B, hybrid_hit=12 * B, active_blocks=0)]
    assert get_router("kv_prefix").choose(req, replicas) == 0
    assert get_router("hybrid").choose(req, replicas) == 1


def test_the_cost_weighs_prefill_against_blocks_in_flight():
    req = RouteRequest(index=0, prompt_len=20 * B, output_len=1, block_size=B)
    busy = ReplicaView(0, kv_hit=10 * B, hybrid_hit=10 * B, active_blocks=50)
    idle = ReplicaView(1, kv_hit=0, hybrid_hit=0, active_blocks=0)
    hybrid = get_router("hybrid")
    assert hybrid.choose(req, [busy, idle]) == 1          # 10 blocks saved < 50 in flight
    assert get_router("hybrid", overlap_weight=10.0).choose(req, [busy, idle]) == 0
    assert get_router("least_loaded").choose(req, [busy, idle]) == 1
    rr = get_router("round_robin")
    assert [rr.choose(req, [busy, idle]) for _ in range(4)] == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="overlap_weight"):
        get_router("kv_prefix", overlap_weight=-1.0)


def test_an_unknown_router_lists_the_valid_ones():
    with pytest.raises(UnknownPolicyError, match="valid: round_robin, least_loaded, kv_prefix, hybrid"):
        get_router("nearest")


def test_one_replica_is_the_single_cache_simulator(qwen, trace):
    """With one replica every router sends every request to it: the fleet replay is
    :func:`simulate`'s, hit for hit, for a fixed pair, the tuned ``flop`` and ``auto``."""
    for admission, eviction in (("vllm", "lru"), ("marconi", "flop"), ("auto", "auto")):
        st = SimulationSettings.of(admission, eviction, capacity_bytes=2 << 30)
        single = simulate(trace, qwen, st)
        for router in ("round_robin", "hybrid"):
            fleet = simulate_fleet(trace, qwen, st, FleetSettings(1, router))
            assert (fleet.hit_tokens, fleet.prompt_tokens, fleet.requests) == \
                (single.hit_tokens, single.prompt_tokens, single.requests), (admission, router)


def test_the_router_sees_exactly_the_hit_each_replica_then_gives(qwen, trace):
    """The hybrid hit a router is shown for the chosen replica is what that replica's cache
    then serves (the lookup is the cache's own); the attention-KV hit is never below it."""
    st = SimulationSettings.of("vllm", "lru", capacity_bytes=1 << 30)
    for router in ROUTERS:
        res = simulate_fleet(trace, qwen, st, FleetSettings(3, router))
        assert res.routed_hybrid_hit == res.hit_tokens
        assert res.routed_kv_hit >= res.routed_hybrid_hit
        assert sum(r["requests"] for r in res.per_replica) == res.requests == 300
        assert sum(r["hit_tokens"] for r in res.per_replica) == res.hit_tokens
        assert res.load_spread >= 1.0 and 0 < res.ttft_p50_s <= res.ttft_p99_s


def test_prefix_routing_beats_blind_routing_and_round_robin_is_even(qwen, trace):
    st = SimulationSettings.of("vllm", "lru", capacity_bytes=2 << 30)
    rate = {r: simulate_fleet(trace, qwen, st, FleetSettings(4, r)) for r in ROUTERS}
    assert rate["hybrid"].token_hit_rate > rate["round_robin"].token_hit_rate
    assert rate["kv_prefix"].token_hit_rate > rate["round_robin"].token_hit_rate
    counts = [r["requests"] for r in rate["round_robin"].per_replica]
    assert max(counts) - min(counts) <= 1


def test_another_package_registers_a_router(qwen, trace):
    class AlwaysFirst(Router):
        name = "always_first_test"
        summary = "every request to replica 0"

        def choose(self, request, replicas):
            return replicas[0].index

    register_router(AlwaysFirst)
    try:
        res = simulate_fleet(trace, qwen, SimulationSettings.of("vllm", "lru", capacity_bytes=1 << 30),
                             FleetSettings(3, "always_first_test"))
        assert [r["requests"] for r in res.per_replica] == [300, 0, 0]
    finally:
        ROUTERS._classes.pop("always_first_test")


@pytest.mark.parametrize("fleet, message", [
    (FleetSettings(0, "hybrid"), "at least 1 replica"),
    (FleetSettings(2, "hybrid", prefill_flops_per_s=0.0), "prefill throughput must be > 0"),
    (FleetSettings(2, "hybrid", decode_s_per_token=-1.0), "decode time per token"),
    (FleetSettings(2, "hybrid", arrival_scale=float("nan")), "arrival scale"),
])
def test_bad_fleet_settings_are_one_line(qwen, trace, fleet, message):
    with pytest.raises(UserError, match=message):
        simulate_fleet(trace, qwen, SimulationSettings.of("vllm", "lru", capacity_bytes=1 << 30), fleet)


def test_an_eviction_that_needs_the_future_is_refused(qwen, trace):
    with pytest.raises(UserError, match="needs the future"):
        simulate_fleet(trace, qwen, SimulationSettings.of("vllm", "belady", capacity_bytes=1 << 30),
                       FleetSettings(2, "hybrid"))


def test_the_cli_replays_a_fleet_and_writes_fleet_json(tmp_path, capsys):
    out = tmp_path / "fleet"
    rc = main(["simulate", "--trace", "synthetic", "--capacity", "1GiB", "--admission", "vllm",
               "--eviction", "lru", "--replicas", "2", "--router", "kv_prefix,hybrid",
               "--out", str(out), "--no-progress"])
    assert rc == 0
    doc = json.loads((out / "fleet.json").read_text())
    assert [r["router"] for r in doc["records"]] == ["kv_prefix", "hybrid"]
    assert all(r["replicas"] == 2 and r["capacity_bytes"] == 1 << 30 for r in doc["records"])
    assert "| 1 GiB | vllm+lru | hybrid |" in capsys.readouterr().out
    rc = main(["simulate", "--trace", "synthetic", "--capacity", "1GiB", "--replicas", "2",
               "--router", "nearest", "--out", str(tmp_path / "x"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown routing policy 'nearest'" in err and "Traceback" not in err


# -- the fleet index, from KV cache events ------------------------------------------------------
class BlockStored:
    def __init__(self, hashes, group):
        self.block_hashes, self.group_idx = list(hashes), group


class BlockRemoved(BlockStored):
    pass


class AllBlocksCleared:
    pass


def _index():
    from vllm_admission.core.fleet_index import FleetIndex

    return FleetIndex(B, ("attention", "state"))


def test_the_index_gives_the_kv_hit_and_the_hybrid_hit():
    index = _index()
    assert index.apply("r", 0, [BlockStored(range(10), 0), BlockStored([3, 6], 1)]) is None
    assert index.hits("r", list(range(10)), 10 * B + 1) == (10 * B, 7 * B)   # state at block 7's end
    assert index.hits("r", list(range(10)), 5 * B) == (4 * B, 4 * B)       # at most prompt_len - 1
    assert index.hits("r", [0, 1, 99], 3 * B + 1) == (2 * B, 0)
    assert index.hits("elsewhere", list(range(10)), 100 * B) == (0, 0)


def test_a_hash_cached_twice_stays_until_both_go():
    index = _index()
    index.apply("r", 0, [BlockStored([0, 0], 0), BlockStored([0], 1)])
    index.apply("r", 1, [BlockRemoved([0], 0)])
    assert index.hits("r", [0], 2 * B) == (B, B)
    index.apply("r", 2, [BlockRemoved([0], 0)])
    assert index.hits("r", [0], 2 * B) == (0, 0)


def test_a_gap_holds_later_batches_back_until_it_fills():
    index = _index()
    index.apply("r", 0, [BlockStored([0], 0)])
    assert index.apply("r", 2, [BlockStored([1], 0), BlockStored([1], 1)]) == 1   # batch 1 lost
    assert index.hits("r", [0, 1], 3 * B) == (B, 0)                               # 2 not applied
    assert index.apply("r", 1, [BlockRemoved([0], 0), BlockStored([0], 0), BlockStored([0], 1)]) is None
    assert index.hits("r", [0, 1], 3 * B) == (2 * B, 2 * B)
    assert index.apply("r", 1, [AllBlocksCleared()]) is None                      # a duplicate: ignored
    assert index.hits("r", [0, 1], 3 * B) == (2 * B, 2 * B)


def test_a_restarted_replica_starts_empty_and_clear_empties():
    index = _index()
    index.apply("r", 0, [BlockStored([0, 1], 0), BlockStored([1], 1)])
    index.apply("r", 1, [BlockStored([2], 0)])
    index.apply("r", 0, [BlockStored([5], 0)])          # numbered from 0 again: a restart
    assert index.replicas["r"].restarts == 1 and index.hits("r", [0, 1], 3 * B) == (0, 0)
    index.apply("r", 1, [BlockStored([0], 0), BlockStored([0], 1), AllBlocksCleared()])
    assert index.hits("r", [0], 2 * B) == (0, 0)
    index.forget("r")
    assert "r" not in index.replicas
    with pytest.raises(ValueError, match="attention and state groups"):
        from vllm_admission.core.fleet_index import FleetIndex
        FleetIndex(B, ("attention",))


def test_the_overlap_weight_reaches_the_router_and_is_refused_where_it_means_nothing(qwen, trace):
    st = SimulationSettings.of("vllm", "lru", capacity_bytes=1 << 30)
    default = simulate_fleet(trace, qwen, st, FleetSettings(3, "hybrid"))
    same = simulate_fleet(trace, qwen, st, FleetSettings(3, "hybrid", overlap_weight=1.0))
    heavy = simulate_fleet(trace, qwen, st, FleetSettings(3, "hybrid", overlap_weight=50.0))
    assert same.per_replica == default.per_replica
    assert heavy.per_replica != default.per_replica        # the weight changed the routing
    assert FleetSettings(3, "kv_prefix", overlap_weight=3.0).make_router().overlap_weight == 3.0
    with pytest.raises(UserError, match="'round_robin' weighs no prefix overlap"):
        FleetSettings(3, "round_robin", overlap_weight=2.0).check()
    with pytest.raises(UserError, match="overlap_weight must be a finite number >= 0"):
        FleetSettings(3, "hybrid", overlap_weight=-1.0).check()
