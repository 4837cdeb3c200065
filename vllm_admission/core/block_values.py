"""Marconi's valuation of cached blocks: the FLOPs a hit on a block's segment saves, per
byte the segment holds (Marconi, Pan et al., MLSys 2025, section 4.2, at block granularity).

A *segment* is the tokens between two consecutive cached state positions of one prefix;
every block of a segment has the segment's value. :meth:`RequestAdmission.segment_table
<vllm_admission.core.admission.RequestAdmission.segment_table>` keeps one request's table;
:class:`~vllm_admission.core.cache.values.FreedBlockMeta` (the cache model) and the plugin's
block pool hand the values to ``flop`` eviction. Imports nothing of the package.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["SegmentCosts", "block_value", "segment_values"]


@dataclass(frozen=True)
class SegmentCosts:
    """What the FLOP value of a block depends on besides the request (Marconi 4.2).

    Attributes:
        block_size: tokens per block.
        num_attention_groups, num_state_groups: KV cache groups of each kind
            (per-token groups count as attention: hidden states hold a block per
            ``block_size`` tokens too).
        bytes_per_block: bytes one block id holds (the largest group's page x layers).
        segment_flops: ``f(end, start) -> FLOPs`` of computing tokens
            ``[start, end)`` with ``start`` cached (``ModelCosts.prefill_flops``).
    """

    block_size: int
    num_attention_groups: int
    num_state_groups: int
    bytes_per_block: int
    segment_flops: Callable[[int, int], float]


def segment_values(checkpoints: Sequence[int], costs: SegmentCosts) -> dict[int, float]:
    """FLOP efficiency of each segment of a prefix (Marconi 4.2, at block granularity).

    Marconi scores a radix-tree node by the FLOPs a hit on it saves relative
    to its parent, per byte the node holds. Here a node is a *segment*: the
    tokens between two consecutive cached state positions ``q < p`` of one
    prefix. A hit at ``p`` instead of ``q`` saves ``segment_flops(p, q)``
    FLOPs; the segment holds its attention blocks in every attention group
    plus one state block per state group.

    Args:
        checkpoints: ascending cached-state positions (tokens) along the prefix.
        costs: the geometry and FLOP model.

    Returns:
        ``{p: FLOPs per byte}`` for every checkpoint ``p``.
    """
    values = {}
    prev = 0
    per_block = costs.num_attention_groups * costs.bytes_per_block
    state_bytes = costs.num_state_groups * costs.bytes_per_block
    for p in checkpoints:
        values[p] = (costs.segment_flops(p, prev)
                     / ((p - prev) // costs.block_size * per_block + state_bytes))
        prev = p
    return values


def block_value(values: dict[int, float], checkpoints: Sequence[int], end: int,
                is_state: bool) -> float:
    """Value of the block ending at token ``end``: its segment's FLOP efficiency.

    A state block's segment ends at ``end``; an attention block belongs to the
    first segment ending at or after ``end``. Attention blocks past the last
    checkpoint, and states that are not checkpoints, are worth 0: no hybrid
    hit can use them.

    Args:
        values: :func:`segment_values` of ``checkpoints``.
        checkpoints: ascending cached-state positions (tokens).
        end: the block's end (tokens, a multiple of the block size).
        is_state: a state group's block (else an attention group's).

    Returns:
        FLOPs per byte (0.0: worthless).
    """
    if is_state:
        return values.get(end, 0.0)
    k = bisect.bisect_left(checkpoints, end)
    return values[checkpoints[k]] if k < len(checkpoints) else 0.0
