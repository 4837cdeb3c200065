"""The outside check (simulations/outside_check.py): libCacheSim beside the project's policies.

On the first 600 Mooncake requests at 16 GiB (1,285 blocks of Qwen3-Next attention KV, ten
times fewer than the slice's 12,844 distinct blocks, so every policy evicts; fewer requests
hardly reuse anything: Mooncake's reuse distances are long): the project's
``lru``, ``lfu`` and ``belady`` policy objects, driven per access, hit exactly the accesses
libCacheSim's LRU, LFU and Belady hit; the pooled (vLLM prefix cache) replay reaches the
simulator's infinite-capacity bound when nothing is evicted, and under ``lru`` and ``belady``
its cached blocks stay prefix-closed, so counting every cached block adds nothing.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from shared_data import MOONCAKE, require

from vllm_admission.core.cache_inputs import infinite_capacity_bound
from vllm_admission.core.costs import load_model
from vllm_admission.core.traces import load_trace

ROOT = Path(__file__).resolve().parents[1]
CAPACITY = 16 * 2**30
REQUESTS = 600


def _module():
    spec = importlib.util.spec_from_file_location("outside_check", ROOT / "simulations" / "outside_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("outside_check", mod)  # dataclasses look the module up
    spec.loader.exec_module(mod)
    return mod


oc = _module()


@pytest.fixture(scope="module")
def stream():
    require(MOONCAKE)
    return oc.build_stream(load_trace(str(MOONCAKE), max_requests=REQUESTS), load_model(oc.MODEL))


@pytest.fixture(scope="module")
def lcs():
    return pytest.importorskip("libcachesim", reason="libcachesim (the dev extra) is not installed")


def test_stream_is_attention_blocks_of_the_hybrid_block(stream):
    costs = load_model(oc.MODEL)
    assert stream.block_tokens == 544  # Qwen3-Next's hybrid-aligned block
    # 12 attention layers x 2 (K, V) x 2 KV heads x 256 x 2 bytes per token
    assert stream.block_bytes == 544 * 12 * 2 * 2 * 256 * 2
    assert len(stream.keys) == sum(len(r.hashes) for r in stream.requests)
    assert stream.unique_blocks > 5 * (CAPACITY // stream.block_bytes)  # real pressure
    # next_access points at the next equal key, or NEVER
    last = {}
    for i, k in enumerate(stream.keys):
        if k in last:
            assert stream.next_access[last[k]] == i
        last[k] = i
    assert all(stream.next_access[i] == oc.NEVER for i in last.values())
    assert costs.is_hybrid


@pytest.mark.parametrize("ours, theirs", [("lru", "LRU"), ("lfu", "LFU"), ("belady", "Belady")])
def test_project_policy_hits_what_libcachesim_hits(stream, lcs, ours, theirs):
    mine = oc.flat_hits(ours, stream, CAPACITY)
    outside = oc.libcachesim_hits(lcs, theirs, stream, CAPACITY)
    assert sum(mine) > 50
    assert oc.compare(mine, outside)["accesses_differing"] == 0


def test_belady_is_the_flat_optimum(stream, lcs):
    best = sum(oc.libcachesim_hits(lcs, "Belady", stream, CAPACITY))
    for name in ("LRU", "S3FIFO", "Sieve", "ARC", "LFU"):
        assert sum(oc.libcachesim_hits(lcs, name, stream, CAPACITY)) < best
    assert sum(oc.flat_hits("reuse", stream, CAPACITY)) < best


def test_pooled_replay_reaches_the_bound_without_eviction(stream):
    hit_tokens, _ = infinite_capacity_bound(stream.requests, stream.block_tokens)
    big = len(stream.keys) * stream.block_bytes
    hits = oc.pooled_hits("lru", stream, big)
    assert sum(hits) * stream.block_tokens == hit_tokens


@pytest.mark.parametrize("policy", ["lru", "belady"])
def test_cached_blocks_stay_prefix_closed(stream, policy):
    """Block i is freed no earlier and needed no later than block i + 1 of the same chain,
    so both orders evict a prefix's tail first: counting every cached block of a prompt
    (no prefix rule) hits exactly what the prefix rule hits, request by request."""
    prefix = oc.pooled_hits(policy, stream, CAPACITY)
    any_block = oc.pooled_hits(policy, stream, CAPACITY, prefix=False)
    assert prefix == any_block and sum(prefix) > 0


def test_cli_writes_the_tables(tmp_path, lcs):
    require(MOONCAKE)
    rc = oc.main(["--max-requests", "100", "--capacity", "8GiB", "--pairs", "vllm+lru",
                  "--jobs", "1", "--out", str(tmp_path)])
    assert rc == 0
    doc = json.loads((tmp_path / "outside_check.json").read_text())
    (row,) = doc["capacities"]
    assert row["agreement"]["lru vs LRU"]["accesses_differing"] == 0
    hybrid = row["hybrid"]["vllm+lru"]
    assert 0 <= hybrid["token_hit_rate"] <= hybrid["kv_hit_rate"] <= 1
    assert "| 8 GiB |" in (tmp_path / "outside_check.md").read_text()


def test_missing_libcachesim_is_one_clear_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "libcachesim", None)  # import raises ImportError
    assert oc.main(["--capacity", "8GiB", "--pairs", ""]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "libcachesim is not installed" in err


def test_too_small_capacity_is_one_clear_line(capsys, lcs):
    require(MOONCAKE)
    assert oc.main(["--max-requests", "10", "--capacity", "256MiB", "--pairs", ""]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "the longest prompt needs" in err


def test_bad_pair_is_one_clear_line(capsys):
    assert oc.main(["--pairs", "vllm-lru"]) == 2
    assert "ADMISSION+EVICTION" in capsys.readouterr().err
