"""The block-level hybrid cache model: exact hits on hand-derived cases, vLLM's
free-queue order against a literal reference, and properties on random traces."""

import random

import pytest
from block_hashes import chained_hashes
from hypothesis import given, settings
from hypothesis import strategies as st
from junction_case import WRITTEN_OUT_B256, expected_junction

from vllm_admission.core.admission import ADMISSION_POLICIES, get_admission
from vllm_admission.core.cache import BlockPool, HybridPrefixCache, PoolExhausted
from vllm_admission.core.eviction import LRUEviction, get_eviction
from vllm_admission.core.layout import CacheLayout, PoolSpec, SchedulingSpec, SpeculationSpec

B = 256
GROUPS = ("state", "attention")


def make_cache(admission="vllm", eviction="lru", num_blocks=10_000, groups=GROUPS, chunk=8192,
               num_speculative_tokens=0, eagle=True, async_scheduling=False, bytes_per_block=1,
               **hooks):
    """A cache of ``B``-token blocks; ``hooks``: :class:`HybridPrefixCache`'s keyword
    arguments (callbacks the eviction policy needs are supplied)."""
    ev = get_eviction(eviction)
    if ev.needs_values:
        hooks.setdefault("segment_flops", lambda end, start: float(end * end - start * start))
    if ev.needs_future:
        hooks.setdefault("next_use", lambda h, r: float("inf"))
    layout = CacheLayout(PoolSpec(num_blocks=num_blocks, block_size=B, group_kinds=groups,
                                  bytes_per_block=bytes_per_block),
                         SchedulingSpec(chunk_size=chunk, async_scheduling=async_scheduling),
                         SpeculationSpec(num_speculative_tokens=num_speculative_tokens, eagle=eagle))
    return HybridPrefixCache(layout, admission=get_admission(admission), eviction=ev, **hooks)


def chained(tokens):
    return chained_hashes(tokens, B)


def sibling(r, shared=1500, suffix=300):
    tokens = ["s"] * shared + [("x", r)] + [("t", k) for k in range(suffix)]
    return chained(tokens), len(tokens)


# --- exact numbers on the junction case ---------------------------------------------
# Ten prompts = the same 1,500-token prefix + 1 distinct token + the same 300-token
# suffix (1,801 tokens, 7 full blocks of 256). The shared part covers 5 full blocks
# (1,280 tokens): block 5 holds the distinct token 1,500.
#  * last:    each prompt caches a state only at its own prompt end (1,792), which no
#             sibling shares -> 0 hits everywhere.
#  * vllm / marconi: prompt 2 finds 5 cached KV blocks but no state -> junction at
#             1,280, a chunk stops there and the state is cached; prompts 3..10 hit 1,280.
#  * dense:   prompt 1 caches a state at every block -> prompts 2..10 hit 1,280.
#  * none:    no state ever -> 0.
# tests/junction_case.py derives this for every registered policy from its own answers.
EXPECTED_JUNCTION = expected_junction(B)


def test_the_derived_junction_case_is_the_written_out_one():
    assert {n: EXPECTED_JUNCTION[n] for n in WRITTEN_OUT_B256} == WRITTEN_OUT_B256


@pytest.mark.parametrize("policy", sorted(ADMISSION_POLICIES))
def test_junction_case_exact_hits(policy):
    cache = make_cache(policy)
    hits = []
    for r in range(10):
        hashes, n = sibling(r)
        hits.append(cache.serve(hashes, n, 4, rid=r, now=float(r)).hit_tokens)
    assert hits == EXPECTED_JUNCTION[policy]


# --- the same prompt twice: the second sighting ------------------------------------
# A 3,740-token prompt (14 full blocks and 156 tokens) sent twice. Its last block boundary,
# 3,584, is where vLLM 0.32 ends its first prefill chunk (the prompt's last cacheable
# position), so every policy that keeps the prompt-end state hits all of it on the second
# sighting; `none` keeps no state. (The engine agrees once its block size survives the
# engine-core handshake: docs/engine-facts.md section 11, tests/test_second_sighting.py.)
@pytest.mark.parametrize("policy", sorted(ADMISSION_POLICIES))
def test_a_prompt_sent_twice_hits_on_its_second_sighting(policy):
    tokens = [("p", k) for k in range(14 * B + 156)]
    cache = make_cache(policy)
    hits = [cache.serve(chained(tokens), len(tokens), 4, rid=r, now=float(r)).hit_tokens
            for r in range(2)]
    assert hits == [0, 0 if policy == "none" else 14 * B]


def test_junction_is_reported_and_checkpointed_once():
    cache = make_cache("vllm")
    outs = [cache.serve(*sibling(r), 4, rid=r, now=float(r)) for r in range(3)]
    assert [o.junction for o in outs] == [0, 1280, 0]
    # prompt 1: its prompt end; prompt 2: junction + its prompt end; prompt 3: its prompt end
    assert [o.checkpoints for o in outs] == [1, 2, 1]


def test_hit_is_capped_at_prompt_len_minus_one_block_floored():
    # An identical 2-block prompt sent twice: the last token must be recomputed, so the
    # hit is (512 - 1) // 256 * 256 = 256, not 512.
    cache = make_cache("vllm")
    hashes = chained(["a"] * 512)
    cache.serve(hashes, 512, 1, rid=0, now=0.0)
    assert cache.serve(hashes, 512, 1, rid=1, now=1.0).hit_tokens == 256


def test_marconi_keeps_the_sequence_end_not_the_prompt_end():
    # Prompt 1,000 tokens, output 600: the sequence reaches token 1,599, its last block
    # boundary is 1,536 (a decode boundary). marconi caches that state only; vllm caches
    # the prompt end (768).
    hashes = chained(["p"] * 1000)
    for policy, expect in (("marconi", [1536]), ("vllm", [768]), ("last", [768, 1024, 1280, 1536])):
        cache = make_cache(policy)
        seen = []
        orig = cache.pool.cache_position  # how the cache model caches a state position

        def spy(blocks, block_hash, seen=seen, orig=orig, **kw):
            if any(g == 0 for g, _ in blocks):  # the state group
                seen.append(block_hash)
            orig(blocks, block_hash, **kw)

        cache.pool.cache_position = spy
        cache.serve(hashes, 1000, 600, rid=0, now=0.0)
        positions = [(key[2] + 1) * B if isinstance(key, tuple) else (hashes.index(key) + 1) * B
                     for key in seen]
        assert positions == expect, policy


@pytest.mark.parametrize("policy,state_keys", [
    ("last", ["p2", ("out", 3), ("out", 4), ("out", 5)]),
    ("marconi", []),   # its one state (1,536) is kept only as the sequence end
    ("vllm", ["p2"]),
])
def test_a_keyed_policy_hears_prompt_hashes_and_new_keys_for_outputs(policy, state_keys):
    """What ``on_cache`` reports (the plugin reports the same, tests/test_plugin_scheduler.py):
    a prompt block's hash, a key of its own for a block holding generated tokens, and
    nothing for a state a live engine could only cache tentatively (marconi's sequence
    end). Prompt 1,000 tokens (3 full blocks), output 600: blocks 3..5 hold outputs."""
    hashes = chained(["p"] * 1000)
    cache = make_cache(policy, "reuse")
    heard = []
    orig = cache.eviction.on_cache
    cache.eviction.on_cache = lambda block, key: (heard.append(key), orig(block, key))
    cache.serve(hashes, 1000, 600, rid=0, now=0.0)
    named = {h: f"p{i}" for i, h in enumerate(hashes)}

    def show(key):
        return named[key] if key in named else key[:1] + key[2:]

    assert sorted(map(show, (k[1] for k in heard if k[0] == 1)), key=str) == \
        sorted(["p0", "p1", "p2", ("out", 3), ("out", 4), ("out", 5)], key=str)
    assert [show(k[1]) for k in heard if k[0] == 0] == state_keys


def test_long_prompt_chunks_end_on_block_boundaries():
    # chunk budget 600 < prompt 2,000: vllm's split ends chunks at 512, 1,024, 1,536 and
    # stops at the last reusable boundary 1,792; `last` keeps all those chunk-end states.
    cache = make_cache("last", chunk=600)
    hashes = chained(["q"] * 2000)
    out = cache.serve(hashes, 2000, 1, rid=0, now=0.0)
    assert out.checkpoints == 4  # 512, 1024, 1536, 1792
    assert out.prefill_steps == 5  # ... and the last chunk 1,792 -> 2,000
    again = cache.serve(hashes, 2000, 1, rid=1, now=1.0)
    assert again.hit_tokens == 1792
    assert again.prefill_steps == 1


# --- the pool against a literal reference of vLLM's free-block queue ----------------
class ReferenceQueue:
    """vLLM 0.32 free_block_queue, literally: a list of blocks; freed blocks without
    a hash are prepended, cached ones appended; allocation pops the head and drops the
    popped block's hash (block_pool.py: free_blocks, get_new_blocks)."""

    def __init__(self, n):
        self.queue = [[i, None] for i in range(1, n)]  # [id, key]
        self.index = {}
        self.evicted = []

    def allocate(self, k):
        out = self.queue[:k]
        del self.queue[:k]
        for blk in out:
            if blk[1] is not None:
                self.evicted.append(blk[1])
                del self.index[blk[1]]
                blk[1] = None
        return out

    def free(self, blocks):
        self.queue[:0] = [b for b in blocks if b[1] is None]
        self.queue.extend(b for b in blocks if b[1] is not None)

    def touch(self, blk):
        self.queue.remove(blk)

    def cache(self, blk, key):
        blk[1] = key
        self.index[key] = blk


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 10_000))
def test_lru_pool_evicts_in_vllm_queue_order(seed):
    rng = random.Random(seed)
    n = 12
    ref, pool = ReferenceQueue(n), BlockPool(n, LRUEviction())

    def cached_keys():
        return {(0, h) for h in pool.index[0]}

    next_key = 0
    for _ in range(40):
        # a "request": maybe hit some cached keys, allocate, cache some, free all
        hits = [k for k in list(ref.index) if rng.random() < 0.3][:3]
        ref_hits = [ref.index[k] for k in hits]
        pool_hits = [pool.get_cached(k) for k in hits]
        for blk in ref_hits:
            ref.touch(blk)
        pool.touch(pool_hits, now=0.0)
        k = rng.randint(1, min(4, len(ref.queue)))
        ref_new, pool_new = ref.allocate(k), pool.allocate(k, now=0.0)
        assert cached_keys() == set(ref.index)
        for rb, pb in zip(ref_new, pool_new, strict=True):
            if rng.random() < 0.6:
                ref.cache(rb, (0, next_key))
                pool.cache(pb, (0, next_key))
                next_key += 1
        order = list(range(len(ref_hits) + k))
        rng.shuffle(order)
        ref_all, pool_all = ref_hits + ref_new, pool_hits + pool_new
        ref.free([ref_all[i] for i in order])
        pool.free([pool_all[i] for i in order], now=0.0)
        assert cached_keys() == set(ref.index)  # the same blocks were evicted
        assert pool.evictions == len(ref.evicted)
        assert pool.num_free == len(ref.queue)


# --- properties on random traces ------------------------------------------------------
def random_trace(rng, n_requests=30, n_prefixes=4):
    """Requests share one of a few prefixes, then diverge; lengths in blocks vary."""
    reqs = []
    for r in range(n_requests):
        p = rng.randrange(n_prefixes)
        shared = rng.randint(0, 6) * B + rng.randint(0, B - 1)
        tail = rng.randint(1, 3 * B)
        tokens = [("p", p)] * shared + [("u", r)] * tail
        reqs.append((chained(tokens), len(tokens), rng.randint(1, 2 * B)))
    return reqs


def kv_bound(reqs):
    seen, total = set(), 0
    for hashes, n, _ in reqs:
        k = 0
        cap = (n - 1) // B
        while k < min(cap, len(hashes)) and hashes[k] in seen:
            k += 1
        total += k * B
        seen.update(hashes)
    return total


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(sorted(ADMISSION_POLICIES)),
       eviction=st.sampled_from(["lru", "flop", "belady"]), blocks=st.integers(12, 80))
def test_occupancy_bounded_no_leak_and_never_above_bound(seed, policy, eviction, blocks):
    rng = random.Random(seed)
    reqs = random_trace(rng)
    cache = make_cache(policy, eviction, num_blocks=blocks,
                       groups=("state", "attention", "state"))
    total = 0
    for r, (hashes, n, out) in enumerate(reqs):
        if not cache.fits(n, out):
            continue
        total += cache.serve(hashes, n, out, rid=r, now=float(r)).hit_tokens
        pool = cache.pool
        assert pool.num_used == 0  # every block of the finished request came back
        assert pool.num_cached_entries <= blocks - 1
        assert 0 <= pool.num_free_uncached <= blocks - 1
    assert total <= kv_bound(reqs)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_dense_with_infinite_capacity_reaches_the_kv_bound(seed):
    reqs = random_trace(random.Random(seed))
    cache = make_cache("dense", num_blocks=100_000)
    total = sum(cache.serve(h, n, o, rid=r, now=float(r)).hit_tokens
                for r, (h, n, o) in enumerate(reqs))
    assert total == kv_bound(reqs)
    assert cache.pool.evictions == 0


def test_request_that_cannot_fit_is_refused():
    cache = make_cache(num_blocks=6)
    assert not cache.fits(10 * B, 1)
    with pytest.raises(PoolExhausted):
        cache.serve(chained(["z"] * 10 * B), 10 * B, 1, rid=0, now=0.0)


@pytest.mark.parametrize("policy", sorted(ADMISSION_POLICIES))
def test_under_async_scheduling_a_state_block_retires_a_step_late(policy):
    """A 6-block prompt (plus 10 tokens) in chunks of 2 blocks, one state group: each step
    retires the state blocks below the previous step's start, not its own, so at the last
    chunk the group holds 3 blocks (those at 4B and 6B, and the new one) where
    synchronous scheduling holds 2. The request runs in a pool of ``blocks_needed``
    under async scheduling, and not in one of the synchronous ``blocks_needed``."""
    n, out = 6 * B + 10, 3
    sync = make_cache(policy, num_blocks=11, chunk=2 * B)
    need = sync.blocks_needed(n, out)
    assert need == 7 + 2                               # 7 attention blocks, 2 state blocks
    late = make_cache(policy, num_blocks=need + 1, chunk=2 * B, async_scheduling=True)
    assert late.blocks_needed(n, out) == need + 1 and not late.fits(n, out)
    with pytest.raises(PoolExhausted):
        late.serve(chained(["a"] * n), n, out, rid=0, now=0.0)
    steps = []
    for cache in (make_cache(policy, num_blocks=need + 1, chunk=2 * B),
                  make_cache(policy, num_blocks=need + 2, chunk=2 * B, async_scheduling=True)):
        steps.append(cache.serve(chained(["a"] * n), n, out, rid=0, now=0.0).prefill_steps)
        assert cache.pool.num_free == cache.pool.num_blocks - 1
    assert steps[0] == steps[1] >= 4


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(sorted(ADMISSION_POLICIES)),
       eviction=st.sampled_from(["lru", "flop", "s3fifo"]), blocks=st.integers(16, 60),
       spec=st.integers(0, 2))
def test_a_hidden_state_group_is_reused_like_attention_and_counted_apart(seed, policy, eviction,
                                                                         blocks, spec):
    """vLLM's hidden-state group (``HiddenStateCacheSpec``, run by ``FullAttentionManager``):
    a cache with one is, request by request, the cache with one more attention group in
    its place: the same hits, prefill steps and evictions, with the third group's
    evictions counted under its own kind; also with draft tokens without EAGLE's rules
    (``extract_hidden_states``)."""
    reqs = random_trace(random.Random(seed))
    hidden = make_cache(policy, eviction, num_blocks=blocks, num_speculative_tokens=spec,
                        eagle=False, groups=("state", "attention", "hidden"))
    twin = make_cache(policy, eviction, num_blocks=blocks, num_speculative_tokens=spec,
                      eagle=False, groups=("state", "attention", "attention"))
    assert hidden.group_kinds[2] == "hidden" and hidden.attn_groups == (1, 2)
    for r, (hashes, n, out) in enumerate(reqs):
        if not hidden.fits(n, out):
            continue
        got = hidden.serve(hashes, n, out, rid=r, now=float(r))
        assert got == twin.serve(hashes, n, out, rid=r, now=float(r))
    assert hidden.pool.evictions_by_group == twin.pool.evictions_by_group


def test_without_eagle_rules_the_lookup_keeps_its_last_block():
    """One draft token without EAGLE's rules (``extract_hidden_states``): the lookup does
    not drop the last matched block and the prompt checkpoint stays at the last full
    block, as without speculative decoding; under EAGLE/MTP both are a block lower."""
    prompt = chained(["p"] * (3 * B + 10))
    hits = {}
    for eagle in (False, True):
        cache = make_cache(num_speculative_tokens=1, eagle=eagle,
                           groups=("state", "attention", "hidden"))
        cache.serve(prompt, 3 * B + 10, 4, rid=0, now=0.0)
        hits[eagle] = cache.serve(prompt, 3 * B + 10, 4, rid=1, now=1.0).hit_tokens
    assert hits == {False: 3 * B, True: 2 * B}


def test_group_kinds_must_mix_attention_and_state():
    with pytest.raises(ValueError, match="mix"):
        make_cache(groups=("attention", "attention"))


# --- vLLM's prefix_cache_retention_interval (the stock policy) -----------------------
@pytest.mark.parametrize("interval,kept", [(0, [1792]), (1024, [1024, 1792]),
                                           (None, [512, 1024, 1536, 1792])])
def test_retention_interval_keeps_the_chunk_ends_on_its_grid(interval, kept):
    """A 2,000-token prompt in chunks of 600 writes states at 512, 1,024, 1,536 and the
    prompt end 1,792 (as above). vLLM with retention 0 keeps the prompt end only, with
    1,024 also the chunk end on that grid, with None every one; a later prompt sharing
    the first 1,300 tokens then hits the deepest kept state at or below 1,280."""
    layout = CacheLayout(PoolSpec(num_blocks=10_000, block_size=B, group_kinds=GROUPS,
                                  retention_interval=interval), SchedulingSpec(chunk_size=600))
    cache = HybridPrefixCache(layout, admission=get_admission("vllm", retention_interval=interval),
                              eviction=get_eviction("lru"))
    out = cache.serve(chained(["q"] * 2000), 2000, 1, rid=0, now=0.0)
    assert out.checkpoints == len(kept)
    other = chained(["q"] * 1300 + ["r"] * 700)
    hit = cache.serve(other, 2000, 1, rid=1, now=1.0).hit_tokens
    assert hit == max([p for p in kept if p <= 1280], default=0)


def test_a_retention_interval_off_the_block_grid_is_refused():
    with pytest.raises(ValueError, match=r"multiple of the block size \(256\)"):
        PoolSpec(num_blocks=100, block_size=B, group_kinds=GROUPS, retention_interval=300)


def test_on_request_hears_the_prompts_full_blocks_only():
    """The simulator tells a policy that needs requests the prompt's full-block keys, the
    same the plugin can know at the lookup (``PolicyEvents.on_request``), also when the
    request's hashes run on through its output (a trace that records outputs; issue 34)."""
    from vllm_admission.core.eviction import get_eviction

    prompt = ["p"] * 1000            # 3 full blocks of 256, then 232 tokens
    hashes = chained(prompt + ["o"] * 600)   # the chain through the output: 6 full blocks
    ev = get_eviction("conversation")
    assert ev.needs_requests
    heard = []
    orig = ev.on_request
    ev.on_request = lambda keys, now: (heard.append(list(keys)), orig(keys, now))
    cache = HybridPrefixCache(CacheLayout(PoolSpec(num_blocks=10_000, block_size=B, group_kinds=GROUPS),
                                          SchedulingSpec(chunk_size=8192)),
                              admission=get_admission("vllm"), eviction=ev)
    cache.serve(hashes, 1000, 600, rid=0, now=0.0)
    assert heard == [hashes[:3]]
