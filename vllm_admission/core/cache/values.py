"""What a freed cached block tells the eviction policy: its FLOP value and next use.

``flop`` eviction orders candidates by the FLOP efficiency of the segment a
block belongs to (Marconi's valuation, :func:`vllm_admission.core.block_values.block_value`,
over the request's :meth:`~vllm_admission.core.admission.RequestAdmission.segment_table`);
``belady`` by the time the block's hash is needed next. The cache model sets
these on the pool (``BlockPool.value``, ``BlockPool.next_use``) just before it
frees the blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

from vllm_admission.core.block_values import SegmentCosts, block_value

if TYPE_CHECKING:  # pragma: no cover
    from vllm_admission.core.cache.block_pool import BlockPool
    from vllm_admission.core.cache.running import RunningRequest

__all__ = ["FreedBlockMeta"]


class FreedBlockMeta:
    """Attaches eviction metadata to blocks about to be freed.

    Args:
        pool: the pool whose ``value`` / ``next_use`` lists are written.
        first_state_group: the group whose index says which states are cached
            (the segments end there).
        block_size: tokens per block.
        costs: the segment cost model; ``None``: no FLOP values.
        next_use: ``f(block_hash, rid) -> time`` of the next request needing the
            hash; ``None``: no next use.
    """

    def __init__(self, pool: BlockPool, first_state_group: int, block_size: int,
                 costs: SegmentCosts | None,
                 next_use: Callable[[Hashable, int], float] | None) -> None:
        self.pool = pool
        self.state_index = pool.index[first_state_group]
        self.block_size = block_size
        self.costs = costs
        self.next_use = next_use

    def attach(self, run: RunningRequest, indexes: Sequence[int], blocks: Sequence[int],
               is_state: bool) -> None:
        """Set the value and/or next use of the cached ``blocks`` (at block
        ``indexes`` of ``run``; ``is_state``: they belong to a state group)."""
        keys = self.pool.key
        if self.costs is not None:
            state_index, hashes = self.state_index, run.hashes

            def is_cached_state(i: int) -> bool:
                return hashes[i] in state_index

            ckpts, values = run.adm.segment_table(self.costs, is_cached_state)
            out, B = self.pool.value, self.block_size
            assert out is not None  # the pool keeps values for a values policy
            for i, b in zip(indexes, blocks, strict=True):
                if keys[b] is not None:
                    out[b] = block_value(values, ckpts, (i + 1) * B, is_state)
        next_use = self.next_use
        if next_use is not None:
            out_next = self.pool.next_use
            assert out_next is not None  # the pool keeps next uses for a policy that needs them
            for b in blocks:
                block_hash = keys[b]
                if block_hash is not None:
                    out_next[b] = next_use(block_hash, run.rid)
