"""The pool bound (``core/bounds.py``): its hand-computed values, and that no policy the
simulator runs, offline ones included, beats it on random traces and pools."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_admission.core.bounds import pool_bound
from vllm_admission.core.costs import load_model
from vllm_admission.core.traces import load_trace
from vllm_admission.core.traces.trace import capacity_bound
from vllm_admission.sim.settings import SimulationSettings
from vllm_admission.sim.simulator import cache_layout, cache_requests, pool_bound_of, simulate

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
    with pytest.raises(ValueError, match="num_blocks >= 2"):
        pool_bound([], block_size=B, num_blocks=1, per_token_groups=1, state_groups=1)


COSTS = load_model("qwen3-next-80b-a3b")
PAIRS = [("vllm", "lru"), ("marconi", "flop"), ("dense", "lru"), ("last", "belady"),
         ("dense", "belady"), ("marconi", "belady"), ("dense", "reuse")]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), blocks=st.integers(24, 400),
       requests=st.integers(20, 120))
def test_no_policy_beats_the_pool_bound(seed, blocks, requests):
    trace = load_trace("synthetic", max_requests=requests, seed=seed)
    for admission, eviction in PAIRS:
        st_ = SimulationSettings(admission=admission, eviction=eviction, num_blocks=blocks,
                                 alpha=0.5 if eviction == "flop" else None)
        _, layout = cache_layout(COSTS, st_)
        reqs = cache_requests(trace, layout.pool.block_size)
        bound = pool_bound_of(reqs, layout)
        run = simulate(trace, COSTS, st_, requests=reqs)
        assert run.hit_tokens <= bound.hit_tokens + 1e-6, (admission, eviction, bound)
        assert bound.hit_tokens <= bound.infinite_hit_tokens
