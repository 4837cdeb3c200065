"""PolicyFreeBlockQueue (here with FlopEviction) against vLLM 0.32's FreeKVCacheBlockQueue, with
real KVCacheBlock objects.

vLLM's queue semantics (``vllm/v1/core/kv_cache_utils.py``, used by
``vllm/v1/core/block_pool.py``): ``prepend_n`` puts blocks at the head in list
order, ``append_n`` at the tail, ``popleft``/``popleft_n`` take from the head,
``remove`` takes a block out of the middle. ``BlockPool.free_blocks`` prepends
blocks without a hash and appends cached ones.
"""

from __future__ import annotations

import inspect
import math
import random

import pytest

pytest.importorskip("vllm")

from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    make_block_hash_with_group_id,
)

from vllm_admission.core.eviction import FlopEviction  # noqa: E402
from vllm_admission.plugin.free_queue import PolicyFreeBlockQueue  # noqa: E402


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def blocks(n):
    return [KVCacheBlock(i) for i in range(n)]


def cache(block, tag=None, group=0, tokens=128):
    key = make_block_hash_with_group_id(bytes(f"h{block.block_id}-{tag}", "ascii"), group)
    block.set_block_hash(key, num_tokens=tokens)


def ids(bs):
    return [b.block_id for b in bs]


def test_serves_every_method_vllm_calls():
    public = {n for n, _ in inspect.getmembers(FreeKVCacheBlockQueue, inspect.isfunction)
              if not n.startswith("_")}
    assert public <= set(dir(PolicyFreeBlockQueue)), public - set(dir(PolicyFreeBlockQueue))
    q = PolicyFreeBlockQueue(blocks(4), FlopEviction())
    assert q.num_free_blocks == 4


def test_fresh_queue_hands_out_blocks_in_vllms_order():
    ours = PolicyFreeBlockQueue(blocks(10), FlopEviction())
    theirs = FreeKVCacheBlockQueue(blocks(10))
    assert ids(ours.get_all_free_blocks()) == ids(theirs.get_all_free_blocks())
    assert ours.popleft().block_id == theirs.popleft().block_id == 0
    assert ids(ours.popleft_n(3)) == ids(theirs.popleft_n(3)) == [1, 2, 3]


def test_random_operations_match_vllm_with_alpha_zero():
    """With alpha = 0 FLOP ordering is pure recency: every hand-out equals vLLM's LRU queue.

    Operations follow BlockPool: a freed batch is split into uncached blocks (prepended)
    and cached ones (appended, one time stamp per batch); hits remove cached free blocks.
    """
    rng = random.Random(3)
    mine, theirs = blocks(64), blocks(64)
    clock = Clock()
    ours = PolicyFreeBlockQueue(mine, FlopEviction(0.0), clock=clock)
    ref = FreeKVCacheBlockQueue(theirs)
    held: list[int] = []
    for step in range(2000):
        clock.now += 1.0
        op = rng.random()
        if op < 0.45 and ours.num_free_blocks:
            n = rng.randrange(1, min(6, ours.num_free_blocks) + 1)
            a, b = ours.popleft_n(n), ref.popleft_n(n)
            assert ids(a) == ids(b)
            for x in a:
                mine[x.block_id].reset_hash()
                theirs[x.block_id].reset_hash()
            held.extend(ids(a))
        elif op < 0.85 and held:
            rng.shuffle(held)
            k = rng.randrange(1, len(held) + 1)
            freed, held = held[:k], held[k:]
            for bid in freed:  # a hit block keeps its hash; others may get one
                if mine[bid].block_hash is None and rng.random() < 0.6:
                    cache(mine[bid], step)
                    cache(theirs[bid], step)
            uncached = [bid for bid in freed if mine[bid].block_hash is None]
            cached = [bid for bid in freed if mine[bid].block_hash is not None]
            ours.prepend_n([mine[b] for b in uncached])
            ref.prepend_n([theirs[b] for b in uncached])
            ours.append_n([mine[b] for b in cached])
            ref.append_n([theirs[b] for b in cached])
        else:
            free_cached = [b for b in ids(ref.get_all_free_blocks()) if theirs[b].block_hash]
            if free_cached:
                bid = rng.choice(free_cached)
                ours.remove(mine[bid])
                ref.remove(theirs[bid])
                held.append(bid)
        assert ours.num_free_blocks == ref.num_free_blocks
        if step % 50 == 0:
            assert ids(ours.get_all_free_blocks()) == ids(ref.get_all_free_blocks())
    assert ids(ours.get_all_free_blocks()) == ids(ref.get_all_free_blocks())


def test_uncached_blocks_go_first_then_flop_order():
    bs = blocks(8)
    clock = Clock()
    q = PolicyFreeBlockQueue([], FlopEviction(1.0), clock=clock)
    # Two cached batches: blocks 0-2 freed at t=1 (values 5, 1, 3), 3-4 at t=2 (values 0, 9).
    for b in bs[:5]:
        cache(b)
    values = {0: 5.0, 1: 1.0, 2: 3.0, 3: 0.0, 4: 9.0}
    clock.now = 1.0
    for b in bs[:3]:
        q.stage_value(b, values[b.block_id])
    q.append_n(bs[:3])
    clock.now = 2.0
    q.free_stamp = (2.0, lambda b: values[b.block_id])
    q.append_n(bs[3:5])
    q.free_stamp = None
    q.prepend_n([bs[5], bs[6]])
    clock.now = 3.0
    order = ids(q.get_all_free_blocks())
    assert order[:2] == [5, 6]
    # Brute force Marconi's utility at t=3: recency 1/(3-t+1) min-max normalised, plus
    # alpha x min-max normalised value; lowest first, ties to the earlier freed block.
    t = {0: 1.0, 1: 1.0, 2: 1.0, 3: 2.0, 4: 2.0}
    rec = {b: 1 / (3 - t[b] + 1) for b in t}
    rlo, rhi = min(rec.values()), max(rec.values())
    vlo, vhi = min(values.values()), max(values.values())
    util = {b: (rec[b] - rlo) / (rhi - rlo) + (values[b] - vlo) / (vhi - vlo) for b in t}
    expect = sorted(t, key=lambda b: (util[b], b))
    assert order[2:] == expect
    assert ids(q.popleft_n(7)) == order
    assert q.num_free_blocks == 0
    with pytest.raises(ValueError):
        q.popleft()


def test_remove_from_every_tier_and_errors():
    bs = blocks(6)
    q = PolicyFreeBlockQueue(bs[:2], FlopEviction())
    cache(bs[2])
    q.append_n([bs[2], bs[3]])     # bs[3] has no hash: the last-resort FIFO
    assert q.num_free_blocks == 4
    for b in (bs[0], bs[2], bs[3]):
        q.remove(b)
    assert ids(q.get_all_free_blocks()) == [1]
    with pytest.raises(RuntimeError):
        q.remove(bs[5])
    with pytest.raises(ValueError):
        q.popleft_n(2)
    assert q.num_free_blocks == 1


def test_unhashed_appended_blocks_are_last_resort():
    bs = blocks(4)
    q = PolicyFreeBlockQueue([bs[0]], FlopEviction())
    q.append_n([bs[1]])            # like BlockPool.unpin_blocks: no hash, evict last
    cache(bs[2])
    q.append_n([bs[2]])
    assert ids(q.popleft_n(3)) == [0, 2, 1]


def test_forget_hashes_keeps_order_and_empties_the_policy():
    bs = blocks(5)
    flop = FlopEviction(0.0)
    clock = Clock()
    q = PolicyFreeBlockQueue([bs[0]], flop, clock=clock)
    for b in bs[1:4]:
        cache(b)
    clock.now = 1.0
    q.append_n(bs[1:4])
    before = ids(q.get_all_free_blocks())
    for b in bs:
        b.reset_hash()             # BlockPool.reset_prefix_cache drops every hash
    q.forget_hashes()
    assert len(flop) == 0 and q.num_cached_candidates == 0
    assert ids(q.get_all_free_blocks()) == before
    assert ids(q.popleft_n(4)) == before


def test_alpha_change_reorders_candidates():
    bs = blocks(2)
    clock = Clock()
    flop = FlopEviction(0.0)
    q = PolicyFreeBlockQueue([], flop, clock=clock)
    cache(bs[0])
    cache(bs[1])
    clock.now = 1.0
    q.stage_value(bs[0], 100.0)    # older but valuable
    q.append_n([bs[0]])
    clock.now = 2.0
    q.stage_value(bs[1], 0.0)      # newer, worthless
    q.append_n([bs[1]])
    clock.now = 3.0
    assert ids(q.get_all_free_blocks()) == [0, 1]   # recency only
    flop.alpha = 2.0
    assert ids(q.get_all_free_blocks()) == [1, 0]
    assert math.isclose(flop.alpha, 2.0)


def test_block_pool_runs_on_the_adapter():
    """vLLM's BlockPool with the adapter in place: allocation, caching, hits and frees."""
    from vllm.v1.core.block_pool import BlockPool

    pools = [BlockPool(num_gpu_blocks=16, enable_caching=True, hash_block_size=16)
             for _ in range(2)]
    pools[1].free_block_queue = PolicyFreeBlockQueue(
        pools[1].free_block_queue.get_all_free_blocks(), FlopEviction(0.0))
    rng = random.Random(0)
    history = []
    for step in range(300):
        n = rng.randrange(1, 5)
        got = [p.get_new_blocks(n) for p in pools]
        assert ids(got[0]) == ids(got[1])
        history.append(ids(got[0]))
        keep = rng.random() < 0.5
        for p, new in zip(pools, got, strict=True):
            if keep:
                for b in new:
                    p._insert_block_hash(make_block_hash_with_group_id(
                        bytes(f"{step}-{b.block_id}", "ascii"), 0), b, num_tokens=16)
            p.free_blocks(reversed(new))
        assert pools[0].get_num_free_blocks() == pools[1].get_num_free_blocks() == 15
        hashed = [b.block_id for b in pools[0].free_block_queue.get_all_free_blocks()
                  if b.block_hash is not None]
        if hashed and rng.random() < 0.3:  # a prefix hit takes a cached block back
            bid = rng.choice(hashed)
            for p in pools:
                p.touch([p.blocks[bid]])
                assert p.get_num_free_blocks() == 14
                p.free_blocks([p.blocks[bid]])
    assert ids(pools[0].free_block_queue.get_all_free_blocks()) == \
        ids(pools[1].free_block_queue.get_all_free_blocks())
    assert pools[1].reset_prefix_cache() is True


def test_a_staged_value_does_not_outlive_the_blocks_hash():
    """Stage a value, drop the block's hash, reuse the block under another hash: the new
    content is valued afresh (the stale 99.0 would make the block look precious)."""
    bs = blocks(2)
    clock = Clock()
    flop = FlopEviction(1.0)
    q = PolicyFreeBlockQueue([], flop, clock=clock)
    cache(bs[0])
    q.stage_value(bs[0], 99.0)
    bs[0].reset_hash()                 # the hash is dropped before the block came back
    cache(bs[0], tag="new")            # ... and the block is reused for other content
    q.free_stamp = (1.0, lambda b: 0.0)
    q.append_n([bs[0]])
    cache(bs[1])
    q.free_stamp = (1.0, lambda b: 5.0)
    q.append_n([bs[1]])
    clock.now = 2.0
    assert ids(q.get_all_free_blocks()) == [0, 1]   # 0 carries value 0, not the stale 99
