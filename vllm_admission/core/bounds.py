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

__all__ = ["PoolBound", "pool_bound"]


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
    if block_size <= 0 or num_blocks < 2 or state_groups < 1 or per_token_groups < 0:
        raise ValueError(f"pool_bound needs block_size > 0, num_blocks >= 2, state_groups >= 1 "
                         f"and per_token_groups >= 0; got {block_size}, {num_blocks}, "
                         f"{state_groups}, {per_token_groups}")
    B, G_t, G_s, M = block_size, per_token_groups, state_groups, num_blocks - 1  # noqa: N806
    last: dict[int, int] = {}
    # Per request that runs: (slot, own blocks W_r(0), the slots a_j of its possible hits).
    runs: list[tuple[int, int, list[int]]] = []
    infinite = prompt = n = 0
    for r, (hashes, prompt_len, output_len) in enumerate(requests):
        n += 1
        prompt += prompt_len
        if fits is not None and not fits(prompt_len, output_len):
            continue
        cap = min((prompt_len - 1) // B, len(hashes))
        since: list[int] = []
        for j in range(cap):
            a = last.get(hashes[j])
            if a is None:
                break
            since.append(a)
        runs.append((r, G_t * ((prompt_len + output_len - 1) // B) + G_s, since))
        infinite += len(since) * B
        for h in hashes[:(prompt_len + output_len - 1) // B]:
            last[h] = r

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
