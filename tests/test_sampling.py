"""auto on sampled shadows: which requests the shadows serve, on what pools, and when a
sampled lead is enough to switch (core/sampling.py, core/adaptive.py)."""

import dataclasses
import random

import pytest

from vllm_admission.core.adaptive import (
    MIN_SHADOW_REQUESTS,
    Pair,
    PolicyController,
    parse_shadow_rate,
)
from vllm_admission.core.cache_inputs import CacheRequest, CacheSetup
from vllm_admission.core.errors import UserError
from vllm_admission.core.hashing import mix64
from vllm_admission.core.layout import CacheLayout, PoolSpec, SchedulingSpec
from vllm_admission.core.sampling import PrefixSampler

B = 16


def flops(end, start):
    return float(end * end - start * start)


def conversations(n_convs=400, turns=4, prefixes=3, seed=0):
    """Conversations under a few shared system prompts, turns interleaved: each turn's
    chain extends the previous turn's. Keys are unique ints per block content."""
    rng = random.Random(seed)
    keys = iter(range(1, 10**9))
    systems = [[next(keys) for _ in range(2)] for _ in range(prefixes)]
    convs = []
    for c in range(n_convs):
        convs.append({"chain": list(systems[rng.randrange(prefixes)]), "left": turns, "id": c})
    reqs, owner = [], []
    live = list(convs)
    while live:
        conv = live[rng.randrange(len(live))]
        conv["chain"] += [next(keys) for _ in range(rng.randint(1, 3))]
        reqs.append(CacheRequest(tuple(conv["chain"]), len(conv["chain"]) * B + 5, 8))
        owner.append(conv["id"])
        conv["left"] -= 1
        if not conv["left"]:
            live.remove(conv)
    return reqs, owner


def relabel(reqs, seed=1):
    """The same requests under other block keys (a bijection), as the engine's vLLM
    hashes relabel the trace's keys."""
    rng = random.Random(seed)
    mapping = {}
    out = []
    for r in reqs:
        hashes = tuple(mapping.setdefault(h, rng.getrandbits(63)) for h in r.hashes)
        out.append(r._replace(hashes=hashes))
    return out


def test_a_conversation_is_one_unit_and_shared_prompts_are_not():
    reqs, owner = conversations()
    s = PrefixSampler(0.5)
    units, first = {}, {}
    for i, (r, who) in enumerate(zip(reqs, owner, strict=True)):
        first.setdefault(who, i)
        units.setdefault(who, set()).add(s.unit(r.hashes))
    # Once the shared prompts are branch points (after `fanout` conversations went
    # through each), every turn of a conversation falls in the same unit ...
    late = [u for who, u in units.items() if first[who] >= 50]
    assert len(late) > 100
    assert all(len(u) == 1 for u in late)
    # ... and conversations are not lumped together under their system prompt.
    assert len({next(iter(u)) for u in late}) == len(late)


def test_whole_conversations_are_sampled_at_about_the_rate():
    reqs, owner = conversations(n_convs=2000, turns=3)
    s = PrefixSampler(0.25)
    kept, first = {}, {}
    for i, (r, who) in enumerate(zip(reqs, owner, strict=True)):
        first.setdefault(who, i)
        kept.setdefault(who, set()).add(s.sampled(r.hashes, i) is not None)
    late = [k for who, k in kept.items() if first[who] >= 50]
    assert all(len(k) == 1 for k in late), "a conversation is in or out, whole"
    share = sum(True in k for k in late) / len(late)
    assert 0.2 < share < 0.3
    assert s.seen == len(reqs) and 0.2 < s.kept / s.seen < 0.3


def test_the_sample_does_not_depend_on_the_key_values():
    """The engine's keys (vLLM's hashes) and the simulator's (the trace's) differ; the
    requests sampled must not."""
    reqs, _ = conversations(seed=3)
    a, b = PrefixSampler(0.3), PrefixSampler(0.3)
    picked_a = [a.sampled(r.hashes, i) is not None for i, r in enumerate(reqs)]
    picked_b = [b.sampled(r.hashes, i) is not None for i, r in enumerate(relabel(reqs))]
    assert picked_a == picked_b and 0 < sum(picked_a) < len(reqs)


def test_rate_one_keeps_everything_and_records_nothing():
    reqs, _ = conversations(n_convs=20)
    s = PrefixSampler(1.0)
    assert all(s.sampled(r.hashes, i) == i for i, r in enumerate(reqs))
    assert len(s.branches) == 0 and s.kept == s.seen == len(reqs)


def test_memory_stays_bounded_on_a_long_trace():
    s = PrefixSampler(0.1, max_nodes=500)
    for i in range(20_000):                      # 20,000 distinct chains of 5 blocks
        s.sampled(tuple(range(5 * i + 1, 5 * i + 6)), i)
    assert len(s.branches) <= 501 and len(s._opened) <= 500
    # Ever new branch points (each prefix followed by 4 different blocks) stay bounded too.
    s = PrefixSampler(0.1, max_nodes=500)
    for i in range(20_000):
        s.sampled((10**6 + i // 4, i), i)
    assert len(s.branches) <= 501
    # A popular branch point dropped with the old ones is found again.
    for j in range(8):
        s.sampled((7, 10**7 + j), 20_000 + j)
    assert s.unit((7, 10**7 + 9)) == 10**7 + 9


@pytest.mark.parametrize("bad", [0, -0.1, 1.5, float("nan"), "x"])
def test_bad_rates_are_refused(bad):
    with pytest.raises(UserError, match="sample rate"):
        PrefixSampler(bad)
    with pytest.raises(UserError, match="sample rate"):
        parse_shadow_rate(str(bad))


def test_parse_shadow_rate():
    assert parse_shadow_rate("auto") is None and parse_shadow_rate(None) is None
    assert parse_shadow_rate("0.25") == 0.25 and parse_shadow_rate("1") == 1.0


def test_mix64_spreads_consecutive_indices():
    values = [mix64(i) for i in range(4096)]
    assert len(set(values)) == 4096
    low = sum(v < (1 << 62) for v in values) / 4096       # a quarter of the range
    assert 0.22 < low < 0.28


# -- the controller ------------------------------------------------------------------------

def setup_for(num_blocks):
    layout = CacheLayout(PoolSpec(num_blocks=num_blocks, block_size=B, group_kinds=("attention", "state")),
                         SchedulingSpec(chunk_size=1 << 20))
    return CacheSetup(layout=layout, admission="vllm", eviction="lru", segment_flops=flops)


def drive(reqs, num_blocks, **kw):
    setup = setup_for(num_blocks)
    live = setup.build(switchable=True)
    ctl = PolicyController(live, setup, ("vllm", "last", "dense"), ("lru", "reuse"),
                           prefill_flops=flops, min_window=25, **kw)
    hits = []
    for r, req in enumerate(reqs):
        if live.fits(req.prompt_len, req.output_len):
            hits.append(live.serve(req.hashes, req.prompt_len, req.output_len, rid=r,
                                   now=float(r)).hit_tokens)
        ctl.observe(r, req)
    return ctl, hits


def test_sampled_shadows_run_on_scaled_pools_and_serve_only_the_sample():
    reqs, _ = conversations(n_convs=300, turns=4)
    ctl, _ = drive(reqs, num_blocks=2001, shadow_rate=0.25)
    assert ctl.rate == 0.25
    for shadow in ctl.shadows.values():
        assert shadow.pool.num_blocks == 501
    served = {p: s.state_checkpoints for p, s in ctl.shadows.items()}
    # The shadows saw the sampled requests only: a shadow fed those alone matches.
    s = PrefixSampler(0.25, max_nodes=ctl.sampler.max_nodes)
    sub = [(i, r) for i, r in enumerate(reqs) if s.sampled(r.hashes, i) is not None]
    assert len(sub) == ctl.sampler.kept < len(reqs)
    setup = dataclasses.replace(setup_for(501), admission="last", eviction="lru")
    alone = setup.build()
    for i, r in sub:
        alone.serve(r.hashes, r.prompt_len, r.output_len, rid=i, now=float(i))
    assert served[Pair("last", "lru")] == alone.state_checkpoints


def test_the_rate_chosen_from_the_trace():
    reqs, _ = conversations(n_convs=300, turns=4)
    small, _ = drive(reqs, num_blocks=200)                  # a small pool: full shadows
    assert small.rate == 1.0
    big, _ = drive(reqs, num_blocks=200_001)
    assert big.rate is not None and big.rate < 1.0
    lay = big.setup.layout.pool
    mean = sum(r.prompt_len + r.output_len for r in reqs[:25]) / 25
    per_request = -(-mean // B) + len(lay.group_kinds)
    # Never below a pool that holds MIN_SHADOW_REQUESTS mean requests ...
    assert big.rate * (lay.num_blocks - 1) >= MIN_SHADOW_REQUESTS * per_request - 1
    # ... nor below min_samples over the score horizon.
    turnover = min(max((lay.num_blocks - 1) * B / mean, big.min_window), big.max_window)
    assert big.rate >= big.min_samples / (big.half_life * turnover) - 1e-12
    assert big.rate == big.sample_rate(mean)


def test_full_shadows_and_rate_one_from_the_trace_decide_alike():
    """With a rate of 1 chosen from the trace, the requests kept aside are served to the
    shadows before the first decision: the same decisions as shadows built at the start."""
    reqs, _ = conversations(n_convs=200, turns=4, seed=5)
    chosen, live_a = drive(reqs, num_blocks=150)
    fixed, live_b = drive(reqs, num_blocks=150, shadow_rate=1.0)
    assert chosen.rate == 1.0
    assert [d.as_dict() for d in chosen.decisions] == [d.as_dict() for d in fixed.decisions]
    assert chosen.switches, "the case should switch at least once"
    assert live_a == live_b


def test_a_sampled_lead_within_the_sampling_error_does_not_switch():
    reqs, _ = conversations(n_convs=600, turns=4, seed=2)
    free, _ = drive(reqs, num_blocks=1201, shadow_rate=0.3, min_lead_errors=0.0)
    strict, _ = drive(reqs, num_blocks=1201, shadow_rate=0.3, min_lead_errors=1e9)
    assert free.switches and not strict.switches
    # Leads there were, each within (a billion) standard errors of a nonzero error.
    led = [d for d in strict.decisions if max(d.scores.values()) > d.scores[str(d.before)]]
    assert led and all(d.error > 0 for d in led)
    # With full shadows there is no sampling error: min_lead_errors changes nothing.
    a, _ = drive(reqs, num_blocks=1201, shadow_rate=1.0, min_lead_errors=0.0)
    b, _ = drive(reqs, num_blocks=1201, shadow_rate=1.0, min_lead_errors=1e9)
    assert [d.as_dict() for d in a.decisions] == [d.as_dict() for d in b.decisions]
    assert all(d.error == 0 for d in a.decisions)


def test_engine_and_simulator_keys_give_the_same_sampled_decisions():
    reqs, _ = conversations(n_convs=600, turns=4, seed=4)
    a, _ = drive(reqs, num_blocks=1201, shadow_rate=0.3)
    b, _ = drive(relabel(reqs), num_blocks=1201, shadow_rate=0.3)
    assert [d.as_dict() for d in a.decisions] == [d.as_dict() for d in b.decisions]
    assert a.sampler.kept == b.sampler.kept < len(reqs)


@pytest.mark.slow   # about 10 s: a long auto run on full, then sampled, shadows
def test_full_shadows_decide_until_the_sample_holds_enough_then_hand_over():
    reqs, _ = conversations(n_convs=2500, turns=4, seed=6)
    chosen, _ = drive(reqs, num_blocks=4001, min_samples=64)
    full, _ = drive(reqs, num_blocks=4001, shadow_rate=1.0)
    assert 0 < chosen.rate < 1 and chosen.handover_at is not None
    before = [d.as_dict() for d in chosen.decisions if d.at <= chosen.handover_at]
    assert before == [d.as_dict() for d in full.decisions if d.at <= chosen.handover_at]
    # After the handover the shadows decided on are the scaled ones.
    assert all(s.pool.num_blocks < 4001 for s in chosen.shadows.values())
    assert chosen._full is None and chosen.sampler.kept < len(reqs)
    # A sample that never holds enough keeps the full shadows to the end.
    never, _ = drive(reqs, num_blocks=4001, min_samples=10**9)
    assert never.rate == 1.0 or never.handover_at is None
    assert [d.as_dict() for d in never.decisions] == [d.as_dict() for d in full.decisions]
