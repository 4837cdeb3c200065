"""An upper bound on any admission and eviction policy's hits in a pool of fixed size.

The infinite-capacity bound (:func:`~vllm_admission.core.traces.trace.capacity_bound`) says
how much of a trace's prompts an earlier request computed. :func:`pool_bound` adds the pool:
no policy, offline ones included, can hit more than it says with ``num_blocks`` blocks.

**Model.** The simulator's: requests are served one at a time, in order; vLLM's one block
pool of ``num_blocks`` blocks (one is the null block) serves ``per_token_groups`` KV cache
groups that need a block per ``block_size`` tokens (attention, hidden states) and
``state_groups`` groups that need one block per recurrent state. A hit of ``k`` blocks for
request ``r`` needs, when ``r`` arrives, the KV of its first ``k`` blocks in every per-token
group and the state after those ``k`` blocks in every state group.

**Derivation.** Call the KV of prefix ``j`` (the chained block hash ``h_j``) and the state
after it *objects*. An object can only enter the pool while a request that contains the
prefix is served, so if ``r`` hits it, it stayed in the pool through every request from the
last earlier one containing ``h_j`` (index ``a_j``) to ``r``: the service slots ``a_j + 1 ..
r``. That stretch ends at ``r``, so no other hit needs that object in those slots. While
request ``t`` is served it also holds at least ``W_t(k) = per_token_groups * ((P_t + O_t -
1) // B - k) + state_groups`` blocks of its own (its KV blocks that were not hits, and a
running state). So in every slot ``t`` the objects whose stretch covers ``t`` and
``W_t(k_t)`` fit in ``M = num_blocks - 1`` blocks, for any policy's hits ``k_r`` (each at
most the infinite-capacity hit of ``r``; a request that cannot fit the pool at all runs
nowhere and counts nothing). Weighting slot ``t``'s limit by a multiplier ``lam_t >= 0``
and adding up gives, by weak duality, for every such vector::

    hits <= sum_t lam_t * M + sum_r max_k (B * k - cost_r(k; lam))

where ``cost_r(k; lam)`` is ``lam`` summed over the slots the ``k`` KV objects (times
``per_token_groups``) and the state (times ``state_groups``) must stay, plus ``lam_r *
W_r(k)``. With one multiplier for all slots this is the Lagrangian dual of a
multiple-choice knapsack (convex in ``lam``: ternary search); from that point a projected
subgradient descent over the slots' multipliers tightens it, and the lowest value seen is
the bound.

What it leaves out, each of which only makes it looser (never wrong): that a state exists
only where some request wrote one (a chunk end or a decode boundary); the chunk stops and
the state blocks a checkpoint needs; speculative decoding's dropped block. It is derived
for the simulator's sequential service (one request at a time, in order).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from vllm_admission.core.counters import TokenHitRate

__all__ = ["LPBound", "PoolBound", "lp_bound", "pool_bound"]


@dataclass(frozen=True)
class PoolBound(TokenHitRate):
    """:func:`pool_bound`'s answer (tokens).

    Attributes:
        hit_tokens: the bound on the hit tokens of any policy (a float: the dual's value).
        infinite_hit_tokens: the infinite-capacity bound of the requests that fit the pool
            (:func:`~vllm_admission.core.traces.trace.capacity_bound` of them).
        prompt_tokens: the prompt tokens of the requests.
        multiplier: the best single multiplier for every slot (where the subgradient
            descent starts), in hit tokens per block-slot (0: the pool does not bind, the
            bound is the infinite one).
    """

    hit_tokens: float
    infinite_hit_tokens: int
    prompt_tokens: int
    multiplier: float


def _check(block_size: int, num_blocks: int, per_token_groups: int, state_groups: int) -> None:
    if block_size <= 0 or num_blocks < 2 or state_groups < 1 or per_token_groups < 0:
        raise ValueError(f"the pool bounds need block_size > 0, num_blocks >= 2, state_groups >= 1 "
                         f"and per_token_groups >= 0; got {block_size}, {num_blocks}, "
                         f"{state_groups}, {per_token_groups}")


def _runs(requests: Iterable[tuple[Sequence[int], int, int]], block_size: int,
          per_token_groups: int, state_groups: int, fits: Callable[[int, int], bool] | None,
          usable: int) -> tuple[list[tuple[int, int, list[int]]], int, int, int]:
    """Per request that runs: ``(slot r, own blocks W_r(0), the slots a_j of its possible
    hits)``; and the infinite-capacity hit tokens, the prompt tokens and the requests. A
    request runs when ``fits`` says so and its blocks (hits included) fit in ``usable``."""
    B = block_size  # noqa: N806
    last: dict[int, int] = {}
    runs: list[tuple[int, int, list[int]]] = []
    infinite = prompt = n = 0
    for r, (hashes, prompt_len, output_len) in enumerate(requests):
        n += 1
        prompt += prompt_len
        own = per_token_groups * ((prompt_len + output_len - 1) // B) + state_groups
        if own > usable or (fits is not None and not fits(prompt_len, output_len)):
            continue
        cap = min((prompt_len - 1) // B, len(hashes))
        since: list[int] = []
        for j in range(cap):
            a = last.get(hashes[j])
            if a is None:
                break
            since.append(a)
        runs.append((r, own, since))
        infinite += len(since) * B
        for h in hashes[:(prompt_len + output_len - 1) // B]:
            last[h] = r
    return runs, infinite, prompt, n


def pool_bound(requests: Iterable[tuple[Sequence[int], int, int]], *, block_size: int,
               num_blocks: int, per_token_groups: int, state_groups: int,
               fits: Callable[[int, int], bool] | None = None,
               iterations: int = 200) -> PoolBound:
    """The upper bound of the module docstring on any policy's hit tokens.

    Args:
        requests: ``(block_hashes, prompt_len, output_len)`` in arrival order, as
            :func:`~vllm_admission.core.traces.trace.capacity_bound` takes them (the full
            blocks of the prompt and, where the trace knows the output, of the output).
        block_size: tokens per block.
        num_blocks: blocks in the pool, the null block included.
        per_token_groups: KV cache groups with a block per ``block_size`` tokens
            (attention, hidden states).
        state_groups: KV cache groups with a block per recurrent state (at least 1).
        fits: ``fits(prompt_len, output_len)``, whether a request can run at all in the
            pool (the simulator skips one that cannot: it holds nothing and hits
            nothing); ``None``: every request runs.
        iterations: steps of the search over one multiplier for all slots (ternary), and
            then of the subgradient descent over the slots' own (each step costs one pass
            over the requests' possible hits).

    Returns:
        A :class:`PoolBound`. Its ``hit_tokens`` never exceed ``infinite_hit_tokens``.

    Raises:
        ValueError: a pool of fewer than two blocks, a non-positive block size, no state
            group or a negative group count.
    """
    _check(block_size, num_blocks, per_token_groups, state_groups)
    B, G_t, G_s, M = block_size, per_token_groups, state_groups, num_blocks - 1  # noqa: N806
    runs, infinite, prompt, n = _runs(requests, block_size, per_token_groups, state_groups, fits,
                                       num_blocks - 1)

    def dual(lam: Sequence[float]) -> tuple[float, list[tuple[int, int, int, list[int]]]]:
        """The bound at slot multipliers ``lam``, and each run's best hit (blocks)."""
        acc = [0.0] * (n + 1)               # acc[t] = lam[0] + ... + lam[t - 1]
        for t in range(n):
            acc[t + 1] = acc[t] + lam[t]
        total = M * acc[n]
        chosen = []
        for r, own, since in runs:
            to_r, lam_r = acc[r + 1], lam[r]
            best, best_k, kv = -lam_r * own, 0, 0.0
            for k, a in enumerate(since, start=1):
                stay = to_r - acc[a + 1]     # lam over the slots a + 1 .. r
                kv += G_t * stay
                v = B * k - kv - G_s * stay - lam_r * (own - G_t * k)
                if v > best:
                    best, best_k = v, k
            total += best
            chosen.append((r, own, best_k, since))
        return total, chosen

    # One multiplier for every slot: past B * (longest hit) no hit pays for its cost.
    lo, hi = 0.0, float(B * max((len(s) for _, _, s in runs), default=1))
    for _ in range(iterations):
        m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        if dual([m1] * n)[0] <= dual([m2] * n)[0]:
            hi = m2
        else:
            lo = m1
    flat = (lo + hi) / 2
    lam = [flat] * n
    bound, chosen = dual(lam)
    scale = flat * math.sqrt(n)
    for step in range(iterations if flat > 0 else 0):
        # Subgradient of the dual at lam: slot t's limit minus what the chosen hits use.
        own_use = [0.0] * n
        diff = [0.0] * (n + 1)              # stays over slots, as a difference array
        for r, own, k, since in chosen:
            own_use[r] += own - G_t * k
            for a in since[:k]:
                diff[a + 1] += G_t
                diff[r + 1] -= G_t
            if k:
                diff[since[k - 1] + 1] += G_s
                diff[r + 1] -= G_s
        grad, running = [], 0.0
        for t in range(n):
            running += diff[t]
            grad.append(M - running - own_use[t])
        norm = math.sqrt(sum(g * g for g in grad))
        if norm == 0:
            break
        size = 0.3 * scale / math.sqrt(step + 1) / norm
        lam = [max(0.0, x - size * g) for x, g in zip(lam, grad, strict=True)]
        value, chosen = dual(lam)
        bound = min(bound, value)
    zero = float(infinite)                  # the dual at lam = 0
    return PoolBound(hit_tokens=min(bound, zero), infinite_hit_tokens=infinite,
                     prompt_tokens=prompt, multiplier=flat if bound < zero else 0.0)


@dataclass(frozen=True)
class LPBound(TokenHitRate):
    """:func:`lp_bound`'s answer (tokens).

    Attributes:
        hit_tokens: the LP optimum, an upper bound on the hit tokens of any policy.
        infinite_hit_tokens: the infinite-capacity bound of the requests that fit the pool.
        prompt_tokens: the prompt tokens of the requests.
        window: the slots whose limits were added up into one row.
        variables, nonzeros: the LP's size.
    """

    hit_tokens: float
    infinite_hit_tokens: int
    prompt_tokens: int
    window: int
    variables: int
    nonzeros: int


def lp_bound(requests: Iterable[tuple[Sequence[int], int, int]], *, block_size: int,
             num_blocks: int, per_token_groups: int, state_groups: int,
             fits: Callable[[int, int], bool] | None = None, window: int = 1) -> LPBound:
    """The optimum of the linear programme behind :func:`pool_bound`, solved exactly with
    HiGHS (SciPy's ``linprog``): the best bound the pool bound's model can give.

    **Programme.** For each request ``r`` that runs and each ``k`` up to its
    infinite-capacity hit, ``h[r,k]`` in ``[0, 1]`` (``r`` hits at least ``k`` blocks) and
    ``e[r,k] >= h[r,k] - h[r,k+1]`` (its hit ends at block ``k``), with ``h[r,k] <=
    h[r,k-1]``. Maximise ``block_size * sum h``. In every service slot ``t`` the KV of
    block ``k`` of each hit (``per_token_groups`` blocks from slot ``a_k + 1`` to ``r``,
    as in :func:`pool_bound`'s derivation), the state at each hit's end (``state_groups``
    blocks over the same stretch of its last block) and the running request's own
    blocks ``W_t`` fit in ``num_blocks - 1``. Any policy's hits, written as 0/1 values,
    satisfy it (the integer programme), so its LP optimum bounds every policy, offline
    ones included; by LP duality it is at most :func:`pool_bound` with ``window=1``.

    ``window > 1`` adds up the limits of each ``window`` consecutive slots into one row
    (a sum of valid rows is valid): fewer rows and nonzeros, a bound at least as high.

    Args:
        requests: as for :func:`pool_bound`.
        block_size: tokens per block.
        num_blocks: blocks in the pool, the null block included.
        per_token_groups: KV cache groups with a block per ``block_size`` tokens.
        state_groups: KV cache groups with a block per recurrent state (at least 1).
        fits: whether a request can run at all in the pool (as for :func:`pool_bound`).
        window: slots per capacity row (>= 1).

    Returns:
        An :class:`LPBound` (``hit_tokens`` at most ``infinite_hit_tokens``).

    Raises:
        ValueError: as :func:`pool_bound`, or a window below 1.
        RuntimeError: HiGHS did not find the optimum (its message says why).
    """
    import numpy as np
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    _check(block_size, num_blocks, per_token_groups, state_groups)
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an integer >= 1, got {window!r}")
    runs, infinite, prompt, n = _runs(requests, block_size, per_token_groups, state_groups, fits,
                                       num_blocks - 1)
    B, G_t, G_s, M = block_size, per_token_groups, state_groups, num_blocks - 1  # noqa: N806
    # One h and one e per (run, k): h at 0 .. V-1, e at V .. 2V-1, in run order.
    r_of = np.array([r for r, _, since in runs for _ in since], dtype=np.int64)
    a_of = np.array([a for _, _, since in runs for a in since], dtype=np.int64)
    k_of = np.array([k for _, _, since in runs for k in range(1, len(since) + 1)], dtype=np.int64)
    V = len(r_of)  # noqa: N806
    if V == 0:
        return LPBound(hit_tokens=0.0, infinite_hit_tokens=infinite, prompt_tokens=prompt,
                       window=window, variables=0, nonzeros=0)
    num_windows = (n + window - 1) // window
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []

    def stretch(var: np.ndarray, lo: np.ndarray, hi: np.ndarray, coef: float) -> None:
        """``coef`` x the slots of ``[lo, hi]`` in each window, for variables ``var``."""
        wl, wh = lo // window, hi // window
        count = wh - wl + 1
        rep = np.repeat(np.arange(len(var)), count)
        w = wl[rep] + (np.arange(len(rep)) - np.repeat(np.cumsum(count) - count, count))
        overlap = np.minimum(hi[rep], (w + 1) * window - 1) - np.maximum(lo[rep], w * window) + 1
        rows.append(w)
        cols.append(var[rep])
        vals.append(coef * overlap.astype(np.float64))

    ids = np.arange(V, dtype=np.int64)
    stretch(ids, a_of + 1, r_of, float(G_t))            # the KV of each hit's blocks
    stretch(ids + V, a_of + 1, r_of, float(G_s))        # the state at each hit's end
    rows.append(r_of // window)                         # a hit block is not the run's own
    cols.append(ids)
    vals.append(np.full(V, -float(G_t)))
    limit = np.zeros(num_windows)
    np.add.at(limit, np.arange(n) // window, float(M))
    own = np.array([o for _, o, _ in runs], dtype=np.float64)
    np.subtract.at(limit, np.array([r for r, _, _ in runs], dtype=np.int64) // window, own)
    # h[r,k] - h[r,k-1] <= 0 and h[r,k] - h[r,k+1] - e[r,k] <= 0.
    row = num_windows
    inner = np.flatnonzero(k_of > 1)
    mono = row + np.arange(len(inner))
    rows += [mono, mono]
    cols += [ids[inner], ids[inner] - 1]
    vals += [np.ones(len(inner)), -np.ones(len(inner))]
    row += len(inner)
    end = row + ids
    nxt = np.flatnonzero(np.append(k_of[1:] > 1, False))   # h[r,k+1] exists
    rows += [end, end, end[nxt]]
    cols += [ids, ids + V, ids[nxt] + 1]
    vals += [np.ones(V), -np.ones(V), -np.ones(len(nxt))]
    row += V
    a_ub = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                      shape=(row, 2 * V)).tocsr()
    b_ub = np.concatenate((limit, np.zeros(row - num_windows)))
    c = np.concatenate((np.full(V, -float(B)), np.zeros(V)))
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, bounds=(0.0, 1.0), method="highs")
    if res.status != 0:
        raise RuntimeError(f"HiGHS found no optimum: {res.message}")
    return LPBound(hit_tokens=min(-float(res.fun), float(infinite)), infinite_hit_tokens=infinite,
                   prompt_tokens=prompt, window=window, variables=2 * V, nonzeros=int(a_ub.nnz))
