"""vLLM's OffloadingConnector (a host tier) under the plugin, on the CPU engine (issue 33).

The connector's scheduler side is vLLM's; its worker side is this project's
``HostCopyOffloadingSpec`` (vLLM's out-of-tree spec hook: copies on the host, so it runs on
the CPU build). On the tiny Qwen3-Next with a float32 state (so B is the same on every
CPU; derived from the live engine all the same) in a pool of 14 blocks of 256 tokens and a
host tier of 18 chunks, both tiers evict:

* every admission policy gives stock vLLM's model output (stock: no plugin, no host tier):
  greedy tokens and logits within rounding (tests/model_output.py), since a hit, a host load
  or a chunk stop cuts the prompt into other prefill passes than stock's;
* its hits, host loads included, are the core's (``HybridPrefixCache`` with a ``HostTier``
  of the chunks the engine reports), request by request;
* ``auto`` runs with the host tier and gives stock's tokens;
* after a request aborted mid-prefill and a batch that preempts, nothing is held in either
  tier: every GPU block is free, no host chunk is pinned or waiting for its copy, and the
  connector tracks no request and no transfer.
"""

from __future__ import annotations

import gc
import os
import random

import pytest
from block_hashes import chained_hashes
from model_output import LOGITS_MODE, assert_same_output, generate

from vllm_admission.core.admission import ADMISSION_POLICIES, stock_admission

pytestmark = pytest.mark.engine

POLICIES = sorted(ADMISSION_POLICIES, key=lambda name: name != stock_admission())
SSM_DTYPE = "float32"
POOL_TOKENS = 14 * 256
HOST_CHUNKS = 18
MAX_MODEL_LEN = 2048
OUTPUT = 8


def toks(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(3, 500) for _ in range(n)]


# A, B, C of 1,500 tokens: the 14-block pool keeps about two of them, so A is evicted from
# the GPU by B and C and can come back only from the host; then prompts that share A's
# first 1,000 tokens (a junction inside A) and B again.
_A, _B, _C = toks(1, 1500), toks(2, 1500), toks(3, 1500)
PROMPTS = [_A, _B, _C, _A + toks(4, 50), _B, _A[:1000] + toks(5, 400), _A[:1000] + toks(6, 400),
           _C]


def _settings(model_dir, *, plugin: bool, host_bytes: int | None, env: dict | None = None):
    from vllm_admission.engine.llm import EngineSettings
    from vllm_admission.plugin.offload_config import offloading_connector_config

    base = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_ADMISSION_LOG_INTERVAL": "0",
            "VLLM_ADMISSION_POLICY": None, "VLLM_ADMISSION_EVICTION": None,
            "VLLM_PLUGINS": None if plugin else ""}
    base.update(env or {})
    args = dict(LOGITS_MODE)
    if host_bytes is not None:
        args["kv_transfer_config"] = offloading_connector_config(host_bytes)
    return EngineSettings(model=str(model_dir), max_model_len=MAX_MODEL_LEN,
                          mamba_ssm_cache_dtype=SSM_DTYPE, env=base, engine_args=args,
                          scheduler_cls="vllm_admission.AdmissionScheduler" if plugin else None)


def _start(settings, block_size):
    import vllm.plugins

    from vllm_admission.engine.llm import build_llm

    settings.num_gpu_blocks = POOL_TOKENS // block_size
    vllm.plugins.plugins_loaded = False
    return build_llm(settings)


def _stop(llm):
    llm.llm_engine.engine_core.shutdown()
    gc.collect()


def _one_at_a_time(llm, prompts):
    return generate(llm, prompts, OUTPUT)


def _scheduler(llm):
    from vllm_admission.engine.llm import inprocess_scheduler

    return inprocess_scheduler(llm)


@pytest.fixture(scope="module")
def model_dir(tiny_model_of):
    pytest.importorskip("vllm")
    return tiny_model_of("qwen3-next")


@pytest.fixture(scope="module")
def geometry(model_dir):
    """Block size and bytes per block of the model with a float32 state, as the core
    derives them; the engines below check them."""
    from engine_cases import predicted_block_size

    from vllm_admission.core.costs import ModelCosts
    from vllm_admission.core.geometry import geometry_from_blocks

    B = predicted_block_size(model_dir, SSM_DTYPE)  # noqa: N806
    costs = ModelCosts.from_config(model_dir / "config.json", mamba_ssm_cache_dtype=SSM_DTYPE)
    return B, geometry_from_blocks(costs, POOL_TOKENS // B, B).bytes_per_block


@pytest.fixture(scope="module")
def saved_env():
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="module")
def reference(model_dir, geometry, saved_env):
    """Stock vLLM's tokens and hits, one prompt at a time, without a host tier."""
    llm = _start(_settings(model_dir, plugin=False, host_bytes=None), geometry[0])
    try:
        return _one_at_a_time(llm, PROMPTS)
    finally:
        _stop(llm)


def _predicted(policy, B, num_blocks, host_chunks, host_admission=None):  # noqa: N803
    from vllm_admission.core.admission import get_admission
    from vllm_admission.core.cache import HybridPrefixCache
    from vllm_admission.core.eviction import get_eviction
    from vllm_admission.core.layout import CacheLayout, HostTierSpec, PoolSpec, SchedulingSpec

    layout = CacheLayout(PoolSpec(num_blocks=num_blocks, block_size=B, group_kinds=("state", "attention")),
                         SchedulingSpec(chunk_size=4096),
                         host=HostTierSpec(chunks=host_chunks, admission=host_admission))
    cache = HybridPrefixCache(layout, admission=get_admission(policy), eviction=get_eviction("lru"))
    out = [cache.serve(chained_hashes(p, B), len(p), OUTPUT, r, float(r))
           for r, p in enumerate(PROMPTS)]
    return [o.hit_tokens for o in out], [o.host_hit_tokens for o in out], cache.host


def test_every_admission_gives_stock_tokens_and_the_predicted_hits(model_dir, geometry,
                                                                   reference, saved_env):
    from vllm_admission.engine.llm import engine_geometry

    B, bytes_per_block = geometry  # noqa: N806
    llm = _start(_settings(model_dir, plugin=True, host_bytes=HOST_CHUNKS * bytes_per_block,
                           env={"VLLM_ADMISSION_EVICTION": "lru"}), B)
    try:
        geo = engine_geometry(llm)
        assert geo.block_size == B and geo.host_chunks == HOST_CHUNKS
        # The connector members the plugin reads (surface.PRIVATE_MEMBERS), on a live engine.
        from vllm_admission.plugin.offload_config import host_tier

        assert host_tier(_scheduler(llm)) == (HOST_CHUNKS, "lru")
        assert [g.kind for g in geo.kv_cache_groups] == ["state", "attention"]
        sched = _scheduler(llm)
        host_hits = {}
        for policy in POLICIES:
            assert llm.reset_prefix_cache(reset_connector=True)
            sched.set_admission_policy(policy)
            before = sched.stats()
            got = _one_at_a_time(llm, PROMPTS)
            after = sched.stats()
            assert_same_output(reference, got, label=policy)
            hits, from_host, host = _predicted(policy, B, geo.num_gpu_blocks, HOST_CHUNKS)
            assert [o.cached for o in got] == hits, policy
            host_hits[policy] = sum(from_host)
            # The plugin's counters: num_cached_tokens, with the host tier's part apart.
            assert after.hit_tokens - before.hit_tokens == sum(hits), policy
            assert after.host_hit_tokens - before.host_hit_tokens == sum(from_host), policy
            assert host.evicted > 0, policy  # the host tier is full at some point
        # The case reaches the host tier: a policy that keeps prompt-end states loads them
        # back; none keeps no state to load, and dense fills the 18 chunks with states
        # (a state per block and group) before any is asked for again.
        assert host_hits["none"] == host_hits["dense"] == 0
        assert all(host_hits[k] > 0 for k in ("vllm", "last", "marconi")), host_hits
    finally:
        _stop(llm)


def test_auto_runs_with_a_host_tier_and_gives_stock_tokens(model_dir, geometry, reference,
                                                          saved_env):
    B, bytes_per_block = geometry  # noqa: N806
    llm = _start(_settings(model_dir, plugin=True, host_bytes=HOST_CHUNKS * bytes_per_block,
                           env={"VLLM_ADMISSION_POLICY": "auto",
                                "VLLM_ADMISSION_EVICTION": "auto",
                                "VLLM_ADMISSION_AUTO_INTERVAL": "2"}), B)
    try:
        got = _one_at_a_time(llm, PROMPTS)
        assert_same_output(reference, got)
        assert sum(o.cached for o in got) > 0
    finally:
        _stop(llm)


def test_a_host_load_of_the_wrong_rows_is_caught(model_dir, geometry, reference, saved_env,
                                                 monkeypatch):
    """The comparison's power on the live engine: a host tier that loads each block from the
    next row of its buffer (a wrong-row bug) gives a different model output, not rounding."""
    from vllm_admission.plugin.repairs.cpu_offload import HostCopyWorker

    rows, load = HostCopyWorker._host_rows, HostCopyWorker.submit_load  # noqa: SLF001
    loading = []

    def wrong_rows(self, chunks, skip, count):
        got = rows(self, chunks, skip, count)
        return (got + 1) % self._host[0].shape[0] if loading else got  # noqa: SLF001

    def spy_load(self, *args):
        loading.append(True)
        try:
            return load(self, *args)
        finally:
            loading.pop()

    monkeypatch.setattr(HostCopyWorker, "_host_rows", wrong_rows)
    monkeypatch.setattr(HostCopyWorker, "submit_load", spy_load)
    B, bytes_per_block = geometry  # noqa: N806
    llm = _start(_settings(model_dir, plugin=True, host_bytes=HOST_CHUNKS * bytes_per_block,
                           env={"VLLM_ADMISSION_POLICY": "vllm",
                                "VLLM_ADMISSION_EVICTION": "lru"}), B)
    try:
        got = _one_at_a_time(llm, PROMPTS)
        assert _scheduler(llm).stats().host_hit_tokens > 0  # the wrong rows were used
        with pytest.raises(AssertionError, match="moved by|not a near-tie|top"):
            assert_same_output(reference, got)
    finally:
        _stop(llm)


@pytest.mark.parametrize("policy", ["none", "marconi"])
def test_per_tier_admission_gives_stock_tokens_and_the_predicted_hits(model_dir, geometry,
                                                                      reference, saved_env,
                                                                      policy):
    """``VLLM_ADMISSION_HOST_ADMISSION=dense``: the states of every block boundary are
    handed to the host tier and dropped from the GPU; greedy tokens stay stock's, the hits
    are the simulator's, and the host holds states the GPU policy never keeps."""
    B, bytes_per_block = geometry  # noqa: N806
    llm = _start(_settings(model_dir, plugin=True, host_bytes=HOST_CHUNKS * bytes_per_block,
                           env={"VLLM_ADMISSION_POLICY": policy,
                                "VLLM_ADMISSION_EVICTION": "lru",
                                "VLLM_ADMISSION_HOST_ADMISSION": "dense"}), B)
    try:
        from vllm_admission.engine.llm import engine_geometry

        geo = engine_geometry(llm)
        assert geo.host_admission == "dense"
        got = _one_at_a_time(llm, PROMPTS)
        assert_same_output(reference, got)
        hits, from_host, host = _predicted(policy, B, geo.num_gpu_blocks, HOST_CHUNKS, "dense")
        assert [o.cached for o in got] == hits
        if policy == "none":  # nothing on the GPU: every hit is a host-only state
            assert sum(hits) > 0 and from_host == hits
        stats = _scheduler(llm).stats()
        assert stats.host_hit_tokens == sum(from_host)
        # A state at a position no GPU policy here keeps (not a prompt end) reached the host.
        held = _scheduler(llm).connector.connector_scheduler.manager._policy.chunks  # noqa: SLF001
        assert host.stored > len(PROMPTS) and len(held) == len(host)
    finally:
        _stop(llm)


def _assert_nothing_held(llm):
    sched = _scheduler(llm)
    engine = llm.llm_engine
    side = sched.connector.connector_scheduler
    # The connector's last stores and finishes run at the engine's next steps.
    for _ in range(8):
        if not side.has_pending_push_work() and not side._req_status:  # noqa: SLF001
            break
        engine.step()
    pool = sched.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1
    manager = side.manager
    assert not side._jobs and not side._req_status  # noqa: SLF001
    assert not side._block_id_to_pending_jobs  # noqa: SLF001
    held = len(manager._policy.chunks)  # noqa: SLF001
    assert held > 0
    # Every chunk held is evictable: none pinned by a load, none waiting for its copy.
    assert manager._num_evictable_cache_chunks == held  # noqa: SLF001
    assert manager._num_write_pending_chunks == 0  # noqa: SLF001


@pytest.mark.parametrize("policy, host_admission",
                         [("dense", None), ("marconi", None), ("marconi", "dense")])
def test_nothing_leaks_in_either_tier_after_an_abort_and_preemptions(model_dir, geometry, policy,
                                                                     host_admission, saved_env):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    B, bytes_per_block = geometry  # noqa: N806
    llm = _start(_settings(model_dir, plugin=True, host_bytes=HOST_CHUNKS * bytes_per_block,
                           env={"VLLM_ADMISSION_POLICY": policy,
                                "VLLM_ADMISSION_EVICTION": "lru",
                                "VLLM_ADMISSION_CHECKPOINT": "split",
                                "VLLM_ADMISSION_HOST_ADMISSION": host_admission}), B)
    try:
        sched = _scheduler(llm)
        engine = llm.llm_engine
        sp = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, detokenize=False)
        _one_at_a_time(llm, PROMPTS[:2])
        # Abort a request in the middle of its prefill (with a small step budget).
        engine.add_request("victim", TokensPrompt(prompt_token_ids=toks(77, 1900)), sp)
        engine.step()
        (victim,) = sched.requests.values()
        assert 0 < victim.num_computed_tokens < 1900
        engine.abort_request(["victim"])
        while engine.has_unfinished_requests():
            engine.step()
        _assert_nothing_held(llm)
        # Six requests at once overflow the pool while decoding: vLLM preempts.
        preempted = []
        original = sched._preempt_request  # noqa: SLF001

        def spy(request, *args, **kwargs):
            preempted.append(request.request_id)
            return original(request, *args, **kwargs)

        sched._preempt_request = spy  # noqa: SLF001
        try:
            batch = [toks(9, 300) + toks(50 + i, 400) for i in range(6)]
            outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in batch],
                                SamplingParams(max_tokens=120, temperature=0.0, ignore_eos=True,
                                               detokenize=False), use_tqdm=False)
        finally:
            del sched._preempt_request  # noqa: SLF001
        assert preempted
        assert all(len(o.outputs[0].token_ids) == 120 for o in outs)
        _assert_nothing_held(llm)
        # The tiers still serve: a prompt sent twice hits the second time.
        first, second = _one_at_a_time(llm, [PROMPTS[2], PROMPTS[2]])
        assert second.cached > 0
        assert_same_output([first], [second])
        _assert_nothing_held(llm)
    finally:
        _stop(llm)
