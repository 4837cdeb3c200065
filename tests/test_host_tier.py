"""The host tier (vLLM's ``OffloadingConnector`` with its CPU manager), as the core models it.

Hand-derived cases for each rule :class:`~vllm_admission.core.cache.host.HostTier` takes from
vLLM 0.32's connector (``offloading/scheduler.py``, ``kv_offload/cpu/manager.py``,
``cpu/policies/lru.py``), then the cache model with a host tier: what reaches the host is
what the GPU's admission policy cached, and a prefix evicted from the GPU comes back from
the host. The engine side of the same rules is ``tests/test_offload_engine.py``.
"""

from __future__ import annotations

import dataclasses

import pytest
from block_hashes import chained_hashes

from vllm_admission.core.admission import get_admission
from vllm_admission.core.cache import HybridPrefixCache
from vllm_admission.core.cache.host import (
    HostEviction,
    HostLRU,
    HostRequest,
    HostTier,
    check_host_tier,
    host_chunks,
    host_policy_names,
)
from vllm_admission.core.costs import load_model
from vllm_admission.core.errors import UserError
from vllm_admission.core.eviction import get_eviction
from vllm_admission.core.layout import CacheLayout, HostTierSpec, PoolSpec, SchedulingSpec
from vllm_admission.core.traces import load_trace
from vllm_admission.sim.simulator import SimulationSettings, simulate

B = 256
GROUPS = ("state", "attention")  # vLLM's order for the tiny Qwen3-Next: group 0 state


def tokens(tag, n):
    return [(tag, i) for i in range(n)]


# -- capacity --------------------------------------------------------------------------

def test_a_chunk_is_one_block_rounded_up_to_the_host_page():
    assert host_chunks(10 * 8192, 8192) == 10
    assert host_chunks(10 * 8192, 8000) == 10          # 8000 -> 8192
    assert host_chunks(10 * 8192, 8193) == 6           # 8193 -> 12288
    assert host_chunks(0, 4096) == 0
    with pytest.raises(UserError):
        host_chunks(-1, 4096)
    with pytest.raises(UserError):
        HostTier(0)
    with pytest.raises(UserError, match="unknown host policy 'fifo'"):
        HostTier(4, "fifo")


# -- the lru host policy -----------------------------------------------------------------

def test_lru_uses_a_finished_request_from_tail_to_head():
    lru = HostLRU()
    for k in "abcdef":
        lru.insert(k)
    lru.on_request_finished(["d", "e", "f"])  # head d is used last: most recent
    assert lru.evict(3, set()) == ["a", "b", "c"]
    assert lru.evict(1, set()) == ["f"]
    assert lru.evict(1, {"e"}) == ["d"]
    assert lru.evict(2, set()) is None and len(lru) == 1  # too few: nothing removed


# -- the project's eviction policies as host policies --------------------------------

def test_a_wrapped_policy_keeps_its_order_through_the_key_mapping():
    """The project's lru (first candidate first out) wrapped as a host policy orders
    chunks as vLLM's lru does when nothing is protected."""
    from vllm_admission.core.eviction import LRUEviction
    ours, vllms = HostEviction(LRUEviction()), HostLRU()
    for policy in (ours, vllms):
        for k in "abcdef":
            policy.insert(k)
        policy.on_request_finished(["d", "e", "f"], {"e"})
    assert ours.evict(3, set()) == vllms.evict(3, set()) == ["a", "b", "c"]
    assert ours.evict(1, set()) == vllms.evict(1, set()) == ["f"]
    assert ours.now == 1


def test_a_wrapped_policy_evicts_atomically_around_protected_keys():
    from vllm_admission.core.eviction import LRUEviction
    policy = HostEviction(LRUEviction())
    for k in "abc":
        policy.insert(k)
    assert policy.evict(3, {"a"}) is None and len(policy) == 3      # nothing removed
    assert policy.evict(1, {"a"}) == ["b"]
    # a was withdrawn for the call and is a candidate again, after c: used then.
    assert policy.evict(2, set()) == ["c", "a"] and len(policy) == 0
    policy.insert("x")
    policy.discard("x")
    policy.discard("never held")
    assert "x" not in policy and policy.evict(1, set()) is None


def test_ids_are_given_back_so_a_long_run_keeps_them_bounded():
    from vllm_admission.core.eviction import get_eviction
    policy = HostEviction(get_eviction("reuse"))
    for i in range(1000):
        policy.insert(("k", i))
        if len(policy) > 8:
            policy.evict(1, set())
    assert len(policy) == 8 and policy._next_id <= 9


def test_s3fifo_in_the_host_tier_keeps_a_reused_prefix_through_a_scan():
    """A prefix loaded once (a reuse) survives one-time prompts that push it out of
    vLLM's lru: S3-FIFO promotes what was hit and drops what was not."""
    def run(policy):
        tier = HostTier(6, policy)
        prefix = [(("p", i), 0) for i in range(3)]
        for keys in [prefix, prefix] + [[((tag, i), 0) for i in range(3)] for tag in "xyz"]:
            req = HostRequest()
            tier.store(req, keys)  # the second time the prefix is found stored: a reuse
            tier.settle()          # written before the next request
            tier.finish(req, [], 0, (), B)
        tier.flush()
        return sum(key in tier.policy for key, _ in prefix)

    assert run("lru") == 0
    assert run("s3fifo") == 3


def test_a_chunk_in_transfer_is_not_evicted():
    """A store is written during the engine's next step and a load within its own: until
    then vLLM pins the chunks (nonzero ``ref_cnt``) and no policy may pick them."""
    tier = HostTier(2)
    req = HostRequest()
    assert tier.store(req, [(("a", 0), 1)])
    tier.next_step()
    assert tier.store(req, [(("b", 0), 2)])
    assert not tier.store(req, [(("c", 0), 3)])    # a being written, b just inserted
    tier.next_step()
    assert tier.store(req, [(("c", 0), 3)])        # a written: the victim
    assert "a" not in {k[0] for k in tier.policy._order}
    tier.settle()
    h = ["c"]
    tier.load(HostRequest(), h, 0, B, B, (0,), ())  # c loading
    assert tier.store(req, [(("d", 0), 4)]) and ("c", 0) in tier.policy


def test_only_policies_that_need_nothing_vllm_withholds_run_in_the_host_tier():
    names = host_policy_names()
    assert names[0] == "lru" and {"s3fifo", "reuse"} <= set(names)
    for name, why in (("flop", "FLOP values"), ("belady", "the future"),
                      ("conversation", "each request's prompt")):
        assert name not in names
        with pytest.raises(UserError, match=f"{name!r} cannot run in the host tier: it needs {why}"):
            check_host_tier(name)


# -- lookup ------------------------------------------------------------------------------

def _tier_with(keys, n=100):
    tier = HostTier(n)
    tier.store(HostRequest(), [(k, 0) for k in keys])
    return tier


def test_a_host_hit_needs_consecutive_kv_chunks_and_a_state_at_its_end():
    h = list(range(10))  # 10 full blocks
    attn, state = (1,), (0,)
    tier = _tier_with([(h[i], 1) for i in range(6)] + [(h[3], 0), (h[5], 0)])
    # Prompt of 10 blocks + 1 token: may reach 10 blocks; KV runs to 6 blocks; the
    # highest state at or below is at 6 blocks.
    assert tier.hit_end(h, 0, 10 * B + 1, B, attn, state) == 6 * B
    # From an engine hit of 4 blocks: the state at 6 blocks is still the end.
    assert tier.hit_end(h, 4 * B, 10 * B + 1, B, attn, state) == 6 * B
    # An engine hit at 6 blocks: nothing beyond.
    assert tier.hit_end(h, 6 * B, 10 * B + 1, B, attn, state) == 6 * B
    # A hole in the KV at block 2: only the state at 2 blocks... none there, so none.
    holed = _tier_with([(h[i], 1) for i in (0, 1, 3, 4, 5)] + [(h[3], 0), (h[5], 0)])
    assert holed.hit_end(h, 0, 10 * B + 1, B, attn, state) == 0


def test_a_host_hit_keeps_the_last_prompt_token_back():
    h = list(range(4))
    tier = _tier_with([(x, g) for x in h for g in (0, 1)])
    # A 4-block prompt may hit 3 blocks only ((P - 1) // B); one token more reaches 4.
    assert tier.hit_end(h, 0, 4 * B, B, (1,), (0,)) == 3 * B
    assert tier.hit_end(h, 0, 4 * B + 1, B, (1,), (0,)) == 4 * B


# -- stores -------------------------------------------------------------------------------

def test_a_store_is_all_or_nothing_and_never_evicts_its_own_keys():
    tier = HostTier(4)
    req = HostRequest()
    assert tier.store(req, [(("a", 0), 1), (("b", 0), 2), (("c", 0), 3)])
    tier.settle()  # written
    # Three new keys into one free chunk: two of a, b, c must go; c is offered again
    # (protected), so a and b are evicted.
    assert tier.store(req, [(("c", 0), 3), (("d", 0), 4), (("e", 0), 5), (("f", 0), 6)])
    assert [k in tier.policy for k in (("a", 0), ("b", 0), ("c", 0))] == [False, False, True]
    assert tier.evicted == 2
    # Five keys cannot fit four chunks: refused, nothing inserted or evicted.
    assert not tier.store(req, [((x, 0), 9) for x in "vwxyz"])
    assert tier.failed_stores == 1 and len(tier) == 4 and tier.evicted == 2


# -- the cache model with a host tier --------------------------------------------------------

def make_cache(admission, host_chunks=0, num_blocks=14, host_admission=None):
    layout = CacheLayout(PoolSpec(num_blocks=num_blocks, block_size=B, group_kinds=GROUPS),
                         SchedulingSpec(chunk_size=4096),
                         host=HostTierSpec(chunks=host_chunks, admission=host_admission))
    return HybridPrefixCache(layout, admission=get_admission(admission), eviction=get_eviction("lru"))


def _serve(cache, prompts, output_len=8):
    out = []
    for r, p in enumerate(prompts):
        o = cache.serve(chained_hashes(p, B), len(p), output_len, r, float(r))
        out.append((o.hit_tokens, o.host_hit_tokens))
    return out


# A, B, C of 1,500 tokens each (5 full blocks, a state kept at the prompt end 1,280 by
# every policy but none) through a 13-block pool: A is evicted from the GPU by B and C.
PROMPTS = [tokens("A", 1500), tokens("B", 1500), tokens("C", 1500),
           tokens("A", 1500) + tokens("a", 50), tokens("B", 1500)]


@pytest.mark.parametrize("admission", ["vllm", "last", "marconi", "dense"])
def test_a_prefix_evicted_from_the_gpu_comes_back_from_the_host(admission):
    assert _serve(make_cache(admission), PROMPTS)[3:] == [(0, 0), (0, 0)]
    cache = make_cache(admission, host_chunks=64)
    got, host = _serve(cache, PROMPTS), cache.host
    assert got[3:] == [(1280, 1280), (1280, 1280)]
    # Loads: 5 KV chunks and 1 state, twice.
    assert host.loaded == 12 and host.hit_tokens == 2 * 1280


def test_no_state_on_the_gpu_means_no_state_on_the_host():
    cache = make_cache("none", host_chunks=64)
    host = cache.host
    assert _serve(cache, PROMPTS) == [(0, 0)] * 5
    assert host.stored == 16 and host.loaded == 0  # KV chunks only: 5 + 5 + 5 + 1


def test_dense_admission_sends_every_prompt_state_to_the_host_and_output_stays_behind():
    cache = make_cache("dense", host_chunks=200)
    host = cache.host
    p = tokens("P", 1300)  # 5 full prompt blocks; output runs into block 6
    cache.serve(chained_hashes(p, B), len(p), 300, 0, 0.0)
    state_keys = {k for k in host.policy._order if k[1] == 0}
    assert len(state_keys) == 5 and len(host) == 10  # 5 states + 5 KV chunks, none of output


def test_a_host_load_after_a_local_hit_references_no_local_state():
    """A local hit at the shared prefix's junction (4 blocks), the rest of the prompt
    from the host: vLLM's state groups skip every block before the load's end
    (``add_local_computed_blocks``), so the local state block is never referenced and
    stays a free candidate where it was; the attention blocks of the local hit are."""
    S = tokens("S", 4 * B)
    first, second = S + tokens("a", 4 * B + 10), S + tokens("b", 4 * B + 10)
    cache = make_cache("vllm", host_chunks=200)
    _serve(cache, [first, second])
    touched = []
    touch = cache.pool.touch

    def spy(blocks, now):
        touched.extend(cache.pool.group[b] for b in blocks)
        return touch(blocks, now)

    cache.pool.touch = spy
    out = cache.serve(chained_hashes(first, B), len(first), 8, 2, 2.0)
    assert (out.hit_tokens, out.host_hit_tokens) == (8 * B, 4 * B)
    assert touched == [GROUPS.index("attention")] * 4


def test_per_tier_admission_sends_extra_states_to_the_host_only():
    """``marconi`` on the GPU and ``dense`` for the host tier: every block boundary of the
    first prompt is a state, the GPU keeps only marconi's (as without the host policy),
    the host gets them all, so a second prompt that leaves the first after 6 blocks hits
    there at its first sighting, from the host."""
    shared = tokens("S", 10 * B)
    first = shared + tokens("a", 3 * B + 10)
    second = shared[:6 * B] + tokens("b", 5 * B + 10)

    def run(host_admission):
        cache = make_cache("marconi", host_chunks=400, num_blocks=40, host_admission=host_admission)
        o1 = cache.serve(chained_hashes(first, B), len(first), 8, 0, 0.0)
        gpu_states = cache.state_checkpoints
        host_states = sum(1 for _, g in cache.host.policy._order if g == 0)
        o2 = cache.serve(chained_hashes(second, B), len(second), 8, 1, 1.0)
        return o1, gpu_states, host_states, o2

    o1, gpu, host, o2 = run(None)
    # The host got marconi's tentative prompt-end state only; the second prompt misses.
    assert (o2.hit_tokens, host) == (0, 1)
    d1, dgpu, dhost, d2 = run("dense")
    assert dgpu == gpu                          # nothing more held on the GPU
    assert dhost == 13                          # every block boundary of the prompt
    assert (d2.hit_tokens, d2.host_hit_tokens) == (6 * B, 6 * B)
    assert d1.prefill_steps > o1.prefill_steps  # the host's positions end chunks
    with pytest.raises(UserError, match="needs a host tier"):
        make_cache("marconi", num_blocks=40, host_admission="dense")


def test_the_host_tier_is_cloned_with_the_cache():
    cache = make_cache("vllm", host_chunks=64)
    _serve(cache, PROMPTS[:1])
    copy = cache.clone()
    _serve(copy, PROMPTS[1:3])
    assert len(copy.host) > len(cache.host) and copy.host is not cache.host


# -- the simulator ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def synthetic():
    return load_trace("synthetic", max_requests=300, seed=0)


@pytest.fixture(scope="module")
def qwen():
    return load_model("qwen3-next-80b-a3b")


def test_simulate_reports_hits_by_tier_and_bytes_moved(synthetic, qwen):
    gpu = simulate(synthetic, qwen, SimulationSettings.of("vllm", "lru", capacity_bytes=2 << 30))
    both = simulate(synthetic, qwen, SimulationSettings.of("vllm", "lru", capacity_bytes=2 << 30,
                                                        host_bytes=64 << 30, host_bandwidth=50e9))
    assert gpu.host.chunks == 0 and gpu.host_hit_tokens == 0
    assert both.host.chunks == host_chunks(64 << 30, qwen_bytes_per_block(both, qwen))
    assert both.hit_tokens > gpu.hit_tokens
    assert 0 < both.host_hit_tokens <= both.hit_tokens
    # The GPU part of the hits can only shrink: loads allocate GPU blocks too.
    assert both.hit_tokens - both.host_hit_tokens <= gpu.hit_tokens
    assert both.host.bytes_loaded == both.host.loaded_chunks * qwen_bytes_per_block(both, qwen)
    assert both.host.load_seconds == pytest.approx(both.host.bytes_loaded / 50e9)
    # A chunk stored once may be loaded many times.
    assert both.host.stored_chunks > 0 and both.host.loaded_chunks > 0


def qwen_bytes_per_block(result, costs):
    from vllm_admission.core.geometry import geometry_from_blocks

    return geometry_from_blocks(costs, result.num_blocks, result.block_size).bytes_per_block


def test_simulate_refuses_what_the_host_tier_does_not_model(synthetic, qwen):
    with pytest.raises(UserError, match="holds no"):
        simulate(synthetic, qwen, SimulationSettings.of("vllm", "lru", capacity_bytes=2 << 30,
                                                     host_bytes=1024))
    with pytest.raises(UserError, match="speculative decoding"):
        simulate(synthetic, load_model("qwen3-next-80b-a3b", mtp=True),
                 SimulationSettings.of("vllm", "lru", capacity_bytes=2 << 30,
                                    host_bytes=64 << 30, num_speculative_tokens=1))
    with pytest.raises(UserError, match="unknown host policy"):
        simulate(synthetic, qwen, SimulationSettings.of("vllm", "lru", capacity_bytes=2 << 30,
                                                     host_bytes=64 << 30, host_policy="no-such-policy"))


def test_auto_scales_the_host_tier_of_its_sampled_shadows(synthetic, qwen):
    res = simulate(synthetic, qwen, SimulationSettings.of("auto", "lru", capacity_bytes=2 << 30,
                                                       host_bytes=64 << 30, shadow_rate=0.5))
    assert res.host.chunks > 0 and res.host_hit_tokens > 0
    lay = CacheLayout(PoolSpec(num_blocks=101, block_size=B, group_kinds=GROUPS),
                      SchedulingSpec(chunk_size=4096), host=HostTierSpec(chunks=40))
    assert dataclasses.replace(lay, host=HostTierSpec(chunks=20)).host.chunks == 20
