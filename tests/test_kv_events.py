"""KV cache events for prefix-aware routers describe the plugin's cache exactly (issue 32).

Multi-instance deployments (llm-d, Dynamo) route requests by prefix from vLLM's KV cache
events (``--kv-events-config``; ``vllm/distributed/kv_events.py``): ``BlockStored`` and
``BlockRemoved`` carry each block hash with its KV cache group (``group_idx``), so a router
can tell a recurrent-state block from an attention block. Under the plugin's admission a
state block gets a hash only where the policy keeps the state, and its evictions drop hashes
in its own order; the events must follow.

Here vLLM's own ZMQ publisher runs inside vLLM's scheduler (the plugin's, driven without a
model by ``FakeEngine``), and a ZMQ subscriber decodes the batches as a router would. Before
each request is looked up, the subscriber predicts its hybrid hit from the events alone: the
longest prefix of whole blocks, at most ``prompt_len - 1`` tokens, whose blocks every
attention group holds and whose last block the state group holds. The prediction must be the
engine's cached tokens for every request, under every admission policy and ``auto``, on a
pool small enough to evict.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
from scheduler_harness import (
    GROUPS,
    POLICIES,
    B,
    build,
    random_workload,
    scheduler_config,
)

# The harness's fixtures (model_dir, vllm_config, async_config, costs; tuners stopped
# after each test) are pytest's to inject.
pytest_plugins = ["scheduler_harness"]

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class Router:
    """What a prefix-aware router knows: the block hashes each KV cache group holds, from
    the events alone. A hash is counted, not just noted: vLLM can cache two blocks under
    one hash (two requests computing the same block at once) and says ``BlockStored`` for
    each and ``BlockRemoved`` when either is evicted, so a hash is held while its count is
    above zero (``AllBlocksCleared`` empties everything)."""

    def __init__(self, endpoint: str) -> None:
        import msgspec
        import zmq
        from vllm.distributed.kv_events import KVEventBatch

        self._sock = zmq.Context.instance().socket(zmq.SUB)
        self._sock.connect(endpoint)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.setsockopt(zmq.RCVTIMEO, 20_000)
        self._decode = msgspec.msgpack.Decoder(type=KVEventBatch).decode
        self.held: dict[int, Counter] = defaultdict(Counter)
        self.batches = 0

    def receive(self, batches: int) -> None:
        """Take the next ``batches`` batches off the wire and apply them."""
        from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

        for _ in range(batches):
            _topic, _seq, payload = self._sock.recv_multipart()
            for event in self._decode(payload).events:
                if isinstance(event, BlockStored):
                    self.held[event.group_idx].update(event.block_hashes)
                elif isinstance(event, BlockRemoved):
                    self.held[event.group_idx].subtract(event.block_hashes)
                elif isinstance(event, AllBlocksCleared):
                    self.held.clear()
            self.batches += 1

    def hybrid_hit(self, hashes: list, prompt_len: int, kinds: tuple[str, ...]) -> int:
        attention = [g for g, k in enumerate(kinds) if k == "attention"]
        state = [g for g, k in enumerate(kinds) if k == "state"]
        n = 0
        while n < min(len(hashes), (prompt_len - 1) // B) and all(
                self.held[g][hashes[n]] > 0 for g in attention):
            n += 1
        return max((h * B for h in range(1, n + 1)
                    if all(self.held[g][hashes[h - 1]] > 0 for g in state)), default=0)

    def close(self) -> None:
        self._sock.close(linger=0)


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
    cfg.kv_events_config = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                                          endpoint=endpoint, topic="kv")
    engine = build(cfg, monkeypatch, policy=policy, eviction=eviction, blocks=48)
    sched = engine.scheduler
    published = []
    original = sched.kv_event_publisher.publish

    def publish(batch):
        published.append(len(batch.events))
        original(batch)

    monkeypatch.setattr(sched.kv_event_publisher, "publish", publish)
    router = Router(endpoint)
    time.sleep(0.5)  # ZMQ's slow joiner: let the subscription reach the publisher
    try:
        hits, predicted = [], []
        for tokens, out_len in random_workload(3, n=30):
            # Everything the engine changed so far is on the wire before this lookup.
            assert not sched.kv_cache_manager.block_pool.kv_event_queue
            router.receive(len(published) - router.batches)
            rid = engine.add(tokens, out_len)
            request = sched.requests[rid]
            hashes = [maybe_convert_block_hash(h) for h in request.block_hashes]
            predicted.append(router.hybrid_hit(hashes, len(tokens), GROUPS))
            engine.run()
            hits.append(engine.cached_tokens[rid])
        assert predicted == hits
        assert sched.stats().evictions > 0
        assert any(hits) or policy == "none"
    finally:
        router.close()
        sched.kv_event_publisher.shutdown()
