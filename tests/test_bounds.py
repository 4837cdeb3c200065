"""The pool bound and its LP (``core/bounds.py``): their hand-computed values, and that no
policy the simulator runs, offline ones included, beats them on random traces and pools."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_admission.core.bounds import lp_bound, pool_bound
from vllm_admission.core.costs import load_model
from vllm_admission.core.traces import load_trace
from vllm_admission.core.traces.trace import capacity_bound
from vllm_admission.sim.simulation_settings import SimulationSettings
from vllm_admission.sim.simulator import (
    cache_layout,
    cache_requests,
    lp_bound_of,
    pool_bound_of,
    simulate,
)

B = 4


def test_a_roomy_pool_gives_the_infinite_capacity_bound():
    # The same 3-block prompt twice: the second hits 2 blocks (the last token is recomputed).
    reqs = [([1, 2, 3], 3 * B, 1), ([1, 2, 3], 3 * B, 1)]
    b = pool_bound(reqs, block_size=B, num_blocks=1000, per_token_groups=1, state_groups=1)
    assert b.infinite_hit_tokens == capacity_bound(reqs, B)[0] == 2 * B
    assert b.hit_tokens == pytest.approx(2 * B)
    assert b.multiplier == 0.0


def test_a_pool_too_small_to_keep_anything_between_requests():
    """Request 0 holds 3 KV blocks + 1 state while served; request 1 must hold its own
    blocks beside what it hits. Slot budget 2 x 4 = 8 block-slots; own blocks take
    4 + 4 = 8 before any hit, and a 1-block hit costs 1 + 1 - 1 = 1 more: none fits."""
    reqs = [([1, 2, 3], 3 * B, 1), ([1, 2, 3], 3 * B, 1)]
    b = pool_bound(reqs, block_size=B, num_blocks=5, per_token_groups=1, state_groups=1)
    assert b.hit_tokens == pytest.approx(0.0, abs=1e-6)
    # One more block: a 1-block hit fits (cost 1), a 2-block one (cost 1 + 1 + 1 - 2 = 1)
    # too; the dual's optimum is the 2-block hit.
    b = pool_bound(reqs, block_size=B, num_blocks=6, per_token_groups=1, state_groups=1)
    assert b.hit_tokens == pytest.approx(2 * B, rel=1e-6)


def test_a_request_that_never_fits_holds_and_hits_nothing():
    """The simulator skips a request too large for the pool: it computes no block, so a
    later request cannot hit what only it contained."""
    reqs = [([1, 2, 3], 3 * B, 1), ([1, 2, 3], 3 * B, 1)]
    first_skipped = iter([False, True]).__next__
    b = pool_bound(reqs, block_size=B, num_blocks=1000, per_token_groups=1, state_groups=1,
                   fits=lambda p, o: first_skipped())
    assert b.hit_tokens == b.infinite_hit_tokens == 0
    assert b.prompt_tokens == 6 * B


def test_bad_pools_are_refused():
    for bound in (pool_bound, lp_bound):
        with pytest.raises(ValueError, match="num_blocks >= 2"):
            bound([], block_size=B, num_blocks=1, per_token_groups=1, state_groups=1)
    with pytest.raises(ValueError, match="window"):
        lp_bound([], block_size=B, num_blocks=8, per_token_groups=1, state_groups=1, window=0)


@pytest.mark.parametrize("num_blocks,hit", [(1000, 2 * B), (5, 0), (6, 2 * B)])
def test_the_lp_on_the_hand_computed_cases(num_blocks, hit):
    """The cases above, where the best hits are whole: the LP finds them exactly."""
    reqs = [([1, 2, 3], 3 * B, 1), ([1, 2, 3], 3 * B, 1)]
    b = lp_bound(reqs, block_size=B, num_blocks=num_blocks, per_token_groups=1, state_groups=1)
    assert b.hit_tokens == pytest.approx(hit, abs=1e-6)
    assert b.variables == 4   # h and e for each of the 2 blocks the second request may hit


def test_the_lp_takes_fractions_where_a_whole_hit_does_not_fit():
    """Request 2 repeats request 0 across request 1 (other blocks). Its hit of k blocks keeps
    their KV and the state at the k-th over slot 1, beside request 1's 4 own blocks; 6
    usable blocks leave 2. A 2-block hit needs 3 there, a 1-block hit 2: the integer optimum
    is 1 block (B tokens). The LP's best: h1 = h2 = 2/3 (2 h1 + h2 <= 2), 4/3 blocks. With 7
    usable blocks the whole 2-block hit fits."""
    reqs = [([1, 2, 3], 3 * B, 1), ([7, 8, 9], 3 * B, 1), ([1, 2, 3], 3 * B, 1)]
    tight = lp_bound(reqs, block_size=B, num_blocks=7, per_token_groups=1, state_groups=1)
    assert tight.hit_tokens == pytest.approx(4 / 3 * B)
    roomy = lp_bound(reqs, block_size=B, num_blocks=8, per_token_groups=1, state_groups=1)
    assert roomy.hit_tokens == pytest.approx(2 * B)


COSTS = load_model("qwen3-next-80b-a3b")
PAIRS = [("vllm", "lru"), ("marconi", "flop"), ("dense", "lru"), ("last", "belady"),
         ("dense", "belady"), ("marconi", "belady"), ("dense", "reuse")]


@pytest.mark.slow   # about 12 s: every registered policy on 12 drawn workloads
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), blocks=st.integers(24, 400),
       requests=st.integers(20, 120))
def test_no_policy_beats_the_pool_bound(seed, blocks, requests):
    trace = load_trace("synthetic", max_requests=requests, seed=seed)
    for admission, eviction in PAIRS:
        st_ = SimulationSettings.of(admission, eviction, num_blocks=blocks,
                                 alpha=0.5 if eviction == "flop" else None)
        _, layout = cache_layout(COSTS, st_)
        reqs = cache_requests(trace, layout.pool.block_size)
        bound = pool_bound_of(reqs, layout)
        run = simulate(trace, COSTS, st_, requests=reqs)
        assert run.hit_tokens <= bound.hit_tokens + 1e-6, (admission, eviction, bound)
        assert bound.hit_tokens <= bound.infinite_hit_tokens


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), blocks=st.integers(24, 400),
       requests=st.integers(20, 120))
def test_the_lp_is_below_the_pool_bound_and_above_every_policy(seed, blocks, requests):
    """By LP duality the exact LP is at most the pool bound's dual value; summing slots into
    windows only loosens it; and no policy beats either."""
    trace = load_trace("synthetic", max_requests=requests, seed=seed)
    for admission, eviction in PAIRS[:4]:
        st_ = SimulationSettings.of(admission, eviction, num_blocks=blocks,
                                 alpha=0.5 if eviction == "flop" else None)
        _, layout = cache_layout(COSTS, st_)
        reqs = cache_requests(trace, layout.pool.block_size)
        exact = lp_bound_of(reqs, layout)
        windowed = lp_bound_of(reqs, layout, window=5)
        assert exact.hit_tokens <= pool_bound_of(reqs, layout).hit_tokens + 1e-6
        assert exact.hit_tokens <= windowed.hit_tokens + 1e-6
        run = simulate(trace, COSTS, st_, requests=reqs)
        assert run.hit_tokens <= exact.hit_tokens + 1e-6, (admission, eviction, exact)
