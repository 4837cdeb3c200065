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
last earlier one containing ``h_j`` (index ``a_j``) to ``r``: ``r - a_j`` service slots,
``a_j + 1 .. r``. The interval ends at ``r``, so no other hit needs that stretch of that
object: the costs of different hits never share an object-slot. While request ``t`` is
served it also holds at least ``W_t(k) = per_token_groups * ((P_t + O_t - 1) // B - k) +
state_groups`` blocks of its own (its KV blocks that were not hits, and a running state).
Summing the pool limit ``M = num_blocks - 1`` over the ``N`` slots gives one constraint
that every policy's hits ``k_r`` satisfy::

    sum_r c_r(k_r) <= M * N,   c_r(k) = G_t * sum_{j<=k} (r - a_j) + G_s * (r - a_k) + W_r(k)

(``c_r(0) = W_r(0)``), with ``k_r`` at most the infinite-capacity hit of ``r``. The most
hit tokens ``sum_r B * k_r`` under that one constraint is a multiple-choice knapsack; its
Lagrangian dual ``min_{lam >= 0} lam * M * N + sum_r max_k (B * k - lam * c_r(k))`` is an
upper bound on it (weak duality), hence on every policy, and a convex function of ``lam``
that :func:`pool_bound` minimises.

What it leaves out, each of which only makes it looser (never wrong): that the limit holds
at every slot rather than on average; that a state exists only where some request wrote one
(a chunk end or a decode boundary); the chunk stops and the state blocks a checkpoint
needs; speculative decoding's dropped block. It holds for the simulator's sequential
service; concurrent requests hold more blocks at once, so it holds for them too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

__all__ = ["PoolBound", "pool_bound"]


@dataclass(frozen=True)
class PoolBound:
    """:func:`pool_bound`'s answer (tokens).

    Attributes:
        hit_tokens: the bound on the hit tokens of any policy (a float: the dual's value).
        infinite_hit_tokens: the infinite-capacity bound of the same requests.
        prompt_tokens: the prompt tokens of the requests.
        multiplier: the Lagrange multiplier ``lam`` at which the bound was reached, in hit
            tokens per block-slot (0: the pool does not bind, the bound is the infinite one).
    """

    hit_tokens: float
    infinite_hit_tokens: int
    prompt_tokens: int
    multiplier: float

    @property
    def token_hit_rate(self) -> float:
        """``hit_tokens / prompt_tokens`` (0 without prompt tokens)."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def pool_bound(requests: Iterable[tuple[Sequence[int], int, int]], *, block_size: int,
               num_blocks: int, per_token_groups: int, state_groups: int,
               fits: Callable[[int, int], bool] | None = None,
               iterations: int = 100) -> PoolBound:
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
        iterations: steps of the ternary search over the multiplier (the dual is convex;
            each step shrinks the interval to two thirds).

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
    B, G_t, G_s = block_size, per_token_groups, state_groups  # noqa: N806 - the docstring's names
    last: dict[int, int] = {}
    # Per request with a possible hit: the cost c_r(k) - c_r(0) of a hit of k blocks, k >= 1.
    extra: list[list[float]] = []
    base_cost = 0.0          # sum_r c_r(0): every request's own blocks
    infinite = prompt = n = 0
    for r, (hashes, prompt_len, output_len) in enumerate(requests):
        n += 1
        prompt += prompt_len
        if fits is not None and not fits(prompt_len, output_len):
            continue
        cap = min((prompt_len - 1) // B, len(hashes))
        own = G_t * ((prompt_len + output_len - 1) // B) + G_s
        base_cost += own
        costs: list[float] = []
        kv = 0
        for j in range(cap):
            a = last.get(hashes[j])
            if a is None:
                break
            kv += G_t * (r - a)
            # KV of blocks 1..j+1, the state after them, minus the own blocks a hit spares.
            costs.append(kv + G_s * (r - a) - G_t * (j + 1))
        if costs:
            extra.append(costs)
            infinite += len(costs) * B
        for h in hashes[:(prompt_len + output_len - 1) // B]:
            last[h] = r
    budget = (num_blocks - 1) * n - base_cost

    def dual(lam: float) -> float:
        total = lam * budget
        for costs in extra:
            best = 0.0
            for k, c in enumerate(costs, start=1):
                v = B * k - lam * c
                if v > best:
                    best = v
            total += best
        return total

    # Past lam_hi no hit pays for its cost (every extra cost is >= G_s >= 1 block-slot).
    lo, hi = 0.0, float(B * max((len(c) for c in extra), default=1))
    for _ in range(iterations):
        m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        if dual(m1) <= dual(m2):
            hi = m2
        else:
            lo = m1
    lam = (lo + hi) / 2
    value = min(dual(lam), dual(0.0))
    return PoolBound(hit_tokens=min(value, float(infinite)), infinite_hit_tokens=infinite,
                     prompt_tokens=prompt, multiplier=lam if value < dual(0.0) else 0.0)
