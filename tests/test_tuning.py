"""The alpha tuner: when it tunes, what it compares, what it keeps."""

import pytest

from vllm_admission.core.tuning import AlphaTuner, paper_grid


def test_paper_grid():
    g = paper_grid()
    assert g[0] == 0.0 and g[-1] == 2.0 and len(g) == 21


def test_bootstrap_window_is_multiplier_times_requests_before_first_eviction():
    calls = []

    def replay(alpha, window, snapshot):
        calls.append((alpha, len(window), snapshot))
        return {0.3: 10.0}.get(alpha, 1.0)

    t = AlphaTuner(replay=replay, multiplier=5, grid=(0.0, 0.3, 1.0))
    # first eviction seen after request 4 -> window of 20 requests
    results = [t.observe(i, evicted_so_far=i >= 3, saved=0.1) for i in range(20)]
    assert t.window_len == 20
    assert results[:19] == [None] * 19 and results[19] == 0.3
    # the live alpha (0) is scored from the live run, the others are replayed from empty
    assert sorted(calls) == [(0.3, 20, None), (1.0, 20, None)]
    assert t.events[0].scores == pytest.approx({0.0: 2.0, 0.3: 10.0, 1.0: 1.0})


def test_bootstrap_window_is_capped():
    t = AlphaTuner(replay=lambda a, w, s: 0.0, multiplier=5, grid=(0.0,), max_window=30)
    for i in range(100):
        t.observe(i, evicted_so_far=i >= 19, saved=0.0)
    assert t.window_len == 30


def test_retune_compares_neighbours_and_zero_from_a_snapshot():
    snaps = []
    replays = []

    def snapshot():
        snaps.append(len(snaps))
        return f"snap{len(snaps) - 1}"

    def replay(alpha, window, snap):
        replays.append((alpha, tuple(window), snap))
        return 100.0 if alpha == 0.0 and snap is not None else 0.0

    t = AlphaTuner(replay=replay, snapshot=snapshot, multiplier=1, grid=(0.0, 0.5),
                   retune_every=10)
    # bootstrap: first eviction at request 1 -> window 1; 0.5 wins the bootstrap
    replay_scores = {0.5: 3.0}
    t.replay = lambda a, w, s: replay_scores.get(a, 0.0) if s is None else replay(a, w, s)
    assert t.observe("r0", evicted_so_far=True, saved=1.0) == 0.5
    out = [t.observe(f"r{i}", evicted_so_far=True, saved=0.0) for i in range(1, 11)]
    # window = min(1, 10 - 1) = 1 request; snapshot taken before it
    assert snaps == [0]
    assert out[-1] == 0.0  # alpha 0 replayed from the snapshot saved the most
    kinds = {a for a, _, s in replays}
    assert kinds == {0.0, 0.4, 0.6}
    assert all(s == "snap0" for _, _, s in replays)


def test_rejects_bad_parameters():
    with pytest.raises(ValueError):
        AlphaTuner(replay=lambda *a: 0.0, multiplier=0)
    with pytest.raises(ValueError):
        AlphaTuner(replay=lambda *a: 0.0, grid=())
