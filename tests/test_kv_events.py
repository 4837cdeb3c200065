"""KV cache events for prefix-aware routers describe the plugin's cache exactly (issue 32).

Multi-instance deployments (llm-d, Dynamo) route requests by prefix from vLLM's KV cache
events (``--kv-events-config``; ``vllm/distributed/kv_events.py``): ``BlockStored`` and
``BlockRemoved`` carry each block hash with its KV cache group (``group_idx``), so a router
can tell a recurrent-state block from an attention block. Under the plugin's admission a
state block gets a hash only where the policy keeps the state, and its evictions drop hashes
in its own order; the events must follow.

Here vLLM's own ZMQ publisher runs inside vLLM's scheduler (the plugin's, driven without a
model by ``FakeEngine``), and a ZMQ subscriber decodes the batches as a router would. Before
each request is looked up, the subscriber predicts its hybrid hit from the events alone (the
product's ``FleetIndex`` fed by its ``EventSubscriber``; two batches dropped on purpose in one
run and recovered through vLLM's replay socket): the longest prefix of whole blocks, at most
``prompt_len - 1`` tokens, whose blocks every attention group holds and whose last block the
state group holds. The prediction must be the engine's cached tokens for every request,
under every admission policy and ``auto``, on a pool small enough to evict.
"""

from __future__ import annotations

import pytest
from scheduler_harness import (
    GROUPS,
    POLICIES,
    B,
    build,
    random_workload,
    scheduler_config,
)

from vllm_admission.core.fleet_index import FleetIndex
from vllm_admission.fleet.subscriber import EventSubscriber

# The harness's fixtures (model_dir, vllm_config, async_config, costs; tuners stopped
# after each test) are pytest's to inject.
pytest_plugins = ["scheduler_harness"]

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.mark.parametrize("policy,eviction", [*((p, "lru") for p in POLICIES),
                                             ("marconi", "flop"), ("last", "reuse"),
                                             ("auto", "auto")])
def test_a_router_replaying_the_events_predicts_every_hit(model_dir, monkeypatch, tmp_path, policy,
                                                          eviction):
    import time

    from vllm.config import KVEventsConfig
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

    endpoint = f"ipc://{tmp_path}/kv-events"   # the publisher binds an ipc endpoint
    cfg = scheduler_config(model_dir, async_scheduling=False)
    replay = f"ipc://{tmp_path}/kv-replay"
    cfg.kv_events_config = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                                          endpoint=endpoint, replay_endpoint=replay, topic="kv")
    engine = build(cfg, monkeypatch, policy=policy, eviction=eviction, blocks=48)
    sched = engine.scheduler
    published = []
    original = sched.kv_event_publisher.publish

    def publish(batch):
        published.append(len(batch.events))
        original(batch)

    monkeypatch.setattr(sched.kv_event_publisher, "publish", publish)
    index = FleetIndex(B, GROUPS)
    # Drop two batches on purpose in one run: the subscriber gets them from the replay socket.
    drop = {3, 11} if policy == "vllm" else set()
    sub = EventSubscriber(index, "r0", endpoint, replay_endpoint=replay, topic="kv")
    time.sleep(0.5)  # ZMQ's slow joiner: let the subscription reach the publisher
    try:
        hits, predicted = [], []
        for tokens, out_len in random_workload(3, n=30):
            # Everything the engine changed so far is on the wire before this lookup.
            assert not sched.kv_cache_manager.block_pool.kv_event_queue
            sub.receive(len(published) - sub.batches, drop=drop)
            rid = engine.add(tokens, out_len)
            request = sched.requests[rid]
            hashes = [maybe_convert_block_hash(h) for h in request.block_hashes]
            kv, hybrid = index.hits("r0", hashes, len(tokens))
            assert kv >= hybrid
            predicted.append(hybrid)
            engine.run()
            hits.append(engine.cached_tokens[rid])
        assert predicted == hits
        assert sched.stats().evictions > 0
        assert any(hits) or policy == "none"
        assert sub.replayed >= len(drop) and sub.gaps_unrecovered == 0
        assert not index.replicas["r0"].pending
    finally:
        sub.close()
        sched.kv_event_publisher.shutdown()
