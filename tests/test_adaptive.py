"""auto: switching policies mid-run is safe and loses nothing, and the controller
moves to the pair a shadow replay shows to be better."""

import dataclasses
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cache import GROUPS, B, chained, make_cache, random_trace

from vllm_admission.core.adaptive import (
    AUTO,
    AUTO_ADMISSIONS,
    AUTO_EVICTIONS,
    LiveEvictions,
    Pair,
    PolicyController,
    candidate_policies,
    parse_auto_admissions,
    stock_pair,
)
from vllm_admission.core.admission import (
    ADMISSION_POLICIES,
    UnknownPolicyError,
    get_admission,
)
from vllm_admission.core.cache_inputs import CacheRequest, CacheSetup
from vllm_admission.core.errors import UserError
from vllm_admission.core.eviction import (
    EVICTION_POLICIES,
    HistoryKeeper,
    ReuseEviction,
    ReuseHistory,
    get_eviction,
)
from vllm_admission.core.layout import CacheLayout, PoolSpec, SchedulingSpec


def flops(end, start):
    return float(end * end - start * start)


def serve_all(cache, reqs, switch_at=None, switch=None):
    hits = []
    for r, (hashes, n, out) in enumerate(reqs):
        if r == switch_at:
            switch(cache)
        if not cache.fits(n, out):
            hits.append(None)
            continue
        hits.append(cache.serve(hashes, n, out, rid=r, now=float(r)).hit_tokens)
    return hits


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), at=st.integers(1, 29), blocks=st.integers(14, 60),
       eviction=st.sampled_from(["lru", "flop"]))
def test_switching_to_a_fresh_copy_of_the_same_policy_changes_nothing(seed, at, blocks, eviction):
    """The hand-over keeps every candidate's free time and value: a fresh LRU (or flop at a
    fixed alpha) that receives the candidates orders them exactly as the old one would."""
    reqs = random_trace(random.Random(seed))
    opts = {"alpha": 0.7} if eviction == "flop" else {}

    def build():
        c = make_cache("vllm", eviction, num_blocks=blocks, switchable=True, track_values=True,
                       segment_flops=flops, bytes_per_block=1)
        if opts:
            c.eviction.alpha = opts["alpha"]
        return c

    plain = serve_all(build(), reqs)
    switched = serve_all(build(), reqs, switch_at=at,
                         switch=lambda c: c.switch(eviction=get_eviction(eviction, **opts)))
    assert switched == plain


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), blocks=st.integers(14, 60),
       switches=st.lists(st.tuples(st.integers(0, 29), st.sampled_from(sorted(AUTO_ADMISSIONS)),
                                   st.sampled_from(["lru", "flop", "lfu", "reuse"])),
                         max_size=5),
       shared=st.booleans())
def test_any_switch_sequence_leaks_no_block(seed, blocks, switches, shared):
    reqs = random_trace(random.Random(seed))
    cache = make_cache("vllm", "lru", num_blocks=blocks, switchable=True, track_values=True,
                       segment_flops=flops, bytes_per_block=1)
    make = get_eviction
    if shared:   # as auto serves its live cache: every policy shares one hash history
        make = LiveEvictions(("lru", "flop", "lfu", "reuse")).make
        cache.switch(eviction=make("lru"))
    plan = {}
    for at, adm, ev in switches:
        plan.setdefault(at, (adm, ev))
    for r, (hashes, n, out) in enumerate(reqs):
        if r in plan:
            adm, ev = plan[r]
            cache.switch(admission=get_admission(adm), eviction=make(ev))
            assert cache.eviction.name == ev
        if cache.fits(n, out):
            cache.serve(hashes, n, out, rid=r, now=float(r))
        pool = cache.pool
        assert pool.num_used == 0
        free = pool.free_blocks
        assert len(free) == blocks - 1
        assert free.num_cached == len(cache.eviction)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), blocks=st.integers(14, 60), inner=st.sampled_from(["lru", "lfu"]))
def test_a_history_keeper_orders_as_its_policy_and_tracks_every_cached_block(seed, blocks, inner):
    """Wrapped, a policy evicts exactly as alone; the history it keeps holds the key of
    every block the pool has cached, and a ghost for every other key it still counts."""
    reqs = random_trace(random.Random(seed))
    plain = make_cache("vllm", inner, num_blocks=blocks)
    history = ReuseHistory()
    kept = make_cache("vllm", inner, num_blocks=blocks, switchable=True)
    kept.switch(eviction=HistoryKeeper(get_eviction(inner), history))
    assert serve_all(kept, reqs) == serve_all(plain, reqs)
    assert kept.pool.evictions == plain.pool.evictions
    pool = kept.pool
    cached = {b: (pool.group[b], pool.key[b]) for b in range(1, blocks) if pool.key[b] is not None}
    assert history.cached_keys() == cached
    counted = {k for k in history.refs if history.uses(k)}
    assert counted == set(history.live) | set(history.ghosts)
    assert not set(history.live) & set(history.ghosts)
    assert len(history.ghosts) == history.num_ghosts


def test_reuse_switched_in_starts_from_the_shared_history():
    """Under auto, reuse switched in mid-run knows which cached hashes were used again
    (a fresh one would take every block for a first-time one)."""
    reqs = shared_prefix_workload(n=80)

    def switch_to_reuse(make):
        cache = setup_for(60).build(switchable=True)
        cache.switch(eviction=make("lru"))
        for r, req in enumerate(reqs):
            cache.serve(req.hashes, req.prompt_len, req.output_len, rid=r, now=float(r))
        cache.switch(eviction=make("reuse"))
        assert isinstance(cache.eviction, ReuseEviction)
        return cache.eviction

    live = LiveEvictions(("lru", "reuse"))
    warm = switch_to_reuse(live.make)
    assert warm.hist is live.history
    assert len(warm._again) > 0 and warm.ratio > 1.0  # noqa: SLF001 - the hand-over is the point
    cold = switch_to_reuse(get_eviction)
    assert len(cold._again) == 0 and cold.ratio == 1.0  # noqa: SLF001


def test_live_evictions_share_a_history_only_with_a_history_keeping_candidate():
    assert LiveEvictions(("lru", "lfu")).history is None
    assert type(LiveEvictions(("lru", "lfu")).make("lfu")).__name__ == "LFUEviction"
    live = LiveEvictions(("lru", "reuse"))
    lru = live.make("lru")
    assert isinstance(lru, HistoryKeeper) and lru.name == "lru" and lru.hist is live.history
    assert live.make("reuse").hist is live.history
    with pytest.raises(ValueError, match="own history"):
        HistoryKeeper(get_eviction("reuse"), live.history)
    flop = HistoryKeeper(get_eviction("flop", alpha=0.3), live.history)
    assert flop.tunable and flop.alpha == 0.3
    flop.alpha = 0.7    # as the plugin sets a tuned alpha: it must reach the wrapped policy
    assert flop.inner.alpha == 0.7


def test_the_controller_serves_its_live_cache_with_the_shared_history():
    setup = setup_for(4000)
    cache = setup.build(switchable=True)
    ctl = PolicyController(cache, setup, ("vllm",), ("lru", "reuse"), prefill_flops=flops)
    assert isinstance(cache.eviction, HistoryKeeper)
    assert cache.eviction.hist is ctl.live_evictions.history


def test_scores_start_again_when_a_shadow_first_evicts():
    """Savings made before any shadow had to evict measure unbounded memory: the first
    decision after that moment compares only what each pair saved since."""
    reqs = shared_prefix_workload(n=40)
    blocks = 60
    setup = setup_for(blocks)
    pairs = [Pair(a, "lru") for a in ("vllm", "dense")]
    alone = {p: dataclasses.replace(setup, admission=p.admission, eviction=p.eviction).build()
             for p in pairs}
    saved = {p: [] for p in pairs}
    first_eviction = None
    for r, req in enumerate(reqs):
        for p, cache in alone.items():
            hit = cache.serve(req.hashes, req.prompt_len, req.output_len, rid=r, now=float(r)).hit_tokens
            saved[p].append(flops(req.prompt_len, 0) - flops(req.prompt_len, hit))
        if first_eviction is None and any(c.pool.evictions for c in alone.values()):
            first_eviction = r
    assert first_eviction is not None and 0 < first_eviction < 29, "the pool should fill early"
    cache = setup.build(switchable=True)
    ctl = PolicyController(cache, setup, ("vllm", "dense"), ("lru",), prefill_flops=flops,
                           min_window=30, half_life=math.inf)
    for r, req in enumerate(reqs):
        cache.serve(req.hashes, req.prompt_len, req.output_len, rid=r, now=float(r))
        ctl.observe(r, req)
    assert ctl.pressure_at == first_eviction
    first = ctl.decisions[0]
    assert first.at == 29
    for p in pairs:
        assert first.scores[str(p)] == pytest.approx(sum(saved[p][first_eviction + 1:30]))


def test_a_pool_that_never_fills_keeps_every_saving():
    ctl, _ = run_controller(("vllm", "dense"), ("lru",), shared_prefix_workload(n=60))
    assert ctl.pressure_at is None and ctl.pair == Pair("dense", "lru")


def test_switch_needs_a_switchable_cache_and_refuses_what_it_cannot_serve():
    with pytest.raises(RuntimeError, match="not built switchable"):
        make_cache("vllm", "lru").switch(eviction=get_eviction("lfu"))
    cache = make_cache("vllm", "lru", switchable=True)
    with pytest.raises(ValueError, match="future knowledge"):
        cache.switch(eviction=get_eviction("belady"))
    with pytest.raises(ValueError, match="track_values"):
        cache.switch(eviction=get_eviction("flop"))


def shared_prefix_workload(n=200, num_docs=12, seed=3):
    """Prompts extend one of a few long documents at a random block: the reusable
    prefix ends anywhere, so a state at every block (dense) hits sooner than
    states only at detected junctions (vllm) while the cache is ample."""
    rng = random.Random(seed)
    docs = [[("d", d, k) for k in range(12 * B)] for d in range(num_docs)]
    reqs = []
    for r in range(n):
        doc = rng.choice(docs)
        cut = rng.randint(2, 11) * B + rng.randint(0, B - 1)
        tokens = doc[:cut] + [("u", r)] * rng.randint(1, B)
        reqs.append(CacheRequest(chained(tokens), len(tokens), rng.randint(1, 16)))
    return reqs


def setup_for(blocks):
    layout = CacheLayout(PoolSpec(num_blocks=blocks, block_size=B, group_kinds=GROUPS),
                         SchedulingSpec(chunk_size=8192))
    return CacheSetup(layout=layout, admission="vllm", eviction="lru", segment_flops=flops)


def serve_controlled(cache, ctl, reqs):
    """Serve ``reqs`` on ``cache``, each then observed by ``ctl``; the hit tokens."""
    hits = []
    for r, req in enumerate(reqs):
        hits.append(cache.serve(req.hashes, req.prompt_len, req.output_len, rid=r,
                                now=float(r)).hit_tokens)
        ctl.observe(r, req)
    return hits


def run_controller(admissions, evictions, reqs, blocks=4000, start=None):
    setup = setup_for(blocks)
    cache = setup.build(switchable=True)
    ctl = PolicyController(cache, setup, admissions, evictions, prefill_flops=flops,
                           min_window=20, max_window=40, start=start)
    hits = 0
    for r, req in enumerate(reqs):
        out = cache.serve(req.hashes, req.prompt_len, req.output_len, rid=r, now=float(r))
        hits += out.hit_tokens
        ctl.observe(r, req)
    return ctl, hits


def test_controller_moves_to_the_admission_that_saves_more():
    reqs = shared_prefix_workload()
    ctl, hits = run_controller(("vllm", "dense"), ("lru",), reqs, start=Pair("vllm", "lru"))
    assert ctl.pair == Pair("dense", "lru")
    first = ctl.switches[0]
    assert first.before == Pair("vllm", "lru") and first.after == Pair("dense", "lru")
    assert first.scores["dense+lru"] > first.scores["vllm+lru"]
    assert first.window == 20 and (first.at + 1) % 20 == 0   # decisions every min_window
    _, stock_hits = run_controller(("vllm",), ("lru",), reqs)
    assert hits > stock_hits


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), blocks=st.integers(16, 70))
def test_auto_is_stock_hit_for_hit_until_a_shadow_leads_by_the_margin(seed, blocks):
    """The guarantee ``auto`` states (docs/simulator.md, "What auto guarantees"): on any
    trace its cache serves exactly as stock vLLM's, request for request, until a
    decision at which some candidate's shadow has saved more than ``min_gain`` more
    prefill FLOPs than the live pair's; every switch goes to the pair whose shadow saved
    the most, and no decision without such a lead switches."""
    rng = random.Random(seed)
    reqs = [CacheRequest(h, n, out) for h, n, out in random_trace(rng, n_requests=160, n_prefixes=6)]
    setup = setup_for(blocks)
    cache = setup.build(switchable=True)
    ctl = PolicyController(cache, setup, ("vllm", "last", "marconi", "dense"), ("lru", "reuse"),
                           prefill_flops=flops, min_window=10, max_window=20, shadow_rate=1.0)
    stock = setup_for(blocks).build()
    live_hits, stock_hits = [], []
    for r, req in enumerate(reqs):
        for c, out_hits in ((cache, live_hits), (stock, stock_hits)):
            fits = c.fits(req.prompt_len, req.output_len)
            out_hits.append(c.serve(req.hashes, req.prompt_len, req.output_len, rid=r,
                                    now=float(r)).hit_tokens if fits else None)
        ctl.observe(r, req)
    first = ctl.switches[0].at if ctl.switches else len(reqs) - 1
    assert live_hits[: first + 1] == stock_hits[: first + 1]
    # A decision every window until one shadow is left (settling), none after.
    last = len(reqs) - 1 if ctl.settled_at is None else ctl.settled_at
    assert ctl.num_decisions == len(ctl.decisions) == (last + 1) // 10
    for d in ctl.decisions:
        live, best = d.scores[str(d.before)], max(d.scores.values())
        lead = best > live and (live <= 0 or (best - live) / live > ctl.min_gain)
        assert d.switched == lead, d
        if d.switched:
            assert d.scores[str(d.after)] == best


def test_stock_pair_is_the_pair_that_declares_itself_vllms_own():
    assert stock_pair() == Pair("vllm", "lru")
    assert get_admission(stock_pair().admission).vllm_native


def test_the_default_start_keeps_a_state_at_every_block_where_a_state_ends_no_chunk():
    start = PolicyController.default_start
    # split mode (vLLM 0.32): every checkpoint ends a prefill chunk, so start as stock.
    assert start(AUTO_ADMISSIONS, AUTO_EVICTIONS) == Pair("vllm", "lru")
    assert start(AUTO_ADMISSIONS, AUTO_EVICTIONS, "split") == Pair("vllm", "lru")
    # inpass: a checkpoint costs only its block while the pool has room.
    assert start(AUTO_ADMISSIONS, AUTO_EVICTIONS, "inpass") == Pair("dense", "lru")
    assert start(("last", "vllm"), ("reuse", "lru"), "inpass") == Pair("vllm", "lru")
    assert start(("last", "marconi"), ("reuse",)) == Pair("last", "reuse")
    # The controller takes the mode from its layout, and the live cache serves as
    # the start pair whatever it was built with.
    setup = setup_for(4000)
    setup = dataclasses.replace(setup, layout=dataclasses.replace(
        setup.layout, scheduling=dataclasses.replace(setup.layout.scheduling, checkpoint="inpass")))
    live = setup.build(switchable=True)
    ctl = PolicyController(live, setup, ("vllm", "dense"), ("lru",), prefill_flops=flops)
    assert ctl.pair == Pair("dense", "lru") and live.admission.name == "dense"


def test_a_switch_puts_first_what_the_new_pairs_shadow_does_not_hold():
    """At each switch the live cache's free cached blocks whose hash the new pair's
    shadow does not hold (and blocks of generated tokens) lead the eviction order."""
    setup = setup_for(400)
    live = setup.build(switchable=True)
    ctl = PolicyController(live, setup, ("vllm", "last", "dense"), ("lru",), prefill_flops=flops,
                           min_window=20, max_window=40, start=Pair("vllm", "lru"))
    kept_seen = 0
    for r, req in enumerate(shared_prefix_workload(n=400, num_docs=30)):
        live.serve(req.hashes, req.prompt_len, req.output_len, rid=r, now=float(r))
        decision = ctl.observe(r, req)
        if decision is None:
            continue
        held = ctl.shadows[decision.after].held_keys()
        assert decision.held == held
        assert all(not isinstance(h, tuple) for group in held for h in group)  # no output keys
        pool = live.pool
        order = [b for b in pool.free_blocks.order(float(r)) if pool.key[b] is not None]
        kept = [pool.key[b] in held[pool.group[b]] for b in order]
        # Every demoted block comes before every kept one (lru keeps the hand-over order).
        assert kept == sorted(kept)
        kept_seen += kept.count(True)
    assert ctl.switches and kept_seen


def test_switching_with_held_keys_demotes_the_rest_and_leaks_nothing():
    reqs = shared_prefix_workload(n=150, num_docs=30)
    setup = setup_for(150)
    live = setup.build(switchable=True)                     # vllm + lru
    other = dataclasses.replace(setup, admission="dense").build()
    for r, req in enumerate(reqs):
        for cache in (live, other):
            cache.serve(req.hashes, req.prompt_len, req.output_len, rid=r, now=float(r))
    assert live.pool.evictions and other.pool.evictions
    held = other.held_keys()
    pool = live.pool
    before = [b for b in pool.free_blocks.order(150.0) if pool.key[b] is not None]
    live.switch(admission=get_admission("dense"), eviction=get_eviction("lru"), held=held)
    after = [b for b in pool.free_blocks.order(150.0) if pool.key[b] is not None]
    assert sorted(after) == sorted(before)                  # the same candidates
    kept = [pool.key[b] in held[pool.group[b]] for b in after]
    assert kept.count(False) > 0 and kept.count(True) > 0 and kept == sorted(kept)
    # Within each part the free order is kept.
    n = kept.count(False)
    demoted, rest = set(after[:n]), set(after[n:])
    assert after[:n] == [b for b in before if b in demoted]
    assert after[n:] == [b for b in before if b in rest]
    with pytest.raises(ValueError, match="eviction"):
        live.switch(held=held)
    for r, req in enumerate(reqs, start=len(reqs)):         # serves on, nothing leaked
        live.serve(req.hashes, req.prompt_len, req.output_len, rid=r, now=float(r))
    assert live.pool.num_free == live.pool.num_blocks - 1


def test_a_single_pair_runs_no_shadow():
    ctl, _ = run_controller(("vllm",), ("lru",), shared_prefix_workload(n=60))
    assert ctl.shadows == {} and not ctl.decisions and ctl.pair == Pair("vllm", "lru")


def test_every_candidate_pair_has_a_shadow_that_ran_it_all_along():
    reqs = shared_prefix_workload(n=30)
    ctl, _ = run_controller(("vllm", "last", "dense"), ("lru", "lfu"), reqs)
    assert sorted(map(str, ctl.shadows)) == sorted(f"{a}+{e}" for a in ("vllm", "last", "dense")
                                                   for e in ("lru", "lfu"))
    for pair, shadow in ctl.shadows.items():
        alone = setup_for(4000)
        alone = dataclasses.replace(alone, admission=pair.admission, eviction=pair.eviction).build()
        for r, req in enumerate(reqs):
            alone.serve(req.hashes, req.prompt_len, req.output_len, rid=r, now=float(r))
        assert shadow.state_checkpoints == alone.state_checkpoints and shadow.junctions == alone.junctions


def test_candidate_policies():
    assert candidate_policies(AUTO, AUTO) == (AUTO_ADMISSIONS, AUTO_EVICTIONS)
    assert candidate_policies("last", AUTO) == (("last",), AUTO_EVICTIONS)
    assert "none" not in AUTO_ADMISSIONS and "belady" not in AUTO_EVICTIONS
    # auto's candidates are the policies that declare themselves so, in registry order;
    # a policy that does not (flop: tuned; lfu: a baseline) never joins by being registered.
    assert tuple(n for n, c in ADMISSION_POLICIES.items()
                                    if c.auto_candidate and not c.sub_block_only) == AUTO_ADMISSIONS
    # Under a hash block size below the block size auto also weighs the policies that differ there.
    with_unit, _ = candidate_policies(AUTO, AUTO, sub_block=True)
    assert with_unit == tuple(n for n, c in ADMISSION_POLICIES.items() if c.auto_candidate)
    assert "block" in with_unit and "block" not in AUTO_ADMISSIONS
    assert tuple(n for n, c in EVICTION_POLICIES.items()
                                   if c.auto_candidate and not c.needs_future) == AUTO_EVICTIONS
    assert not {"flop", "lfu"} & set(AUTO_EVICTIONS)
    with pytest.raises(UnknownPolicyError):
        candidate_policies("nope", AUTO)
    with pytest.raises(ValueError, match="future knowledge"):
        candidate_policies(AUTO, "belady")


def test_auto_chooses_among_the_admissions_the_user_names():
    # Taken as given, in the user's order: a policy that is no auto candidate by
    # default (written) joins, one that is (marconi) stays out, block stays in without
    # a smaller hash block size.
    assert "written" not in AUTO_ADMISSIONS
    named = ("vllm", "written", "block")
    assert candidate_policies(AUTO, AUTO, admissions=named) == (named, AUTO_EVICTIONS)
    assert parse_auto_admissions(" last ,written") == ("last", "written")
    assert parse_auto_admissions(None) is None and parse_auto_admissions("  ") is None
    with pytest.raises(UnknownPolicyError, match="unknown admission policy 'nope'"):
        parse_auto_admissions("vllm,nope")
    for bad, message in (("vllm,auto", "'auto' is not one"), ("vllm,,last", "comma-separated"),
                         ("last,last", "twice")):
        with pytest.raises(UserError, match=message):
            parse_auto_admissions(bad)
    with pytest.raises(UserError, match="the admission policy is 'vllm'"):
        candidate_policies("vllm", AUTO, admissions=("vllm", "written"))
    # A run of auto among them serves and switches among those only.
    reqs = shared_prefix_workload()
    setup = setup_for(4000)
    cache = setup.build(switchable=True)
    admissions, evictions = candidate_policies(AUTO, "lru", admissions=("vllm", "written"))
    ctl = PolicyController(cache, setup, admissions, evictions, prefill_flops=flops, min_window=20)
    for r, req in enumerate(reqs):
        cache.serve(req.hashes, req.prompt_len, req.output_len, rid=r, now=float(r))
        ctl.observe(r, req)
    assert {str(p) for p in ctl.pairs} == {"vllm+lru", "written+lru"}
    assert {p for d in ctl.decisions for p in d.scores} == {"vllm+lru", "written+lru"}


def test_a_pair_that_stays_far_behind_loses_its_shadow_and_nothing_else_changes():
    """Elimination: ``none`` saves nothing, so once the pool is under pressure its score
    stays below ``drop_below`` times the best for ``drop_after`` turnovers of decisions
    and its shadow is dropped; the decisions are those of a run that keeps it."""
    reqs = shared_prefix_workload(n=400)

    def run(drop_below):
        setup = setup_for(60)
        cache = setup.build(switchable=True)
        ctl = PolicyController(cache, setup, ("vllm", "none"), ("lru",), prefill_flops=flops,
                               min_window=20, max_window=40, drop_below=drop_below, drop_after=2.0)
        return ctl, serve_controlled(cache, ctl, reqs)

    ctl, hits = run(0.8)
    kept, kept_hits = run(0.0)
    none = Pair("none", "lru")
    assert kept.dropped == {} and none in kept.shadows
    assert set(ctl.dropped) == {none} and none not in ctl.shadows
    assert ctl.pressure_at is not None and ctl.window_len is not None
    # Dropped at the decision that ends the first run of `needed` decisions after the first
    # eviction where its recorded score was below 0.8 times the best (full shadows: no
    # sampling error).
    needed = math.ceil(2.0 * ctl.window_len / 20)
    assert needed >= 2
    run_length, dropped_at = 0, None
    for k, d in enumerate(ctl.decisions):
        behind = d.at > ctl.pressure_at and d.scores[str(none)] < 0.8 * max(d.scores.values())
        run_length = run_length + 1 if behind else 0
        if run_length == needed:
            dropped_at = k
            break
    assert dropped_at is not None and ctl.dropped[none] == ctl.decisions[dropped_at].at
    assert all(str(none) in d.scores for d in list(ctl.decisions)[:dropped_at + 1])
    assert all(str(none) not in d.scores for d in list(ctl.decisions)[dropped_at + 1:])
    assert hits == kept_hits and [(d.at, d.after) for d in ctl.switches] == \
        [(d.at, d.after) for d in kept.switches]


def run_from_none(margin=0.0, drop_below=0.8, n=400):
    """``auto`` started on ``none`` + ``lru`` (which saves nothing) among ``vllm``, ``dense``
    and ``none`` on a pool under pressure; the controller and the live cache's hit tokens."""
    setup = setup_for(60)
    cache = setup.build(switchable=True)
    ctl = PolicyController(cache, setup, ("vllm", "dense", "none"), ("lru",), prefill_flops=flops,
                           min_window=20, max_window=40, start=Pair("none", "lru"),
                           stock_margin=margin, drop_below=drop_below)
    return ctl, serve_controlled(cache, ctl, shared_prefix_workload(n=n))


def test_the_live_pair_keeps_its_shadow_however_far_behind_and_the_start_does_not():
    """Elimination spares the live pair (the others are measured against it) and, with a
    margin, stock's (the margin is measured from it); the start pair is not spared."""
    none = Pair("none", "lru")
    for margin in (0.0, 0.3):
        ctl, _ = run_from_none(margin)
        assert ctl.switches and ctl.switches[0].before == none   # auto left its start...
        assert none in ctl.dropped                                # ...whose shadow then went
        # Every decision had the live pair's shadow to measure against.
        assert all(str(d.before) in d.scores for d in ctl.decisions)
        assert (stock_pair() in ctl.dropped) == (margin == 0), margin
        if margin:
            assert stock_pair() in ctl.shadows and ctl.settled_at is None


def test_once_only_the_live_pairs_shadow_is_left_the_shadows_stop():
    """Settling: the decision that leaves one shadow, the live pair's, stops the shadows;
    no decision is made after it, and the live cache serves exactly as a run that kept
    every shadow and made no other switch."""
    ctl, hits = run_from_none()
    kept, kept_hits = run_from_none(drop_below=0.0)
    assert ctl.settled_at is not None and ctl.settled_at == max(ctl.dropped.values())
    assert set(ctl.dropped) == set(ctl.pairs) - {ctl.pair}
    assert ctl.shadows == {} and ctl.decisions[-1].at == ctl.settled_at
    assert kept.settled_at is None and kept.decisions[-1].at == 399
    assert [(d.at, d.after) for d in ctl.switches] == [(d.at, d.after) for d in kept.switches]
    assert hits == kept_hits
    # Later requests change nothing.
    decided = ctl.num_decisions
    assert all(ctl.observe(400 + r, req) is None
               for r, req in enumerate(shared_prefix_workload(n=100, seed=4)))
    assert ctl.num_decisions == decided and ctl.shadows == {}


# --- the margin over stock ------------------------------------------------------

def run_with_margin(reqs, blocks, margin, admissions=("vllm", "dense", "last"), evictions=("lru",)):
    """``auto`` with ``stock_margin=margin`` on full shadows; returns the controller and
    the live cache's hit tokens per request."""
    setup = setup_for(blocks)
    cache = setup.build(switchable=True)
    ctl = PolicyController(cache, setup, admissions, evictions, prefill_flops=flops,
                           min_window=20, max_window=40, start=Pair("vllm", "lru"),
                           stock_margin=margin)
    return ctl, serve_controlled(cache, ctl, reqs)


def phased_workload(seed, docs, first=200, then=200):
    """``first`` requests of :func:`shared_prefix_workload` (a state at every block pays),
    then ``then`` requests that extend one of three 6-block system prompts with blocks
    never seen again (states at every block crowd the pool out: stock's pair pays)."""
    rng = random.Random(seed)
    reqs = shared_prefix_workload(n=first, num_docs=docs, seed=seed)
    for r in range(then):
        system = rng.randrange(3)
        tokens = ([("sys", system, k) for k in range(6 * B)]
                  + [("q", r, k) for k in range(rng.randint(2, 8) * B)])
        reqs.append(CacheRequest(chained(tokens), len(tokens), rng.randint(1, 16)))
    return reqs


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), blocks=st.integers(40, 400), docs=st.integers(2, 16),
       margin=st.sampled_from([0.02, 0.1, 0.3, 1.0]))
def test_with_a_margin_auto_serves_another_pair_only_while_its_shadow_leads_the_start(
        seed, blocks, docs, margin):
    """The stated rule, checked on every decision record: no switch before the shadows
    evicted for a turnover; stock's pair (the start) is left only for a score above
    (1 + margin) times stock's; any other pair is served only while its score is above
    stock's, and left the first decision it is not; and until the first switch the live
    cache hits exactly as the start pair alone."""
    reqs = phased_workload(seed, docs)
    ctl, hits = run_with_margin(reqs, blocks, margin, evictions=("lru", "reuse"))
    start = str(Pair("vllm", "lru"))
    for d in ctl.decisions:
        s = d.scores[start]
        if d.after != d.before:
            assert ctl.pressure_at is not None and ctl.window_len is not None
            assert d.at - ctl.pressure_at >= ctl.window_len
        if d.before == ctl.start != d.after:
            assert d.scores[str(d.after)] > (1 + margin) * s
        if d.after != ctl.start:
            assert d.scores[str(d.after)] > s
        if d.before != ctl.start and d.scores[str(d.before)] <= s:
            assert d.after != d.before   # the lead is gone: it leaves at once
    first = ctl.switches[0].at + 1 if ctl.switches else len(reqs)
    _, alone = run_with_margin(reqs[:first], blocks, margin, admissions=("vllm",))
    assert hits[:first] == alone


def run_dense_start(seed, blocks):
    """``auto`` between ``vllm`` and ``dense`` from a ``dense`` + ``lru`` start (the
    in-pass start) with a margin of 0.3, on a workload whose second, longer phase
    rewards stock's pair; the controller."""
    reqs = phased_workload(seed, 8, first=100, then=400)
    setup = setup_for(blocks)
    cache = setup.build(switchable=True)
    ctl = PolicyController(cache, setup, ("vllm", "dense"), ("lru",), prefill_flops=flops,
                           min_window=20, max_window=40, start=Pair("dense", "lru"),
                           stock_margin=0.3)
    serve_controlled(cache, ctl, reqs)
    return ctl


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), blocks=st.integers(30, 120))
def test_a_dense_start_is_held_to_the_margin_over_stock(seed, blocks):
    """With in-pass checkpoints ``auto`` starts as ``dense`` + ``lru``; the margin is over
    stock's pair all the same (its anchor), so ``dense`` is served only while its shadow is
    not behind stock's, and stock's shadow is never dropped. A margin over the start held
    ``dense`` where it loses (up to 4.4 points under stock in the in-pass study)."""
    ctl = run_dense_start(seed, blocks)
    assert ctl.anchor == stock_pair() != ctl.start
    stock = str(stock_pair())
    for d in ctl.decisions:
        assert stock in d.scores
        if d.after == ctl.start == d.before:
            assert d.scores[str(d.after)] >= d.scores[stock]   # the start, while not behind
        elif d.after != stock_pair():
            assert d.scores[str(d.after)] > d.scores[stock]


def test_a_dense_start_that_falls_behind_stock_goes_to_stock():
    ctl = run_dense_start(0, 60)
    assert ctl.switches and ctl.switches[0].after == stock_pair()
    first = ctl.switches[0]
    assert first.scores[str(stock_pair())] >= first.scores[str(Pair("dense", "lru"))]


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), blocks=st.integers(40, 400), docs=st.integers(2, 16))
def test_with_a_margin_no_lead_reaches_auto_hits_exactly_as_stock(seed, blocks, docs):
    """A margin no shadow can reach: ``auto`` never leaves the start pair, and its live
    cache hits request for request as the stock pair alone (the controller changes
    nothing in the cache it does not switch)."""
    reqs = shared_prefix_workload(n=200, num_docs=docs, seed=seed)
    ctl, hits = run_with_margin(reqs, blocks, 1e12)
    _, stock = run_with_margin(reqs, blocks, 0.0, admissions=("vllm",))
    assert ctl.switches == [] and hits == stock


def test_with_a_margin_auto_goes_back_to_the_start_once_the_lead_is_gone():
    """The phased workload: ``dense`` leads while prompts cut long documents anywhere,
    then loses once they extend system prompts with new blocks; ``auto`` goes back to
    stock's pair at the first decision its shadow no longer leads."""
    ctl, _ = run_with_margin(phased_workload(1, 3), 94, 0.1)
    pairs = [d.after for d in ctl.switches]
    assert pairs == [Pair("dense", "lru"), Pair("vllm", "lru")]
    back = ctl.switches[1]
    assert back.at >= 200 and back.scores["dense+lru"] <= back.scores["vllm+lru"]
    before = [d for d in ctl.decisions if ctl.switches[0].at < d.at < back.at]
    assert before and all(d.scores["dense+lru"] > d.scores["vllm+lru"] for d in before)


def test_once_off_stock_the_margin_lets_auto_move_to_a_pair_that_leads_stock_by_less():
    """The margin is what leaving stock's pair costs. Serving ``dense`` + ``lru`` (entered
    with a lead above the margin), ``auto`` moves to ``dense`` + ``reuse``, which leads the
    live pair and stock's, by less than the margin over stock, rather than back to stock."""
    ctl, _ = run_with_margin(phased_workload(0, 3, first=200, then=300), 94, 0.3,
                             evictions=("lru", "reuse"))
    stock = str(stock_pair())
    first, move = ctl.switches[:2]
    assert (first.before, first.after) == (stock_pair(), Pair("dense", "lru"))
    assert first.scores["dense+lru"] > 1.3 * first.scores[stock]
    assert (move.before, move.after) == (Pair("dense", "lru"), Pair("dense", "reuse"))
    assert move.scores[stock] < move.scores["dense+reuse"] <= 1.3 * move.scores[stock]


def test_a_margin_holds_back_a_switch_the_default_rule_makes():
    """The same workload: without a margin ``auto`` leaves stock for ``dense``; with a
    margin below the lead it shows it still does, after the settling turnover; with one
    above it, it stays on stock."""
    reqs = shared_prefix_workload(n=400)
    free, _ = run_with_margin(reqs, 80, 0.0)
    assert free.switches and free.switches[0].after != free.start
    low, _ = run_with_margin(reqs, 80, 0.01)
    assert low.switches
    lead = max(d.scores[str(d.after)] / d.scores[str(d.before)] - 1 for d in low.switches
               if d.before == low.start)
    high, _ = run_with_margin(reqs, 80, lead * 2)
    assert lead > 0.01 and high.pair == high.start
    assert all(d.after == high.start for d in high.decisions)


class RecordingController(PolicyController):
    """Records, at each decision, the live pair's and stock's scores and one standard
    error of their difference (what the margin's rule to stay reads)."""

    def _allowed(self, index, deciding, active, li):
        si = self.pairs.index(self.anchor)
        history = deciding.history
        self.seen.append((index, self.pairs[li], history[li], history[si], deciding.error(li, si)))
        return super()._allowed(index, deciding, active, li)


def run_sampled_margin(seed, blocks, docs):
    reqs = phased_workload(seed, docs, first=300, then=300)
    setup = setup_for(blocks)
    cache = setup.build(switchable=True)
    ctl = RecordingController(cache, setup, ("vllm", "dense", "last"), ("lru",),
                              prefill_flops=flops, min_window=20, max_window=40,
                              start=Pair("vllm", "lru"), stock_margin=0.3, shadow_rate=0.5)
    ctl.seen = []
    serve_controlled(cache, ctl, reqs)
    return ctl


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), blocks=st.integers(50, 250), docs=st.integers(2, 10))
def test_with_sampled_shadows_the_margin_keeps_a_pair_within_the_sampling_error(seed, blocks, docs):
    """Sampled shadows (rate 0.5): a pair other than stock's stays while its score is not
    behind stock's by more than one standard error of their difference, and is left the
    first decision it is."""
    ctl = run_sampled_margin(seed, blocks, docs)
    assert len(ctl.seen) == ctl.num_decisions
    for (at, live, score, stock, error), d in zip(ctl.seen, ctl.decisions, strict=True):
        assert d.at == at and d.before == live
        if live == stock_pair():
            continue
        if score + error <= stock:
            assert d.after != live
        elif d.after == live:
            assert score + error > stock


def test_with_sampled_shadows_a_dip_within_the_noise_does_not_send_auto_back():
    """A workload where the served pair's sampled score falls under stock's, within its
    error: the margin keeps it (before, the first such dip sent ``auto`` back)."""
    ctl = run_sampled_margin(0, 94, 8)
    within = [at for at, live, score, stock, error in ctl.seen
              if live != stock_pair() and score <= stock < score + error]
    kept = {d.at for d in ctl.decisions if d.before == d.after != stock_pair()}
    assert within and set(within) <= kept


@pytest.mark.parametrize("margin", [-0.1, math.inf, math.nan, "0.3", True])
def test_a_margin_that_is_not_a_finite_number_at_least_zero_is_refused(margin):
    with pytest.raises(UserError, match="margin over stock's pair"):
        PolicyController(None, setup_for(60), ("vllm", "dense"), ("lru",), prefill_flops=flops,
                         stock_margin=margin)
