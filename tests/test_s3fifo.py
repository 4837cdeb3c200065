"""``s3fifo``'s own rules (the registry-wide eviction tests run it too): probation, promotion
on a hit, ghosts by hash key, the main queue's second chance (SOSP 2023, section 4)."""

from __future__ import annotations

import pytest

from vllm_admission.core.eviction import S3FifoEviction, get_eviction


def fresh(n, **options):
    """A policy with ``n`` blocks (ids 0...), each with its own hash key, freed in order."""
    p = S3FifoEviction(**options)
    for b in range(n):
        p.on_cache(b, ("h", b))
        p.add(b, 0)
    return p


def test_blocks_never_hit_leave_first_in_free_order():
    p = fresh(5)
    assert [p.pop(2) for _ in range(5)] == [0, 1, 2, 3, 4]
    with pytest.raises(IndexError):
        p.pop(2)


def test_a_block_hit_on_probation_moves_to_main_instead_of_leaving():
    p = fresh(4)
    p.on_hit(0, 1)                      # block 0 was hit (while a candidate: counts anyway)
    assert p.pop(2) == 1                # 0 is oldest but goes to main
    assert 0 in p and len(p) == 3
    assert [p.pop(2) for _ in range(2)] == [2, 3]
    assert p.pop(2) == 0                # main: its one hit was spent on the promotion


def test_main_gives_a_hit_block_a_second_chance():
    p = S3FifoEviction(small_fraction=0.5)
    for b in range(3):
        p.on_cache(b, ("h", b))
        p.add(b, 0)
        p.on_hit(b, 0)
    # all three promoted on the first pop, then main evicts in order: none has hits left
    assert p.pop(1) == 0
    p.remove(1)                         # block 1 taken back by a prefix hit...
    p.on_hit(1, 2)
    p.add(1, 3)                         # ...and freed again: back in main, one hit to spend
    assert p.pop(4) == 2
    assert p.pop(4) == 1


def test_an_evicted_hash_cached_again_skips_probation():
    p = S3FifoEviction()
    p.on_cache(0, "prefix-A")
    p.add(0, 0)
    assert p.pop(1) == 0                # evicted from probation: "prefix-A" is a ghost
    for b, key in ((1, "prefix-A"), (2, "B"), (3, "C")):
        p.on_cache(b, key)              # block 1 holds the same hash again
        p.add(b, 2)
    # probation (2, 3) is over its share: its blocks leave first, block 1 (main) last
    assert [p.pop(3) for _ in range(3)] == [2, 3, 1]


def test_forget_drops_what_is_kept_per_block():
    p = S3FifoEviction()
    p.on_cache(0, "k")
    p.on_hit(0, 0)
    p.forget(0)                         # lost its hash while held
    p.on_cache(0, "other")
    p.add(0, 1)
    p.on_cache(1, "x")
    p.add(1, 1)
    assert p.pop(2) == 0                # no hit remembered: evicted from probation


def test_clone_is_independent_and_equal():
    p = S3FifoEviction(small_fraction=0.3, promote_hits=2, ghost_factor=2.0)
    for b in range(6):
        p.on_cache(b, b % 3)
        p.add(b, b)
        if b % 2:
            p.on_hit(b, b)
    q = p.clone()
    assert [p.pop(9) for _ in range(6)] == [q.pop(9) for _ in range(6)]
    assert len(q) == 0


@pytest.mark.parametrize(("options", "message"), [
    ({"small_fraction": 0.0}, "small_fraction"), ({"small_fraction": 1.0}, "small_fraction"),
    ({"promote_hits": 0}, "promote_hits"), ({"ghost_factor": 0.0}, "ghost_factor")])
def test_bad_parameters_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        get_eviction("s3fifo", **options)


def test_a_candidate_added_twice_is_refused():
    p = S3FifoEviction()
    p.add(0, 0)
    with pytest.raises(KeyError):
        p.add(0, 1)
