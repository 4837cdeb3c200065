"""Eviction policies: a contract every policy passes, plus each policy's own order."""

import math
import random
from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_admission.core.admission import UnknownPolicyError
from vllm_admission.core.eviction import (
    ENGINE_EVICTION_POLICIES,
    EVICTION_POLICIES,
    BeladyEviction,
    FlopEviction,
    HistoryKeeper,
    LFUEviction,
    LRUEviction,
    ReuseEviction,
    ReuseHistory,
    eviction_class,
    get_eviction,
    register_eviction,
    stock_eviction,
)

ALL = sorted(EVICTION_POLICIES)
#: Policies ``auto`` may wrap in a HistoryKeeper (they keep no hash history, need no future).
WRAPPABLE = [n for n in ENGINE_EVICTION_POLICIES if not eviction_class(n).keeps_history]


class EvictionPolicyContract:
    """What every eviction policy does, whatever its order (cachetools' style: a
    test class mixes this in and gives the fixture ``make``, a fresh empty policy)."""

    def test_pop_returns_each_added_block_once(self, make):
        pol = make()
        for i in range(10):
            pol.add(i, now=float(i), value=float(i % 3), next_use=float(20 - i))
        assert len(pol) == 10 and all(i in pol for i in range(10))
        popped = [pol.pop(now=10.0) for _ in range(10)]
        assert sorted(popped) == list(range(10))
        assert len(pol) == 0 and 3 not in pol

    def test_removed_block_is_never_popped(self, make):
        pol = make()
        for i in range(6):
            pol.add(i, now=float(i), value=1.0, next_use=5.0)
        pol.remove(2)
        assert 2 not in pol and len(pol) == 5
        assert 2 not in [pol.pop(now=6.0) for _ in range(5)]

    def test_empty_pop_raises_index_error(self, make):
        with pytest.raises(IndexError):
            make().pop(now=0.0)
        pol = make()
        pol.add(1, now=0.0)
        with pytest.raises(IndexError):
            pol.pop_n(2, now=0.0)

    def test_remove_unknown_raises_key_error(self, make):
        with pytest.raises(KeyError):
            make().remove(42)

    def test_add_twice_raises_key_error(self, make):
        pol = make()
        pol.add(3, now=0.0)
        with pytest.raises(KeyError):
            pol.add(3, now=0.0)

    def test_bulk_calls_equal_single_ones(self, make):
        """``add_many`` is ``add`` in order and ``pop_n`` is ``n`` pops, for every
        policy that replaces the base class's loops by faster equivalents."""
        rng = random.Random(5)
        one, bulk = make(), make()
        for pol in (one, bulk):
            if pol.needs_keys:
                for b in range(40):
                    pol.on_cache(b, ("k", b % 7))
        free, t = list(range(40)), 0.0
        rng.shuffle(free)
        while free:
            n = rng.randrange(1, 6)
            ids, free = free[:n], free[n:]
            values = [float(rng.randrange(3)) for _ in ids]
            next_uses = [float(t + rng.randrange(1, 9)) for _ in ids]
            for b, v, nu in zip(ids, values, next_uses, strict=True):
                one.add(b, t, v, nu)
            bulk.add_many(ids, t, values, next_uses)
            t += 1.0
        k = len(one) // 2
        assert [one.pop(t) for _ in range(k)] == bulk.pop_n(k, t)
        assert [one.pop(t) for _ in range(len(one))] == bulk.pop_n(len(bulk), t)

    def test_clone_pops_the_same_order_independently(self, make):
        pol = make()
        for i in range(8):
            pol.add(i, now=float(i // 3), value=float(i % 3), next_use=float(20 - i))
            if pol.needs_hits and i % 2:
                pol.remove(i)
                pol.on_hit(i, now=float(i // 3))
                pol.add(i, now=float(i // 3))
        copy = pol.clone()
        assert copy.pop_n(8, now=5.0) == pol.pop_n(8, now=5.0)

    def test_hooks_it_does_not_override_are_harmless(self, make):
        """The cache may call every hook; a policy that does not listen is unchanged."""
        pol, ref = make(), make()
        for p in (pol, ref):
            for b in range(5):
                p.add(b, now=0.0)
        if not pol.needs_future:
            pol.bind_future(lambda b, now: math.inf)
        if not pol.needs_hits:
            pol.on_hit(9, now=1.0)
            pol.forget(9)
        if not pol.needs_keys:
            pol.on_cache(9, ("k", 9))
        assert pol.pop_n(5, now=2.0) == ref.pop_n(5, now=2.0)

    def test_the_tuning_hook_answers_tunable(self, make):
        pol = make()
        if pol.tunable:
            pol.alpha = 0.5
            assert pol.alpha == 0.5
            with pytest.raises(ValueError):
                pol.alpha = -1.0
        else:
            with pytest.raises(AttributeError):
                pol.alpha  # noqa: B018 - the read is the test
            with pytest.raises(AttributeError):
                pol.alpha = 0.5


@pytest.mark.parametrize("name", ALL)
class TestRegisteredPolicy(EvictionPolicyContract):
    """Every registered policy (a new registry entry is covered without an edit)."""

    @pytest.fixture
    def make(self, name):
        return lambda: get_eviction(name)

    def test_registered_under_its_name(self, name):
        cls = eviction_class(name)
        assert cls.name == name and isinstance(cls.summary, str) and cls.summary
        assert not (cls.auto_candidate and cls.needs_future)

    def test_a_policy_that_keeps_history_shares_it(self, name):
        cls = eviction_class(name)
        hist = ReuseHistory()
        if cls.keeps_history:
            pol = cls.with_history(hist)
            pol.on_cache(1, "k")
            assert hist.cached_keys() == {1: "k"}
        else:
            with pytest.raises(TypeError):
                cls.with_history(hist)


@pytest.mark.parametrize("name", WRAPPABLE)
class TestHistoryKeeper(EvictionPolicyContract):
    """``auto``'s wrapper around every policy that keeps no hash history: the same contract."""

    @pytest.fixture
    def make(self, name):
        return lambda: HistoryKeeper(get_eviction(name), ReuseHistory())

    def test_it_answers_for_the_policy_it_wraps(self, name):
        pol, inner = HistoryKeeper(get_eviction(name), ReuseHistory()), eviction_class(name)
        assert pol.needs_hits and pol.needs_keys and not pol.keeps_history
        assert (pol.needs_values, pol.tunable, pol.name) == (inner.needs_values, inner.tunable, name)


def test_derived_attributes_follow_the_hooks_a_class_overrides():
    """What the simulator and the plugin read instead of policy names: derived once,
    when the class is created, from the hooks it overrides; declared where a fact."""
    assert LRUEviction.vllm_order and LRUEviction.auto_candidate and stock_eviction() == "lru"
    assert FlopEviction.tunable and FlopEviction.needs_values and not FlopEviction.auto_candidate
    assert LFUEviction.needs_hits and not LFUEviction.needs_keys and not LFUEviction.auto_candidate
    assert ReuseEviction.needs_hits and ReuseEviction.needs_keys and ReuseEviction.keeps_history
    assert BeladyEviction.needs_future and not BeladyEviction.needs_hits
    assert tuple(n for n, c in EVICTION_POLICIES.items()
                                             if not c.needs_future) == ENGINE_EVICTION_POLICIES

    class Listener(LRUEviction):
        name, summary = "listener", "lru that counts hits"

        def on_hit(self, block_id, now):
            pass

    assert Listener.needs_hits and not Listener.needs_keys and not Listener.tunable
    # Declarations are the class's own: a subclass under a new name is neither vLLM's
    # order nor an auto candidate unless it says so (issue 34).
    assert not Listener.vllm_order and not Listener.auto_candidate
    with pytest.raises(TypeError, match="derived"):
        class Declared(LRUEviction):  # the class statement is the test
            name, summary = "declared", "declares a derived attribute"
            needs_hits = True


def test_register_eviction_refuses_a_bad_entry():
    assert register_eviction(LRUEviction) is LRUEviction   # the same class again: a no-op

    class Impostor(LRUEviction):
        name, summary = "lru", "another class under a taken name"

    with pytest.raises(ValueError, match="already registered"):
        register_eviction(Impostor)
    with pytest.raises(TypeError):
        register_eviction(int)


def test_lfu_without_hits_orders_like_lru():
    lfu, lru = LFUEviction(), LRUEviction()
    for b in (4, 2, 7, 1, 9):
        lfu.add(b, now=0.0)
        lru.add(b, now=0.0)
    assert lfu.pop_n(5, now=1.0) == lru.pop_n(5, now=1.0)


def test_lfu_keeps_hit_blocks_and_forgets_counts_with_the_hash():
    pol = LFUEviction()
    for b in (1, 2, 3):
        pol.add(b, now=0.0)
    # A prefix hit takes block 1 back (remove, then the hit), and it is freed again.
    pol.remove(1)
    pol.on_hit(1, now=1.0)
    pol.add(1, now=1.0)
    pol.add(4, now=1.0)
    assert pol.pop_n(3, now=2.0) == [2, 3, 4]  # zero hits first, in free order
    assert pol.pop(now=2.0) == 1
    # Evicted: the block's next hash starts from zero hits.
    pol.add(1, now=3.0)
    pol.add(5, now=3.0)
    assert pol.pop(now=3.0) == 1
    # forget(): the hash was dropped without an eviction.
    pol.on_hit(6, now=4.0)
    pol.forget(6)
    pol.add(6, now=4.0)
    pol.add(7, now=4.0)
    assert pol.pop_n(3, now=4.0) == [5, 6, 7]  # with the count kept, 6 would go last


def test_lru_is_fifo_over_free_events():
    pol = LRUEviction()
    for b in (5, 3, 9, 1):
        pol.add(b, now=0.0)
    pol.remove(3)
    pol.add(3, now=1.0)  # freed again: goes to the tail
    assert pol.pop_n(4, now=2.0) == [5, 9, 1, 3]


def test_flop_with_alpha_zero_orders_like_lru():
    flop, lru = FlopEviction(alpha=0.0), LRUEviction()
    for i, t in enumerate([0, 0, 1, 1, 1, 4, 7]):
        flop.add(i, now=float(t), value=float(7 - i))
        lru.add(i, now=float(t))
    assert flop.pop_n(7, now=8.0) == lru.pop_n(7, now=8.0)


def test_flop_utility_hand_computed():
    # Two candidates, now = 4: recency 1/(4-0+1)=0.2 and 1/(4-3+1)=0.5 -> normalised 0 and 1.
    # Values 10 and 2 -> normalised 1 and 0. alpha=2: S(a) = 0 + 2*1 = 2, S(b) = 1 + 0 = 1.
    pol = FlopEviction(alpha=2.0)
    pol.add(1, now=0.0, value=10.0)
    pol.add(2, now=3.0, value=2.0)
    assert pol.utility(1, now=4.0) == pytest.approx(2.0)
    assert pol.utility(2, now=4.0) == pytest.approx(1.0)
    assert pol.pop(now=4.0) == 2  # the older block survives: it saves more FLOPs per byte


def _brute_force_victim(entries, alpha, now):
    """Rescan every candidate (what Marconi's simulator does), same tie-breaks."""
    ts = [t for t, _, _ in entries.values()]
    vs = [v for _, v, _ in entries.values()]
    rmin, rmax = 1 / (now - min(ts) + 1), 1 / (now - max(ts) + 1)
    vmin, vmax = min(vs), max(vs)

    def s(t, v):
        r = (1 / (now - t + 1) - rmin) / (rmax - rmin) if rmax > rmin else 0.0
        e = alpha * (v - vmin) / (vmax - vmin) if vmax > vmin and alpha else 0.0
        return r + e

    return min(entries, key=lambda b: (s(*entries[b][:2]), entries[b][2]))


@settings(max_examples=200, deadline=None)
@given(
    alpha=st.sampled_from([0.0, 0.1, 0.5, 1.0, 2.0, 7.5]),
    ops=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 5), st.booleans()), min_size=1,
                 max_size=60),
)
def test_flop_threshold_search_equals_full_rescan(alpha, ops):
    """The threshold algorithm must pick exactly the full rescan's victim."""
    pol = FlopEviction(alpha=alpha)
    shadow = {}
    seq = 0
    now = 0.0
    next_id = 0
    for t_step, value, do_pop in ops:
        now += t_step % 3
        if do_pop and shadow:
            expect = _brute_force_victim(shadow, alpha, now)
            got = pol.pop(now)
            assert got == expect
            del shadow[got]
        else:
            pol.add(next_id, now=now, value=float(value))
            shadow[next_id] = (now, float(value), seq)
            seq += 1
            next_id += 1


def test_belady_evicts_farthest_next_use_first():
    pol = BeladyEviction()
    pol.add(1, now=0, next_use=5)
    pol.add(2, now=0, next_use=math.inf)
    pol.add(3, now=0, next_use=9)
    pol.add(4, now=0, next_use=9)
    assert pol.pop_n(4, now=1) == [2, 3, 4, 1]


def test_unknown_eviction_name_lists_valid_ones():
    with pytest.raises(UnknownPolicyError, match="valid: " + ", ".join(EVICTION_POLICIES)):
        get_eviction("arc")


def test_flop_rejects_negative_alpha():
    with pytest.raises(ValueError, match="alpha"):
        FlopEviction(alpha=-1)


@settings(max_examples=100, deadline=None)
@given(
    alpha=st.sampled_from([0.0, 0.5, 2.0]),
    adds=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3)), min_size=1, max_size=40),
    k=st.integers(1, 40),
)
def test_flop_pop_n_equals_repeated_pop(alpha, adds, k):
    a, b = FlopEviction(alpha=alpha), FlopEviction(alpha=alpha)
    now = 0.0
    for i, (dt, v) in enumerate(adds):
        now += dt
        a.add(i, now=now, value=float(v))
        b.add(i, now=now, value=float(v))
    k = min(k, len(adds))
    assert a.pop_n(k, now + 1) == [b.pop(now + 1) for _ in range(k)]


def test_belady_refreshes_a_next_use_that_passed_without_a_touch():
    # Block 1 was predicted for t=3, but t=3 went by without touching it; its real
    # next use is never. Block 2 is next needed at t=9. At t=5, block 1 must go first.
    future = {1: math.inf, 2: 9.0}
    pol = BeladyEviction(refresh=lambda b, now: future[b])
    pol.add(1, now=0, next_use=3.0)
    pol.add(2, now=0, next_use=9.0)
    assert pol.pop(now=5.0) == 1


# ---------------------------------------------------------------- reuse
def _cached(pol, now, *pairs):
    """Cache blocks with hash keys, then free them at ``now`` (as a request does)."""
    for b, key in pairs:
        pol.on_cache(b, key)
    for b, _ in pairs:
        pol.add(b, now=now)


def test_reuse_without_history_orders_like_lru():
    reuse, lru = ReuseEviction(), LRUEviction()
    for b in (5, 3, 9, 1):
        reuse.add(b, now=0.0)
        lru.add(b, now=0.0)
    for pol in (reuse, lru):
        pol.remove(3)
        pol.add(3, now=1.0)
    assert reuse.ratio == 1.0
    assert reuse.pop_n(4, now=2.0) == lru.pop_n(4, now=2.0) == [5, 9, 1, 3]


def test_reuse_keeps_a_hit_block_r_times_longer():
    pol = ReuseEviction()
    _cached(pol, 0.0, (1, "a"), (2, "b"), (3, "c"))
    pol.remove(1)                      # a prefix hit takes block 1 back...
    pol.on_hit(1, now=1.0)
    pol.add(1, now=1.0)                # ...and frees it again
    _cached(pol, 2.0, (4, "d"), (5, "e"), (6, "f"), (7, "g"))
    # One of seven first uses was followed by another: a reused hash is likelier to
    # come back, so r > 1 (the exact value depends on the halving of old counts).
    assert 4 / 3 < pol.ratio < 100
    # LRU would evict 1 (freed at 1) before 4..7 (freed at 2); at now = 5 block 1 is
    # 4 old, less than r x the 3 to 5 of the oldest first-time block.
    assert pol.pop_n(6, now=5.0) == [2, 3, 4, 5, 6, 7]
    _cached(pol, 100.0, (8, "h"))
    # Now the oldest first-time block is 1 old and block 1 is 100 old: it goes.
    assert pol.pop(now=101.0) == 1
    assert pol.pop(now=101.0) == 8


def test_reuse_history_outlives_eviction_but_not_forget():
    def order(lose):
        pol = ReuseEviction()
        pol.on_cache(1, "a")
        lose(pol)
        # "a" is cached again (block 5), freed before three first-time blocks.
        _cached(pol, 1.0, (5, "a"), (2, "b"), (3, "c"), (4, "d"))
        return pol.pop_n(4, now=3.0)

    def evict(pol):
        pol.add(1, now=0.0)
        assert pol.pop(now=0.0) == 1   # the hash survives as a ghost

    # Recomputed after an eviction: a reuse, so block 5 outlives the first-time blocks.
    assert order(evict) == [2, 3, 4, 5]
    # Dropped without an eviction (forget): no history, plain LRU order.
    assert order(lambda pol: pol.forget(1)) == [5, 2, 3, 4]


def test_reuse_ghosts_are_bounded():
    pol = ReuseEviction(history=1.0)
    for b in range(1, 4):
        _cached(pol, float(b), (b, ("k", b)))
        assert pol.pop(now=float(b)) == b
    # The cache never held more than one block: one ghost is kept, the newest.
    assert pol.hist.ghosts == [("k", 3)]  # the bound is the point
    assert set(pol.hist.refs) == {("k", 3)}   # older ghosts' use counts are gone too


class _OrderedGhosts:
    """Reference model of ReuseHistory's ghosts: an ordered set, moved on every
    eviction, trimmed from the oldest (what the lazy queue must reproduce)."""

    def __init__(self, history):
        self.history, self.cap = history, 1
        self.keys, self.live, self.used, self.ghost = {}, {}, {}, OrderedDict()

    def cached(self, b, key):
        self.keys[b] = key
        self.cap = max(self.cap, len(self.keys))
        self.live[key] = self.live.get(key, 0) + 1
        if self.live[key] == 1:
            self.ghost.pop(key, None)
            self.used[key] = 2 if key in self.used else 1

    def hit(self, b):
        if b in self.keys:
            self.used[self.keys[b]] = 2

    def lose(self, b, evicted):
        key = self.keys.pop(b, None)
        if key is None:
            return
        self.live[key] -= 1
        if self.live[key]:
            return
        del self.live[key]
        if not evicted:
            del self.used[key]
            return
        self.ghost[key] = None
        while len(self.ghost) > self.history * self.cap:
            del self.used[self.ghost.popitem(last=False)[0]]


@settings(max_examples=60, deadline=None)
@given(history=st.sampled_from([0.0, 0.5, 1.0, 2.0]), seed=st.integers(0, 10_000))
def test_reuse_history_ghosts_match_an_ordered_set(history, seed):
    """Caching, hits, evictions and drops in any order (a random walk over 3
    blocks and 3 keys, so that keys come back while still queued): the lazily
    cleaned ghost queue keeps the same ghosts, in the same order, and the same
    use counts as an ordered set."""
    rng = random.Random(seed)
    hist, ref = ReuseHistory(history), _OrderedGhosts(history)
    for _ in range(300):
        op, b, key = rng.choice(["cache", "hit", "evict", "drop"]), rng.randrange(3), rng.randrange(3)
        if op == "cache" and b not in ref.keys:
            hist.cached(b, key)
            ref.cached(b, key)
        elif op == "hit":
            hist.hit(b)
            ref.hit(b)
        elif op == "evict":
            hist.evicted([b])
            ref.lose(b, evicted=True)
        elif op == "drop":
            hist.dropped(b)
            ref.lose(b, evicted=False)
        assert hist.ghosts == list(ref.ghost)
        assert hist.num_ghosts == len(ref.ghost)
        assert hist.cached_keys() == ref.keys
        assert {key: hist.uses(key) for key in hist.refs if hist.uses(key)} == ref.used


@pytest.mark.parametrize("name", ["lru", "reuse"])
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_lru_and_reuse_queues_match_a_list_model(name, seed):
    """Random frees, hits and evictions over a few block ids: ``lru`` pops in
    free order and ``reuse`` by its rule (the oldest *again* block when it is
    more than ``r`` times older than the oldest first-time one, the earlier freed
    on a tie), as a plain list of ``(block, free time, order, again)`` says."""
    rng = random.Random(seed)
    pol = get_eviction(name)
    keyed = pol.needs_keys
    model: list[tuple[int, float, int, bool]] = []   # candidates in free order
    cached: set[int] = set()                         # blocks holding a key
    order = 0
    now = 0.0
    for _ in range(200):
        op, b = rng.choice(["free", "free", "hit", "evict"]), rng.randrange(12)
        now += rng.choice([0.0, 0.0, 1.0])
        free = [c[0] for c in model]
        if op == "free" and b not in free:
            if keyed and b not in cached:
                pol.on_cache(b, ("k", rng.randrange(6)))
                cached.add(b)
            model.append((b, now, order, keyed and pol.hist.again(b)))
            pol.add(b, now)
            order += 1
        elif op == "hit" and b in free:
            pol.remove(b)
            if keyed:
                pol.on_hit(b, now)
            model = [c for c in model if c[0] != b]
        elif op == "evict" and model:
            n = rng.randint(1, len(model))
            if keyed:
                pol.hist.age()   # what pop_n does first; ageing twice in a row is a no-op
            r = pol.ratio if keyed else 1.0
            expected = []
            for _ in range(n):
                firsts = [c for c in model if not c[3]]
                agains = [c for c in model if c[3]]
                pick = (firsts or agains)[0]
                if firsts and agains:
                    f, a = firsts[0], agains[0]
                    limit, age = r * (now - f[1]), now - a[1]
                    pick = a if age > limit or (age == limit and a[2] < f[2]) else f
                expected.append(pick[0])
                model.remove(pick)
            assert pol.pop_n(n, now) == expected
            cached -= set(expected)
        assert len(pol) == len(model)
        assert all(c[0] in pol for c in model)


def test_lru_refuses_a_block_queued_twice_and_a_negative_id():
    pol = LRUEviction()
    pol.add_many([3, 1], 0.0, [0.0, 0.0], [math.inf] * 2)
    with pytest.raises(KeyError):
        pol.add_many([7, 1, 9], 1.0, [0.0] * 3, [math.inf] * 3)
    assert pol.pop_n(3, now=2.0) == [3, 1, 7]   # what came before the duplicate stays queued
    with pytest.raises(ValueError, match=">= 0"):
        pol.add(-1, now=3.0)
    assert len(pol) == 0


def test_reuse_rejects_bad_history():
    with pytest.raises(ValueError, match="history"):
        ReuseEviction(history=-1.0)


def test_cache_reports_hash_keys_to_policies_that_need_them():
    from vllm_admission.core.admission import get_admission
    from vllm_admission.core.cache import HybridPrefixCache
    from vllm_admission.core.layout import CacheLayout, PoolSpec, SchedulingSpec

    class Spy(ReuseEviction):
        def __init__(self):
            super().__init__()
            self.seen = []

        def on_cache(self, block_id, key):
            self.seen.append(key)
            super().on_cache(block_id, key)

    spy = Spy()
    cache = HybridPrefixCache(CacheLayout(PoolSpec(num_blocks=100, block_size=16,
                                                   group_kinds=("state", "attention")),
                                          SchedulingSpec(chunk_size=64)),
                              admission=get_admission("vllm"), eviction=spy)
    hashes = [11, 12, 13, 14]
    cache.serve(hashes, prompt_len=65, output_len=1, rid=0, now=0.0)
    assert [k for k in spy.seen if k[0] == 1] == [(1, h) for h in hashes]
    assert (0, 14) in spy.seen  # the prompt-end state, keyed by its group
    out = cache.serve(hashes, prompt_len=65, output_len=1, rid=1, now=1.0)
    assert out.hit_tokens == 64


@pytest.mark.parametrize("again_first", [True, False])
def test_reuse_breaks_an_age_tie_in_free_order(again_first):
    """Both heads freed at the current time (a burst shares one clock tick): the ratio
    cannot tell them apart, so the block freed first goes, as in LRU."""
    reuse = ReuseEviction()
    reuse.on_cache(1, (1, "a"))
    reuse.on_cache(2, (1, "b"))
    reuse.on_hit(2, now=0.0)          # "b" used again: block 2 joins the again queue
    for b in ((2, 1) if again_first else (1, 2)):
        reuse.add(b, now=3.0)
    assert reuse.pop(now=3.0) == (2 if again_first else 1)
