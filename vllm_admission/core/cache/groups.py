"""One part per KV cache group kind (``vllm/v1/core/single_type_kv_cache_manager.py``).

vLLM keeps one manager per KV cache group, its class chosen by the group's spec
(``FullAttentionManager``, ``MambaManager``). Here every group of one kind
behaves alike (the same hashes, the same block indexes), so one part serves all
groups of its kind: :class:`AttentionGroups` and :class:`StateGroups`, chosen by
:data:`GROUP_PARTS` from the kind string. Each part owns what differs by kind:

* what a prefix hit is (:meth:`~KVGroups.longest_hit`) and which blocks a hit
  references (:meth:`~KVGroups.touch_hit`);
* which blocks are retired before the request ends (state only:
  ``MambaManager.remove_skipped_blocks``) and which get a hash
  (:meth:`~KVGroups.cache_full`: every full attention block; a state block only
  where the admission policy admits its position);
* the order of its blocks when the request ends (:meth:`~KVGroups.release`) and
  the FLOP value each carries to the eviction policy.

Allocation is the model's (:meth:`HybridPrefixCache._allocate
<vllm_admission.core.cache.model.HybridPrefixCache._allocate>`): one pool call
hands every group its new blocks, attention groups first.

:class:`~vllm_admission.core.cache.running.RunningRequest` (re-exported here) is the
per-request bookkeeping the parts share.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Sequence

from vllm_admission.core.admission import ADMIT
from vllm_admission.core.cache.block_pool import NULL, BlockPool
from vllm_admission.core.cache.running import RunningRequest
from vllm_admission.core.cache.values import FreedBlockMeta
from vllm_admission.core.layout import ATTENTION, HIDDEN, STATE

__all__ = ["GROUP_PARTS", "AttentionGroups", "KVGroups", "RunningRequest", "StateGroups"]


class KVGroups:
    """The KV cache groups of one kind, sharing ``pool``.

    Args:
        groups: the groups' indexes in vLLM's order (at least one).
        pool: the shared block pool.
        block_size: tokens per block.
        meta: attaches FLOP values / next use to freed blocks (``None``: the
            eviction policy reads neither).
    """

    #: The group kind (:data:`~vllm_admission.core.layout.ATTENTION` or ``STATE``).
    kind: str = ""

    def __init__(self, groups: Sequence[int], pool: BlockPool, block_size: int,
                 meta: FreedBlockMeta | None) -> None:
        self.groups = tuple(groups)
        self.num_groups = len(self.groups)
        self.pool = pool
        self.block_size = block_size
        self.meta = meta
        self.indexes = [pool.index[g] for g in self.groups]

    def longest_hit(self, hashes: Sequence[Hashable], max_blocks: int) -> int:
        """Blocks of the longest prefix of ``hashes[:max_blocks]`` these groups can serve."""
        raise NotImplementedError

    def touch_hit(self, run: RunningRequest, g: int, hit_blocks: int, now: float,
                  last_key: Hashable | None = None) -> None:
        """Reference group ``g``'s blocks of a ``hit_blocks``-block prefix hit
        (``add_local_computed_blocks``) and set its block table. ``last_key``:
        the key the last block was found under when the hit ends inside it (a
        sub-block key); ``None``: its block hash."""
        raise NotImplementedError

    def cache_full(self, run: RunningRequest, nc: int, full: int) -> int:
        """Cache the blocks ``nc <= i < full`` that get a hash; return the state
        checkpoints admitted (0 for attention)."""
        raise NotImplementedError

    def release(self, run: RunningRequest, g: int) -> list[int]:
        """Group ``g``'s blocks in the order they are freed when the request ends."""
        raise NotImplementedError

    def freed(self, run: RunningRequest, g: int, indexes: Sequence[int]) -> list[int]:
        """Group ``g``'s blocks at ``indexes``, in that order, with their eviction
        metadata attached: the list to free."""
        table = run.blocks[g]
        freed = [table[i] for i in indexes]
        if self.meta is not None:
            self.meta.attach(run, indexes, freed, self.kind == STATE)
        return freed


class AttentionGroups(KVGroups):
    """Full-attention groups, and hidden-state groups with them (``FullAttentionManager``):
    a block per ``block_size`` tokens, all kept until the request ends; every full
    block is cached."""

    kind = ATTENTION

    def longest_hit(self, hashes: Sequence[Hashable], max_blocks: int) -> int:
        """The longest run of leading blocks cached in every attention group."""
        k = 0
        if self.num_groups == 1:
            d = self.indexes[0]
            while k < max_blocks and hashes[k] in d:
                k += 1
        else:
            indexes = self.indexes
            while k < max_blocks and all(hashes[k] in d for d in indexes):
                k += 1
        return k

    def touch_hit(self, run: RunningRequest, g: int, hit_blocks: int, now: float,
                  last_key: Hashable | None = None) -> None:
        d, h = self.pool.index[g], run.hashes
        if last_key is None:
            blocks = [d[h[i]] for i in range(hit_blocks)]
        else:
            blocks = [d[h[i]] for i in range(hit_blocks - 1)]
            blocks.append(d[last_key])
        self.pool.touch(blocks, now)
        run.blocks[g] = blocks

    def cache_full(self, run: RunningRequest, nc: int, full: int) -> int:
        """Prompt blocks get their hash; blocks holding generated tokens get
        keys of their own (``("out", rid, i)``): output is new content."""
        hashes, pool = run.hashes, self.pool
        nh = len(hashes)
        # Blocks past the hashes are output blocks (conditionals, not min/max: hot path).
        prompt_end = full if full < nh else nh
        out_start = nc if nc > nh else nh
        for g in self.groups:
            blocks = run.blocks[g]
            if nc < prompt_end:
                pool.cache_many(g, blocks[nc:prompt_end], hashes[nc:prompt_end])
            for i in range(out_start, full):
                pool.cache(blocks[i], (g, ("out", run.rid, i)))
        return 0

    def release(self, run: RunningRequest, g: int) -> list[int]:
        """Every block, the latest first (``SingleTypeKVCacheManager.free``)."""
        if self.meta is None:
            return run.blocks[g][::-1]
        return self.freed(run, g, range(len(run.blocks[g]) - 1, -1, -1))


class StateGroups(KVGroups):
    """Recurrent-state groups (``MambaManager``, align mode): a request holds the
    block with its latest state (plus those not yet retired); a hit needs a
    cached state at the prefix's end."""

    kind = STATE

    def longest_hit(self, hashes: Sequence[Hashable], max_blocks: int) -> int:
        """The longest prefix within ``max_blocks`` whose state is cached in every
        state group."""
        indexes = self.indexes
        for i in range(max_blocks - 1, -1, -1):
            h = hashes[i]
            if all(h in d for d in indexes):
                return i + 1
        return 0

    def touch_hit(self, run: RunningRequest, g: int, hit_blocks: int, now: float,
                  last_key: Hashable | None = None) -> None:
        b = self.pool.index[g][run.hashes[hit_blocks - 1] if last_key is None else last_key]
        self.pool.touch((b,), now)
        run.blocks[g] = [NULL] * (hit_blocks - 1) + [b]

    def retire(self, run: RunningRequest, skipped: int, now: float) -> None:
        """``MambaManager.remove_skipped_blocks``: the groups keep only the block
        that holds the state of the last computed token; their blocks before
        index ``skipped`` are freed, the latest first. Call only when there is
        one (``run.live[0] < skipped``)."""
        live, tables = run.live, run.blocks
        k = bisect.bisect_left(live, skipped)
        retired = live[k - 1::-1]
        del live[:k]
        if self.meta is not None:
            lists = [self.freed(run, g, retired) for g in self.groups]
        elif k == 1:  # the usual case, without a comprehension per group (hot path)
            i = retired[0]
            lists = [[tables[g][i]] for g in self.groups]
        else:
            lists = [[tables[g][i] for i in retired] for g in self.groups]
        self.pool.free_each(lists, now)
        for g in self.groups:
            table = tables[g]
            for i in retired:
                table[i] = NULL

    def cache_full(self, run: RunningRequest, nc: int, full: int) -> int:
        """Cache each held block ``nc <= i < full`` (in ``inpass`` mode only those
        written with the state at their end) whose position ``(i + 1) * B`` the
        admission policy admits, in every state group, under the prompt hash
        there (an output key past the prompt); return the number cached.

        A policy that ``needs_keys`` is not told the key of a state kept only as
        the sequence end (:meth:`RequestAdmission.kept_as_sequence_end`): the
        engine caches such a state tentatively, before it knows the request ends
        there, and reports only keys the simulator reports at the same moment.
        """
        adm, B, pool = run.adm, self.block_size, self.pool
        hashes, tables, written = run.hashes, run.blocks, run.written
        admitted = 0
        for i in run.live:
            if not nc <= i < full:
                continue
            if written is not None and i not in written:
                continue  # inpass: this block holds a mid-block state, not (i + 1) * B
            pos = (i + 1) * B
            # The length is known here, so a decision is never tentative.
            if adm.decide(pos) != ADMIT:
                if run.host is not None and adm.cached_live(pos):
                    # The engine caches it for a while (a tentative sequence end), long
                    # enough to hand it to the host tier.
                    run.cached_states.append(i)
                continue
            adm.record(pos)
            admitted += 1
            h = hashes[i] if i < len(hashes) else ("out", run.rid, i)
            report = not (pool.reports_keys and adm.kept_as_sequence_end(pos))
            pool.cache_position([(g, tables[g][i]) for g in self.groups], h, report=report)
            if run.host is not None:
                run.cached_states.append(i)
        return admitted

    def release(self, run: RunningRequest, g: int) -> list[int]:
        """The held blocks, the latest first."""
        return self.freed(run, g, run.live[::-1])


#: Registry: KV cache group kind -> the part that serves the groups of that kind. Hidden-state
#: groups are served with the attention groups (one part: a hit needs every one of them).
GROUP_PARTS: dict[str, type[KVGroups]] = {ATTENTION: AttentionGroups, HIDDEN: AttentionGroups,
                                          STATE: StateGroups}
