"""core.free_blocks.FreeBlocks: with LRU it is vLLM's free list, operation for operation.

The reference below is vLLM 0.32's ``FreeKVCacheBlockQueue`` written as a plain
list (head = index 0): ``prepend_n`` inserts at the head in the given order,
``append_n`` appends, ``popleft_n`` takes from the head, ``remove`` deletes
anywhere. Blocks appended without a hash (``unpin_blocks``) are the one place
FreeBlocks departs from that list on purpose: they stay behind every cached
block, whatever the policy. tests/test_plugin_free_queue.py checks the plugin's adapter against
vLLM's own class.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_admission.core.eviction import FlopEviction, LRUEviction
from vllm_admission.core.free_blocks import FreeBlocks

N = 24


def _ops():
    return st.lists(st.tuples(st.sampled_from(["prepend", "append", "take", "remove"]),
                              st.integers(0, 5), st.integers(0, 10_000)),
                    min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(_ops())
def test_lru_order_is_vllms_free_list(ops):
    free = FreeBlocks(LRUEviction())
    ref: list[int] = []           # vLLM's list, head first
    cached: set[int] = set()      # blocks that were appended with a hash
    held = list(range(1, N))      # blocks not free
    for now, (op, k, pick) in enumerate(ops, start=1):
        if op in ("prepend", "append"):
            ids = held[:k]
            del held[:k]
            if op == "prepend":
                free.push_uncached(ids)
                ref[:0] = ids
            else:
                free.add_cached(ids, now)
                cached.update(ids)
                ref.extend(ids)
        elif op == "take":
            k = min(k, len(ref))
            got = free.take(k, now)
            assert got == ref[:k]
            del ref[:k]
            cached.difference_update(got)
            held.extend(got)
        elif ref:
            b = ref[pick % len(ref)]
            assert free.remove(b) == (b in cached)
            ref.remove(b)
            cached.discard(b)
            held.append(b)
        assert free.order(now) == ref
        assert len(free) == len(ref)


def test_take_more_than_free_raises_and_changes_nothing():
    free = FreeBlocks(LRUEviction())
    free.push_uncached([1, 2])
    free.add_cached([3], now=1.0)
    with pytest.raises(ValueError, match="cannot take 4 blocks, 3 are free"):
        free.take(4, now=2.0)
    assert free.order(2.0) == [1, 2, 3]


def test_remove_of_a_block_that_is_not_free_raises():
    free = FreeBlocks(LRUEviction())
    free.push_uncached([1])
    with pytest.raises(KeyError):
        free.remove(7)


def test_cached_tier_follows_the_policy_and_clone_is_independent():
    # flop with a large alpha keeps the valuable block longest, whatever its age.
    free = FreeBlocks(FlopEviction(alpha=10.0))
    free.push_uncached([1])
    free.add_cached([2, 3, 4], now=1.0, values=[5.0, 0.0, 1.0])
    copy = free.clone(free.eviction.clone())
    assert free.take(4, now=2.0) == [1, 3, 4, 2]
    assert len(free) == 0
    assert copy.order(2.0) == [1, 3, 4, 2]
    assert len(copy) == 4


def test_unpinned_blocks_stay_behind_later_cached_ones():
    free = FreeBlocks(LRUEviction())
    free.append_last_resort([7])
    free.add_cached([3, 4], now=1.0)
    free.push_uncached([1])
    assert free.order(2.0) == [1, 3, 4, 7]
    assert free.remove(7) is False
    assert free.take(3, now=2.0) == [1, 3, 4]


def test_uncache_all_keeps_the_hand_out_order():
    free = FreeBlocks(LRUEviction())
    free.add_cached([5, 6], now=1.0)
    free.push_uncached([1, 2])
    free.append_last_resort([9])
    assert free.uncache_all(now=3.0) == [1, 2, 5, 6, 9]
    assert free.num_cached == 0 and len(free.eviction) == 0
    assert free.take(5, now=4.0) == [1, 2, 5, 6, 9]


def test_switch_hands_demoted_candidates_over_first_as_the_oldest():
    free = FreeBlocks(LRUEviction(), switchable=True)
    free.add_cached([1, 2, 3], now=1.0, values=[0.1, 0.2, 0.3])
    free.add_cached([4, 5], now=2.0, values=[0.4, 0.5])
    free.add_cached([6], now=3.0, values=[0.6])
    demoted = {5, 2}
    free.switch(LRUEviction(), demote=demoted.__contains__)
    # Demoted first (in free order), then the rest in free order.
    assert free.order(now=4.0) == [2, 5, 1, 3, 4, 6]
    # They now count as freed at the earliest time, values kept: a flop policy
    # switched in next sees them that way (alpha 0 orders by time, ties by arrival).
    flop = FlopEviction(alpha=0.0)
    free.switch(flop)
    assert free.order(now=4.0) == [2, 5, 1, 3, 4, 6]
    assert flop.utility(5, now=4.0) == flop.utility(1, now=4.0) < flop.utility(4, now=4.0)
    # Nothing to demote: the order is untouched.
    free.switch(LRUEviction(), demote=lambda b: False)
    assert free.order(now=4.0) == [2, 5, 1, 3, 4, 6]
    assert len(free) == 6 and free.num_cached == 6
