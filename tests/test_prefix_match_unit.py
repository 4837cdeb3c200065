"""A hash block finer than the block (vLLM's ``prefix_match_unit``) in the cache model.

The engine facts are in docs/engine-facts.md section 10; ``test_fidelity.py`` checks the
model against the live engine request by request. Here: the rules on hand-derived cases,
the block accounting (copies, moved keys, duplicate keys) and properties on random traces.
"""

import random

import pytest
from block_hashes import chained_hashes
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_admission.core.admission import ADMISSION_POLICIES, get_admission
from vllm_admission.core.cache import HybridPrefixCache
from vllm_admission.core.eviction import get_eviction
from vllm_admission.core.layout import CacheLayout, PoolSpec, SchedulingSpec, SpeculationSpec
from vllm_admission.sim.simulator import cache_requests

U = 32
GROUPS = ("state", "attention", "attention")


def make_cache(B, hash_block_size=U, admission="vllm", eviction="lru", num_blocks=10_000, chunk=4096,
               groups=GROUPS, spec=0):
    ev = get_eviction(eviction)
    hooks = {}
    if ev.needs_values:
        hooks["segment_flops"] = lambda end, start: float(end * end - start * start)
    layout = CacheLayout(PoolSpec(num_blocks=num_blocks, block_size=B, group_kinds=groups,
                                  hash_block_size=hash_block_size),
                         SchedulingSpec(chunk_size=chunk), SpeculationSpec(num_speculative_tokens=spec))
    return HybridPrefixCache(layout, admission=get_admission(admission), eviction=ev, **hooks)


def serve_all(cache, prompts, outputs=8):
    """Serve token lists one at a time; return ``(hit tokens, prefill steps)`` per prompt."""
    B, u = cache.block_size, cache.hash_block_size
    out = []
    for r, tokens in enumerate(prompts):
        res = cache.serve(chained_hashes(tokens, B), len(tokens), outputs, r, float(r),
                          chained_hashes(tokens, u))
        out.append((res.hit_tokens, res.prefill_steps))
        assert cache.pool.num_used == 0
    return out


def tokens(n, label):
    return [(label, i) for i in range(n)]


def unit_end(P, unit):
    """The prompt's unit end: its last reusable position at the hash block."""
    return (P - 1) // unit * unit


@pytest.mark.parametrize("B", [128, 256])
@pytest.mark.parametrize("P", [100, 300, 1000, 3740])
def test_a_resend_hits_the_prompts_unit_end(B, P):
    """The same prompt three times: the second and third hit at ``T = (P - 1) // u * u``
    (a full block boundary when T is one), where whole blocks give ``(P - 1) // B * B``."""
    prompt = tokens(P, "a")
    hits = [h for h, _ in serve_all(make_cache(B), [prompt] * 3)]
    assert hits == [0, unit_end(P, U), unit_end(P, U)]
    whole = [h for h, _ in serve_all(make_cache(B, hash_block_size=None), [prompt] * 3)]
    assert whole == [0, unit_end(P, B), unit_end(P, B)]


@pytest.mark.parametrize("B", [128, 256])
@pytest.mark.parametrize("P", [100, 300, 1000, 3740, 2 * 128 + 32 + 5])
def test_under_eagle_a_resend_hits_one_unit_below_the_last_unit_it_can_match(B, P):
    """EAGLE/MTP with a unit: the lookup matches up to ``P // u * u`` and drops one unit,
    and the state at the prompt's unit end is there, ``P // u * u - u``, inside a block or on a block
    boundary (a state of its own then); without the unit the drop is a whole block."""
    prompt = tokens(P, "a")
    hits = [h for h, _ in serve_all(make_cache(B, spec=1), [prompt] * 3)]
    assert hits == [0, P // U * U - U, P // U * U - U]
    whole = [h for h, _ in serve_all(make_cache(B, hash_block_size=None, spec=1), [prompt] * 3)]
    assert whole[1] == whole[2] == max(P // B * B - B, 0) and whole[1] < hits[1]


@pytest.mark.parametrize("B", [128, 256])
def test_the_first_sighting_pays_one_more_prefill_step_only_when_the_unit_end_is_inside_a_block(B):
    for P in (300, 1000, 3740):
        (_, with_unit), = serve_all(make_cache(B), [tokens(P, "a")])
        (_, without), = serve_all(make_cache(B, hash_block_size=None), [tokens(P, "a")])
        inside = unit_end(P, U) % B != 0
        assert with_unit == without + inside


@pytest.mark.parametrize("B", [128, 256])
def test_a_prompt_sharing_part_of_a_block_hits_only_an_earlier_prompts_unit_end(B):
    """980 tokens of a 1,000-token prompt: the attention lookup finds no key inside the
    block the two share in part, so the hit stays at the block boundary; the chat's next
    turn (the prompt, 4 output tokens, 200 more) hits the first turn's unit end."""
    first = tokens(1000, "a")
    assert serve_all(make_cache(B), [first, first[:980] + tokens(40, "b")])[1][0] == 1000 // B * B
    chat = tokens(700, "c")
    assert serve_all(make_cache(B), [chat, chat + tokens(204, "d")])[1][0] == unit_end(700, U)


@pytest.mark.parametrize("B", [128, 256])
def test_junctions_stay_on_block_boundaries(B):
    """Siblings sharing 1,500 tokens: the junction is the block boundary below the shared
    part with or without a unit (vLLM floors ``shared_prefix_boundary`` to the block)."""
    prompts = [tokens(1500, "s") + [("x", r)] + tokens(300, "t") for r in range(5)]
    with_unit = [h for h, _ in serve_all(make_cache(B), prompts)]
    assert with_unit == [h for h, _ in serve_all(make_cache(B, hash_block_size=None), prompts)]
    assert with_unit[2:] == [1500 // B * B] * 3


def test_a_sub_block_hit_copies_the_shared_block_in_every_group_and_leaves_one_more_key():
    """Each identical resend hits the unit end, takes a private copy of the block holding it in
    every group and keys its attention copy with the sub-block key again (one more cached
    attention entry per attention group); the state key stays on one block."""
    B, P = 128, 300
    cache = make_cache(B)
    prompt = tokens(P, "a")
    serve_all(cache, [prompt])
    pool = cache.pool
    key = chained_hashes(prompt, U)[unit_end(P, U) // U - 1]
    entries = pool.num_cached_entries
    for k in range(1, 4):
        serve_all(cache, [prompt])
        assert pool.num_cached_entries == entries + k * len(cache.attn_groups)
        assert all(pool.index[g].get(key) is not None for g in range(len(GROUPS)))
    assert pool.evictions_by_group == [0, 0, 0]


def test_marconi_keeps_no_unit_end_state_but_vllm_ends_a_chunk_there_all_the_same():
    B, P = 128, 300
    prompt = tokens(P, "a")
    marconi = serve_all(make_cache(B, admission="marconi"), [prompt] * 2)
    assert marconi[1][0] % B == 0  # no hit inside a block without a state at the unit end
    assert marconi[0][1] == serve_all(make_cache(B), [prompt])[0][1]


def test_the_unit_must_divide_the_block_and_needs_unit_keys():
    with pytest.raises(ValueError, match="prefix_match_unit"):
        make_cache(128, hash_block_size=48)
    with pytest.raises(ValueError, match="split"):
        HybridPrefixCache(CacheLayout(PoolSpec(num_blocks=100, block_size=128, group_kinds=GROUPS,
                                               hash_block_size=32),
                                      SchedulingSpec(chunk_size=4096, checkpoint="inpass")),
                          admission=get_admission("vllm"), eviction=get_eviction("lru"))
    cache = make_cache(128)
    prompt = tokens(300, "a")
    with pytest.raises(ValueError, match="unit keys"):
        cache.serve(chained_hashes(prompt, 128), 300, 4, 0, 0.0)
    whole = make_cache(128, hash_block_size=128)  # the block size itself: whole blocks
    assert (whole.hash_block_size, whole.partial_hash_hits) == (128, False)


def test_the_pool_stores_vllms_hash_block_size():
    """``PoolSpec.hash_block_size`` is vLLM's: ``None`` (no ``prefix_match_unit``) is the block
    size; below it, hits may end inside a block and a block has that many vLLM hashes."""
    fine = PoolSpec(num_blocks=10, block_size=128, group_kinds=GROUPS, hash_block_size=32)
    assert (fine.hash_block_size, fine.partial_hash_hits, fine.hashes_per_block) == (32, True, 4)
    whole = PoolSpec(num_blocks=10, block_size=128, group_kinds=list(GROUPS))
    assert (whole.hash_block_size, whole.partial_hash_hits, whole.hashes_per_block) == (128, False, 1)
    assert whole.group_kinds == GROUPS and whole.state_groups == (0,) and whole.per_token_groups == (1, 2)


def test_cache_requests_carry_unit_keys_that_extend_the_block_chain():
    from vllm_admission.core.traces import load_trace

    trace = load_trace("synthetic", num_requests=6)
    reqs = cache_requests(trace, 128, "unique", 32)
    for req, r in zip(reqs, trace.requests, strict=True):
        assert len(req.units) == r.prompt_len // 32
    assert all(req.units is None for req in cache_requests(trace, 128, "unique"))


def random_prompts(rng, n=30):
    out = []
    for r in range(n):
        p = rng.randrange(3)
        shared = rng.randint(0, 900)
        prompt = tokens(shared, ("p", p)) + tokens(rng.randint(1, 400), ("u", r))
        if rng.random() < 0.3 and out:
            prompt = list(rng.choice(out))  # an identical resend
        out.append(prompt)
    return out


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(sorted(ADMISSION_POLICIES)),
       eviction=st.sampled_from(["lru", "flop", "reuse"]), blocks=st.integers(14, 60),
       B=st.sampled_from([64, 128]))
def test_no_leak_consistent_index_and_hits_above_whole_blocks_only_at_unit_ends(seed, policy,
                                                                           eviction, blocks, B):
    rng = random.Random(seed)
    cache = make_cache(B, admission=policy, eviction=eviction, num_blocks=blocks, chunk=256)
    pool = cache.pool
    unit_ends = set()
    for r, prompt in enumerate(random_prompts(rng)):
        P = len(prompt)
        if not cache.fits(P, 8):
            continue
        hit = cache.serve(chained_hashes(prompt, B), P, 8, r, float(r),
                          chained_hashes(prompt, U)).hit_tokens
        if hit % B:
            # Only an earlier prompt's unit end has a key inside a block.
            assert (tuple(prompt[:hit]), hit) in unit_ends
        t = unit_end(P, U)
        unit_ends.add((tuple(prompt[:t]), t))
        assert pool.num_used == 0
        # Every index entry names a block holding that key, in its group.
        for g, idx in enumerate(pool.index):
            for h, b in idx.items():
                assert pool.group[b] == g and h in pool.keys_of(b)
        assert all(e >= 0 for e in pool.evictions_by_group)
        assert len(pool.free_blocks) == blocks - 1


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), blocks=st.integers(14, 60), B=st.sampled_from([64, 128]))
def test_block_admission_under_a_unit_is_stock_without_it(seed, blocks, B):
    """``block`` keys nothing at the prompt's unit end (neither the state nor the attention block), so under a
    unit it hits, evicts and checkpoints exactly as stock ``vllm`` does without one; only
    the chunk that vLLM ends at each unit end adds a prefill step."""
    prompts = random_prompts(random.Random(seed))
    with_unit = make_cache(B, admission="block", num_blocks=blocks, chunk=256)
    whole = make_cache(B, hash_block_size=None, admission="vllm", num_blocks=blocks, chunk=256)
    for r, prompt in enumerate(prompts):
        P = len(prompt)
        if not with_unit.fits(P, 8):
            continue
        a = with_unit.serve(chained_hashes(prompt, B), P, 8, r, float(r), chained_hashes(prompt, U))
        b = whole.serve(chained_hashes(prompt, B), P, 8, r, float(r))
        assert (a.hit_tokens, a.checkpoints, a.evictions) == (b.hit_tokens, b.checkpoints,
                                                             b.evictions)
        assert a.prefill_steps - b.prefill_steps == (unit_end(P, U) % B != 0 and a.hit_tokens < unit_end(P, U))
    assert not with_unit.pool._more
