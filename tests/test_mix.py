"""``mix``'s own rules (the registry-wide eviction tests run it too): regret lowers the weight
of the expert that evicted a returning hash (LeCaR, HotStorage 2018), victims come from the
chosen expert, the other experts let the victim go, ghosts are bounded, clones are
independent, the Cacheus-style learning rate moves."""

from __future__ import annotations

import math

import pytest

from vllm_admission.core.eviction import ExpertMixEviction, get_eviction
from vllm_admission.core.eviction.mix import DISCOUNT_AT_N


def fill(p, n, start=0, now=0.0, tag="h"):
    """Cache and free blocks ``start``..``start + n - 1``, each with its own key ``(tag, b)``."""
    for b in range(start, start + n):
        p.on_cache(b, (tag, b))
        p.add(b, now)
    return p


def lru_lfu_disagree(**options):
    """Blocks 0, 1, 2 freed in order; block 0 was hit twice, block 1 once: ``lru`` evicts
    0 first, ``lfu`` evicts 2 first."""
    p = ExpertMixEviction(choice="heaviest", **options)
    for b in range(3):
        p.on_cache(b, ("h", b))
    for b, hits in ((0, 2), (1, 1)):
        for _ in range(hits):
            p.on_hit(b, 0)
    for b in range(3):
        p.add(b, 0)
    return p


def test_the_victim_comes_from_the_chosen_expert():
    p = lru_lfu_disagree()
    p.weights = [0.9, 0.1]                 # lru
    assert p.pop(1) == 0
    q = lru_lfu_disagree()
    q.weights = [0.1, 0.9]                 # lfu
    assert q.pop(1) == 2
    assert (p.chosen, q.chosen) == ([1, 0], [0, 1])
    # the others let the victim go: the rest is still ordered by each expert
    assert 0 not in p and len(p) == 2 and p.pop(1) == 1


def test_a_returning_hash_lowers_the_weight_of_the_expert_that_evicted_it():
    p = lru_lfu_disagree()
    p.weights = [0.6, 0.4]
    assert p.pop(1) == 0                   # lru evicts ("h", 0): a ghost in lru's history
    assert ("h", 0) in p.ghosts[0] and not p.ghosts[1]
    evicted_at = p.ghosts[0][("h", 0)]
    for b in (4, 5, 6):                    # request 2 caches three blocks, then the hash again
        p.on_cache(b, ("h", b))
    p.on_cache(7, ("h", 0))
    assert p.weights == [0.6, 0.4]         # the regret waits for the next request ...
    p.add(7, 2)                            # ... whose first event applies it
    age, n = p.clock - evicted_at, p.hist.cap      # N: the most blocks cached at once
    assert age == 4 and n == 6
    r = math.exp(-0.45 * (DISCOUNT_AT_N ** (1 / n)) ** age)
    assert p.weights[0] == pytest.approx(0.6 * r / (0.6 * r + 0.4)) and p.weights[0] < 0.6
    assert sum(p.weights) == pytest.approx(1.0)
    assert p.regrets == [1, 0] and ("h", 0) not in p.ghosts[0]


def test_an_older_regret_weighs_less():
    young, old = lru_lfu_disagree(), lru_lfu_disagree()
    for p, wait in ((young, 1), (old, 3)):    # N = 3: d ** 3 = 0.005
        p.weights = [0.6, 0.4]
        p.pop(1)
        for k in range(wait):                 # ``wait`` requests of one reference each
            p.on_cache(10 + k, ("x", k))
            p.add(10 + k, 2 + k)
        p.on_cache(7, ("h", 0))
        p.add(7, 10)
    assert young.weights[0] < old.weights[0] < 0.6


def test_a_hash_still_cached_elsewhere_leaves_no_ghost():
    p = ExpertMixEviction(choice="heaviest")
    p.weights = [1.0, 0.0]
    for b in (0, 1):
        p.on_cache(b, "same prefix")
    p.add(0, 0)
    assert p.pop(1) == 0 and not p.ghosts[0]


def test_spread_gives_each_expert_its_weights_share_without_randomness():
    p = fill(ExpertMixEviction(), 40)
    p.weights = [0.75, 0.25]
    p.pop_n(40, 1)
    assert p.chosen == [30, 10]


def test_random_choice_is_seeded():
    a, b = (fill(ExpertMixEviction(choice="random", seed=3), 30) for _ in range(2))
    for p in (a, b):
        for blk in range(0, 30, 3):
            p.remove(blk)
            p.on_hit(blk, 1)
            p.add(blk, 1)
        p.weights = [0.5, 0.5]
    assert a.pop_n(30, 2) == b.pop_n(30, 2) and a.chosen == b.chosen and 0 < a.chosen[0] < 30


def test_the_other_experts_forget_the_victim():
    """``lru`` evicts block 0 (two hits); cached again under a new hash, ``lfu`` counts it
    from zero, so it goes before block 1 (one hit)."""
    p = lru_lfu_disagree()
    p.weights = [1.0, 0.0]
    assert p.pop(1) == 0
    p.on_cache(0, ("new", 0))
    p.add(0, 1)
    p.weights = [0.0, 1.0]
    assert p.pop(2) == 2 and p.pop(2) == 0


def test_reuse_as_an_expert_sees_another_experts_eviction_as_a_ghost():
    p = ExpertMixEviction(experts=("lru", "reuse"), choice="heaviest")
    p.weights = [1.0, 0.0]
    fill(p, 3)
    assert p.pop(1) == 0
    p.on_cache(5, ("h", 0))                # recomputed after lru evicted it
    assert p.hist.again(5)
    assert p.experts[1].hist is p.hist


def test_ghosts_are_bounded_by_the_cache_size():
    p = ExpertMixEviction(ghost_factor=1.0)
    for round_ in range(6):                # a pool of 10 blocks, new hashes every round
        fill(p, 10, now=float(round_), tag=round_)
        p.pop_n(10, float(round_))
    assert p.hist.cap == 10
    assert sum(len(g) for g in p.ghosts) <= 2 * 10
    assert all(len(g) <= 10 for g in p.ghosts)


def test_clone_is_independent():
    p = ExpertMixEviction(experts=("lru", "lfu", "reuse", "s3fifo"), choice="random")
    fill(p, 12)
    for b in (1, 4, 7):
        p.remove(b)
        p.on_hit(b, 1)
        p.add(b, 1)
    p.pop_n(3, 2)
    c = p.clone()
    assert c.experts[2].hist is c.hist and c.hist is not p.hist
    assert c.pop_n(4, 3) == p.pop_n(4, 3) and c.weights == p.weights
    ghost = next(k for g in c.ghosts for k in g)
    before = p.weights[:]
    c.on_cache(50, ghost)                  # a regret in the clone only
    c.add(50, 4)
    assert p.weights == before and c.weights != before
    assert ghost in {k for g in p.ghosts for k in g}


def test_adaptive_rate_moves_with_the_hit_rate():
    """Windows of ``N`` = 4 references; the rate steps by 1.25x."""
    p = fill(ExpertMixEviction(), 4)
    p.adaptive = True               # from here on, with N = 4 known
    fresh = iter(range(1, 100))

    def hits(now):
        for b in list(p.hist.cached_keys()):
            p.on_hit(b, now)

    def misses(now):
        p.pop_n(4, now)
        fill(p, 4, now=now, tag=next(fresh))        # the same 4 blocks, new hashes

    hits(1)                          # rose, but the rate has not moved yet: no direction
    assert p.learning_rate == 0.45
    misses(2)                        # fell, no direction: dithered (up first)
    assert p.hist.cap == 4 and p.learning_rate == pytest.approx(0.45 * 1.25)
    hits(3)                          # rose after a rise of the rate: up again
    assert p.learning_rate == pytest.approx(0.45 * 1.25 ** 2)
    misses(4)                        # fell after a rise: back down
    assert p.learning_rate == pytest.approx(0.45 * 1.25)
    misses(5)                        # unchanged (0 of 4) after a fall: no gain, dithered down
    assert p.learning_rate == pytest.approx(0.45)


@pytest.mark.parametrize("options, match", [
    ({"experts": ("lru",)}, "two distinct"),
    ({"experts": ("lru", "lru")}, "two distinct"),
    ({"experts": ("lru", "belady")}, "unknown expert"),
    ({"learning_rate": 0.0}, "learning_rate"),
    ({"discount": 1.5}, "discount"),
    ({"ghost_factor": -1}, "ghost_factor"),
    ({"choice": "vote"}, "choice"),
    ({"min_weight": 0.5}, "min_weight"),
])
def test_bad_options_are_one_line_errors(options, match):
    with pytest.raises(ValueError, match=match):
        ExpertMixEviction(**options)


def test_registered_with_lecars_parameters():
    p = get_eviction("mix")
    assert p.expert_names == ("lru", "lfu") and p.learning_rate == 0.45
    assert p.discount is None and p.ghost_factor == 1.0 and not p.adaptive
    assert p.needs_keys and p.needs_hits and p.keeps_history and not p.auto_candidate


def test_a_mix_switched_in_mid_run_knows_the_hashes_already_cached():
    """``auto`` builds a mix on its shared history when it switches to it: the blocks
    cached so far have their hashes, so their eviction leaves ghosts."""
    from vllm_admission.core.eviction import ReuseHistory

    hist = ReuseHistory()
    for b in range(6):
        hist.cached(b, ("h", b))
    p = ExpertMixEviction.with_history(hist, choice="heaviest")
    assert p.hist is hist and p.hist.cap == 6
    for b in range(6):
        p.add(b, 0)
    p.weights = [1.0, 0.0]
    assert p.pop(1) == 0 and ("h", 0) in p.ghosts[0]


def test_a_weight_floor_keeps_every_expert_in_play():
    def thirty_regrets_of_lru(p):
        p.weights = [1.0, 0.0]
        for k in range(30):
            p.ghosts[0][("g", k)] = p.clock
            p.on_cache(100 + k, ("g", k))
            p.add(100 + k, k + 1)           # the next request applies it
        return p.weights

    floored = thirty_regrets_of_lru(ExpertMixEviction(min_weight=0.1, choice="heaviest"))
    assert floored[0] == pytest.approx(0.1) and sum(floored) == pytest.approx(1.0)
    # LeCaR: a weight at 0 stays there
    assert thirty_regrets_of_lru(ExpertMixEviction(choice="heaviest"))[0] == pytest.approx(1.0)
