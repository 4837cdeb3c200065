"""``learned``: lru until its first model, a model fixed by the past at every request,
labels from useful accesses only, and the same model whether fitted inline or in the
background."""

import random

import numpy as np
import pytest

from vllm_admission.core.admission import get_admission
from vllm_admission.core.cache import HybridPrefixCache
from vllm_admission.core.errors import UserError
from vllm_admission.core.eviction import LRUEviction, learning
from vllm_admission.core.eviction.learned import LearnedEviction
from vllm_admission.core.eviction.learning import (
    FEATURES,
    AccessHistory,
    LightGBMTrainer,
    ModelSchedule,
)
from vllm_admission.core.layout import CacheLayout, PoolSpec, SchedulingSpec

BLOCK = 16
#: Small enough that the first model comes after about 100 requests.
SMALL = {"retrain_every": 40, "lag": 4, "min_samples": 60, "window": 2_000}


def conversations(n, seed):
    """``n`` requests: chats on a few shared system prompts, whose turns extend the
    previous turn's prompt, interleaved with one-off prompts (chained hashes)."""
    rng = random.Random(seed)
    systems = [[("sys", s, i) for i in range(rng.randint(2, 4))] for s in range(3)]
    chats = []
    out = []
    for r in range(n):
        if chats and rng.random() < 0.6:
            c = rng.randrange(len(chats))
            hashes = chats[c] + [("turn", r, i) for i in range(rng.randint(1, 3))]
            chats[c] = hashes
        elif rng.random() < 0.5:
            hashes = list(rng.choice(systems)) + [("new", r, i) for i in range(rng.randint(1, 4))]
            chats.append(hashes)
            if len(chats) > 12:
                chats.pop(0)
        else:
            hashes = [("once", r, i) for i in range(rng.randint(2, 6))]
        out.append(list(hashes))
    return out


def replay(eviction, requests, num_blocks=90):
    """Serve ``requests`` through a small hybrid cache; each request's hit tokens."""
    cache = HybridPrefixCache(
        CacheLayout(PoolSpec(num_blocks=num_blocks, block_size=BLOCK,
                             group_kinds=("attention", "state")),
                    SchedulingSpec(chunk_size=64)),
        admission=get_admission("vllm"), eviction=eviction)
    hits = []
    for r, hashes in enumerate(requests):
        prompt_len = BLOCK * len(hashes) + 3
        if not cache.fits(prompt_len, 2):
            hits.append(None)
            continue
        hits.append(cache.serve(hashes, prompt_len, 2, r, float(r)).hit_tokens)
    return hits


class Recording(LightGBMTrainer):
    """Fits inline and keeps every fit's inputs."""

    def __init__(self):
        super().__init__(background=False)
        self.fits = []

    def fit(self, x, y):
        self.fits.append((x.copy(), y.copy()))
        return super().fit(x, y)


def test_learned_is_lru_until_its_first_model():
    requests = conversations(400, seed=1)
    never = LearnedEviction(min_samples=10**9)
    assert replay(never, requests) == replay(LRUEviction(), requests)
    assert never.schedule.trainings == 0


def test_learned_trains_on_schedule_and_ranks_blocks():
    trainer = Recording()
    pol = LearnedEviction(trainer=trainer, **SMALL)
    hits = replay(pol, conversations(600, seed=2))
    assert pol.schedule.trainings == len(trainer.fits) >= 3
    assert pol.schedule.current is not None
    # Every fit had both labels, and the model puts freed blocks on several levels.
    assert all(0 < y.mean() < 1 for _, y in trainer.fits)
    assert sum(1 for q in pol._queues if q.size) >= 2
    assert hits != replay(LRUEviction(), conversations(600, seed=2))


def test_background_and_inline_fits_serve_the_same_model():
    requests = conversations(500, seed=3)
    inline = LearnedEviction(trainer=LightGBMTrainer(background=False), **SMALL)
    background = LearnedEviction(trainer=LightGBMTrainer(background=True), **SMALL)
    assert replay(inline, requests) == replay(background, requests)
    assert inline.schedule.trainings == background.schedule.trainings > 0
    assert inline.pop_n(len(inline), 501.0) == background.pop_n(len(background), 501.0)


def test_training_never_sees_the_future():
    """Two streams equal up to request K: the fits of a run on the first K requests
    alone are the first fits of both, inputs and labels alike."""
    k = 300
    a = conversations(500, seed=4)
    b = a[:k] + conversations(200, seed=99)
    runs = []
    for requests in (a[:k], a, b):
        trainer = Recording()
        replay(LearnedEviction(trainer=trainer, **SMALL), requests)
        runs.append(trainer.fits)
    prefix, fits_a, fits_b = runs
    assert len(prefix) >= 3 and len(fits_a) > len(prefix) and len(fits_b) > len(prefix)
    for (x, y), (xa, ya), (xb, yb) in zip(prefix, fits_a, fits_b, strict=False):
        np.testing.assert_array_equal(xa, x)
        np.testing.assert_array_equal(xb, x)
        np.testing.assert_array_equal(ya, y)
        np.testing.assert_array_equal(yb, y)
    # After K the streams part, and so do the fits.
    assert any(xa.shape != xb.shape or not np.array_equal(xa, xb, equal_nan=True)
               for (xa, _), (xb, _) in zip(fits_a[len(prefix):], fits_b[len(prefix):], strict=False))


def test_a_sample_is_labelled_by_the_next_useful_access_only():
    hist = AccessHistory()
    sched = ModelSchedule(retrain_every=10**6, lag=1, window=100, min_samples=1,
                          boundary=1.0, trainer=LightGBMTrainer(background=False))
    hist.request(["a", "b"], 0.0)
    hist.cached(5, (0, "b"))          # block 5 holds "b"; nothing holds "a"
    hist.freed([5], 1.0)
    sched.record(hist.features([5], 1.0), [5], hist, 1.0)
    # Request 3 holds "b" but not its parent "a" cached: its hit could not reach "b".
    hist.request(["a", "b"], 3.0)
    sched.tick(3.0, hist, 0)
    assert np.isnan(sched.gap[0])
    # Request 6 finds "a" cached: now "b" is a useful access, 5 requests after the free.
    hist.cached(7, (0, "a"))
    hist.request(["a", "b"], 6.0)
    sched.tick(6.0, hist, 0)
    assert sched.gap[0] == 5.0


def test_features_describe_the_hash_and_the_block():
    hist = AccessHistory()
    hist.request(["r", "x"], 0.0)
    hist.request(["r", "x", "y"], 4.0)
    hist.request(["r", "z"], 10.0)
    hist.cached(3, (1, "x"))
    hist.cached(4, (0, "x"))
    hist.freed([3], 5.0)
    row = dict(zip(FEATURES, hist.features([3], 12.0)[0], strict=True))
    assert row["age"] == 8.0 and row["gap1"] == 4.0 and np.isnan(row["gap2"])
    assert row["count"] == 2 and row["depth"] == 1 and row["children"] == 1
    assert row["ends"] == 1 and row["live"] == 2 and row["group"] == 1
    assert row["free_age"] == 7.0 and row["first_age"] == 12.0
    assert row["parent_live"] == 0 and row["cached_children"] == 0
    hist.cached(9, (0, "r"))
    assert dict(zip(FEATURES, hist.features([3], 12.0)[0], strict=True))["parent_live"] == 1
    assert dict(zip(FEATURES, hist.features([9], 12.0)[0], strict=True))["cached_children"] == 1


@pytest.mark.parametrize("kwargs", [{"record": 0}, {"retrain_every": 0},
                                    {"lag": 0}, {"window": -3}, {"boundary": 0.0},
                                    {"boundary": float("inf")}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(UserError, match="learned"):
        LearnedEviction(**kwargs)


def test_missing_lightgbm_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(learning, "lightgbm_available", lambda: False)
    with pytest.raises(UserError, match="needs LightGBM"):
        LearnedEviction()


def test_clone_waits_for_a_fit_and_continues_alike():
    requests = conversations(500, seed=5)
    pol = LearnedEviction(**SMALL)
    replay(pol, requests[:250])
    copy = pol.clone()
    assert copy.schedule.trainings == pol.schedule.trainings
    assert len(copy) == len(pol)
    assert copy.pop_n(len(copy), 251.0) == pol.pop_n(len(pol), 251.0)


class ByGroup:
    """A stand-in model: the probability is a function of the block's group."""

    def __init__(self, probs):
        self.probs = probs

    def __call__(self, rows):
        return np.array([self.probs[int(g)] for g in rows[:, FEATURES.index("group")]])


def test_the_victim_has_the_largest_age_over_probability():
    pol = LearnedEviction()
    pol.schedule.current = ByGroup({0: 0.1, 1: 0.9})
    pol.on_request(["a"], 0.0)
    pol.on_request(["b"], 0.0)
    pol.on_cache(1, (0, "a"))
    pol.on_cache(2, (1, "b"))
    pol.add_many([2], 0.0, (), ())
    pol.add_many([1], 0.0, (), ())
    assert pol._prob[1] == pol._prob[2] == 1.0   # unscored until the next request
    pol.on_request([], 1.0)
    assert pol.pop(1.0) == 1                  # same age: the less likely goes first
    pol.on_request(["c"], 100.0)
    pol.on_cache(3, (0, "c"))
    pol.add_many([3], 100.0, (), ())
    pol.on_request([], 101.0)
    assert pol.pop(101.0) == 2                # 102 / 0.9 > 1 / 0.1: old enough to go


def test_a_shallow_block_is_worth_its_deepest_freed_companion():
    pol = LearnedEviction()
    pol.schedule.current = ByGroup({0: 0.05, 1: 0.8})
    pol.on_request(["r", "s", "t"], 0.0)
    for b, key in ((1, (0, "r")), (2, (0, "s")), (3, (1, "t"))):
        pol.on_cache(b, key)
    pol.on_request(["u"], 0.0)
    pol.on_cache(4, (0, "u"))
    pol.add_many([3, 2, 1], 0.0, (), ())     # one request's blocks, tail first
    pol.add_many([4], 0.0, (), ())
    pol.on_request([], 1.0)
    assert pol._prob[1] == pol._prob[2] == pytest.approx(0.8)
    assert pol.pop_n(4, 1.0) == [4, 3, 2, 1]  # the lone unlikely block, then tail first


def test_a_block_freed_again_before_scoring_is_scored_once():
    """With requests in flight a hit can take a freed block back and free it again before
    the next request: it is scored once, with its latest batch, in free order."""
    pol = LearnedEviction()
    pol.add_many([1, 2], 0.0, (), ())
    pol.remove(1)
    pol.add_many([3, 1], 0.0, (), ())
    pol.on_request([], 1.0)
    assert len(pol) == 3 and not pol._queues[-1].size
    assert pol.pop_n(3, 1.0) == [2, 3, 1]
