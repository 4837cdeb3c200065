"""The plugin's policies under a KV connector that vLLM's scheduler drives (issue 32).

A connector sits inside ``Scheduler.schedule``: it is asked for external hits after the
local lookup (``get_num_new_matched_tokens``), told each allocation, may hold a finished
request's blocks (``request_finished`` returning ``delay_free``), and some walk the block
pool's free queue (``SimpleCPUOffloadConnector`` offloads the blocks nearest eviction
through ``iter_blocks_after``). These tests run vLLM's scheduler with the connector of
vLLM's own connector unit tests (``MockKVConnector`` in
``tests/v1/kv_connector/unit/utils.py``, from the ``shared/`` checkout beside the
repository) on the hybrid layout of ``test_plugin_scheduler.py``, for every admission
policy, a key-reading and a FLOP-valued eviction, and ``auto``.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from shared_data import VLLM_TESTS

pytest.importorskip("vllm")

from junction_case import expected_junction, junction_prompts  # noqa: E402
from scheduler_harness import POLICIES, B, build, toks  # noqa: E402

# The harness's fixtures (model_dir, vllm_config, async_config, costs; tuners stopped
# after each test) are pytest's to inject.
pytest_plugins = ["scheduler_harness"]


#: (admission, eviction) pairs: every admission policy, evictions that read keys, FLOP
#: values and reuse, and auto switching both.
PAIRS = [("vllm", "lru"), ("last", "s3fifo"), ("marconi", "flop"), ("dense", "reuse"),
         ("block", "conversation"), ("auto", "auto")]


@pytest.fixture(scope="module")
def vllm_connector_helpers():
    """vLLM's connector unit-test helpers (they register ``MockKVConnector``): those on the
    path (``make compat`` puts the tested release's there), else 0.32's from ``shared/``."""
    helpers = Path("tests", "v1", "kv_connector", "unit", "utils.py")
    root = next((Path(p) for p in sys.path if p and (Path(p) / helpers).is_file()), VLLM_TESTS)
    if not (root / helpers).is_file():
        pytest.skip(f"vLLM's connector test helpers are not in the shared checkout ({VLLM_TESTS})")
    sys.path.insert(0, str(root))
    try:
        from tests.v1.kv_connector.unit import utils
    finally:
        sys.path.remove(str(root))
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA

    class HybridMockKVConnector(utils.MockKVConnector, SupportsHMA):
        """vLLM's ``MockKVConnector`` for a hybrid model: vLLM builds a connector over
        several KV cache groups only if it declares ``SupportsHMA``; like the mock, it
        frees a finished request's blocks at once."""

        def request_finished_all_groups(self, request, block_ids):
            return False, None

    if not hasattr(utils, HybridMockKVConnector.__name__):
        utils.HybridMockKVConnector = HybridMockKVConnector
        KVConnectorFactory.register_connector(HybridMockKVConnector.__name__, utils.__name__,
                                              HybridMockKVConnector.__name__)
    return utils


def with_connector(cfg, matched_tokens: int = 0, **extra):
    """``cfg`` with vLLM's ``MockKVConnector`` (sync, declared hybrid-capable), reporting
    ``matched_tokens`` external tokens for every request."""
    import copy

    from vllm.config import KVTransferConfig

    cfg = copy.copy(cfg)
    cfg.kv_transfer_config = KVTransferConfig(
        kv_connector="HybridMockKVConnector", kv_role="kv_both",
        kv_connector_extra_config={"matched_tokens": matched_tokens, "is_async": False,
                                   **extra})
    return cfg


def workload(seed: int = 0, n: int = 40) -> list[tuple[list[int], int]]:
    """Conversations over a few shared system prompts, enough to evict in 160 blocks."""
    rng = random.Random(seed)
    systems = [toks(100 + i, rng.randrange(2, 8) * B + rng.randrange(B)) for i in range(8)]
    out = []
    for i in range(n):
        base = systems[rng.randrange(len(systems))]
        out.append((base + toks(1000 + i, rng.randrange(B, 6 * B)), rng.randrange(1, 9)))
    return out


def serve(engine, requests) -> list[int]:
    hits = []
    for tokens, out_len in requests:
        rid = engine.add(tokens, out_len)
        engine.run()
        hits.append(engine.cached_tokens[rid])
    return hits


def assert_nothing_held(scheduler) -> None:
    """Every block but the null block is free, with no reference left
    (``assert_scheduler_empty`` of vLLM's connector tests, for the block pool)."""
    pool = scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1
    assert all(b.ref_cnt == 0 for b in pool.blocks[1:])
    assert not scheduler.requests


@pytest.mark.parametrize("policy, eviction", PAIRS)
def test_a_connector_changes_nothing_the_plugin_decides(vllm_config, vllm_connector_helpers,
                                                         monkeypatch, policy, eviction):
    """A connector with nothing to load: the same hits, the same evictions per group, the
    same checkpoints and the same policy switches as without one, request by request;
    the plugin's free queue (not vLLM's) is the one the connector's scheduler sees."""
    reqs = workload()
    plain = build(vllm_config, monkeypatch, policy=policy, eviction=eviction)
    engine = build(with_connector(vllm_config), monkeypatch, policy=policy, eviction=eviction)
    sched = engine.scheduler
    assert sched.connector is not None
    assert serve(engine, reqs) == serve(plain, reqs)
    ours, theirs = sched.stats(), plain.scheduler.stats()
    assert ours.evictions > 0
    for field in ("evictions_by_group", "state_checkpoints", "junctions", "admission",
                  "eviction", "policy_switches"):
        assert getattr(ours, field) == getattr(theirs, field), field
    queue = sched.kv_cache_manager.block_pool.free_block_queue
    assert (type(queue).__name__ == "FreeKVCacheBlockQueue") == (eviction == "lru")
    assert_nothing_held(sched)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_connector_taking_divergent_hybrid_hits_leaves_the_junction_case_exact(
        vllm_config, vllm_connector_helpers, monkeypatch, policy):
    """A connector that takes divergent hybrid hits (``supports_divergent_local_hybrid_hits``,
    as NIXL does) is told the attention hit where no state backs it, the junction case's
    second sibling; with nothing to load vLLM falls back to the hybrid hit. The plugin
    plans from the hybrid hit and its junction either way, so every policy gets the
    junction case's hits (``tests/junction_case.py``) as without a connector."""
    engine = build(with_connector(vllm_config, supports_divergent_local_hybrid_hits=True),
                   monkeypatch, policy=policy, eviction="lru")
    assert engine.scheduler.connector.supports_divergent_local_hybrid_hits
    assert serve(engine, [(p, 4) for p in junction_prompts(toks)]) == expected_junction(B)[policy]
    assert_nothing_held(engine.scheduler)


@pytest.mark.parametrize("policy, eviction", PAIRS)
def test_external_tokens_start_the_prefill_past_the_local_hit(vllm_config,
                                                               vllm_connector_helpers,
                                                               monkeypatch, policy, eviction):
    """A connector that has two blocks of every prompt: each request starts computing at
    its local hit plus those two blocks (as vLLM's scheduler adds them), runs to the end,
    and leaves no block held; the local cache still serves later requests."""
    external = 2 * B
    engine = build(with_connector(vllm_config, matched_tokens=external), monkeypatch,
                   policy=policy, eviction=eviction)
    sched = engine.scheduler
    rng = random.Random(1)
    prefix = toks(7, 5 * B)
    starts, hits = [], []
    for i in range(6):
        prompt = prefix + toks(50 + i, rng.randrange(3 * B, 4 * B))
        rid = engine.add(prompt, 3)
        engine.step()
        request = sched.requests[rid]
        starts.append(request.num_computed_tokens - engine.last_output.num_scheduled_tokens[rid])
        engine.run()
        hits.append(engine.cached_tokens[rid])
    local = [h - external for h in hits]
    assert starts == [loc + external for loc in local]
    assert local[0] == 0 and max(local[1:]) > 0
    assert_nothing_held(sched)


@pytest.mark.parametrize("eviction", ["s3fifo", "flop", "reuse"])
def test_a_connector_walking_the_free_queue_meets_the_next_victims_first(
        vllm_config, vllm_connector_helpers, monkeypatch, eviction):
    """What ``SimpleCPUOffloadConnector`` relies on: the free queue's
    ``iter_blocks_after(None)`` yields the free blocks in eviction order, so the first
    ``k`` it walks are the ``k`` blocks the pool hands out next."""
    engine = build(with_connector(vllm_config), monkeypatch, policy="marconi",
                   eviction=eviction)
    serve(engine, workload(seed=2, n=20))
    pool = engine.scheduler.kv_cache_manager.block_pool
    walked = [b.block_id for b in pool.free_block_queue.iter_blocks_after(None)]
    assert len(walked) == pool.get_num_free_blocks()
    taken = [b.block_id for b in pool.get_new_blocks(8)]
    assert taken == walked[:8]
    pool.free_blocks(pool.blocks[i] for i in taken)
