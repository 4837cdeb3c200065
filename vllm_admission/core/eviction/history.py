"""History by block hash: :class:`ReuseHistory`, what ``reuse`` learns and ``auto``
shares among the policies it switches between (kept up to date around any other
policy by :class:`~vllm_admission.core.eviction.keeper.HistoryKeeper`)."""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from typing import cast

from vllm_admission.core.errors import UserError
from vllm_admission.core.eviction.fifo import room

__all__ = ["PROMPT_END_BLOCKS", "ReuseHistory"]

#: A prompt block's key, ``(group, block hash)`` (:meth:`ReuseHistory.continuing`).
_Pair = tuple[Hashable, Hashable]

#: How many of a prompt's last full blocks count as its end. Two, not one: a
#: trace that hashes in blocks of its own size (Mooncake: 512 tokens, and the
#: last one partial) cannot say whether the tokens after its last full block
#: recur in the next turn, so a model block that reaches past them (vLLM's
#: blocks are 544 tokens for Qwen3-Next, 2,096 for Nemotron-3-Nano) hashes
#: differently in the next turn; the block before it does not reach past them
#: when the model's block is at least the trace's.
PROMPT_END_BLOCKS = 2


class ReuseHistory:
    """What ``reuse`` (:class:`~vllm_admission.core.eviction.reuse.ReuseEviction`)
    learns, by block hash: which hashes were used again, and how much likelier
    a reused hash is to come back.

    Fed the cache's events: :meth:`cached` (a block got its hash key),
    :meth:`hit` (a prefix hit referenced it), :meth:`evicted` (victims gave up
    their hashes; the keys stay as ghosts) and :meth:`dropped` (a hash lost
    without an eviction). A key is *again* once a second request used it (a
    hit, or a request cached it once more after every copy was evicted).

    Statistics: ``reused[k] / total[k]``, the fraction of references of kind
    ``k`` (0: a first use, 1: a use of a key already used) that were followed
    by another reference of the same key; both halve every time as many
    references were counted as the cache ever held blocks (:meth:`age`), so
    they follow the workload.

    Ghosts (keys with no cached copy left, the ``history`` x ``cap`` most
    recently evicted) are kept in eviction order in a queue that is cleaned
    lazily: a key cached again stays in the queue until the queue's head
    reaches it. Each key's entry in ``refs`` packs its use count (the low two
    bits: 0 no use, 1 one request, 2 more) with how many times it is queued
    (the rest), so that only its newest queue entry counts. This holds the
    same ghosts in the same order as an ordered set at a tenth of the memory.

    Args:
        history: ghost keys kept, as a multiple of the most blocks ever cached.

    Raises:
        UserError: ``history`` is negative or not finite.
    """

    __slots__ = ("history", "key_of", "num_keys", "live", "refs", "queue", "num_ghosts", "cap",
                 "reused", "total", "counted", "prompts")

    def __init__(self, history: float = 4.0) -> None:
        if not (history >= 0 and math.isfinite(history)):
            raise UserError(f"history must be a finite number >= 0, got {history!r}")
        self.history = history
        self.key_of: list[Hashable | None] = []   # block id -> its hash key (None: none)
        self.num_keys = 0                         # blocks with a key
        self.live: dict[object, int] = {}         # key -> cached blocks holding it
        self.refs: dict[object, int] = {}         # key -> uses (1 or 2 = "again") + 4 x times queued
        self.queue: deque[object] = deque()       # ghost evictions, oldest first (some stale)
        self.num_ghosts = 0                       # keys with no cached copy, still counted
        self.cap = 1                              # most blocks ever cached at once
        self.reused = [1.0, 1.0]                  # references followed by another, by kind
        self.total = [1.0, 1.0]                   # references, by kind
        self.counted = 0                          # references since the last halving
        # Prompt block hashes heard by prompt(), least recently heard first:
        # bit 1, a prompt ended at this block; bit 2, a continuing prompt held it.
        self.prompts: OrderedDict[object, int] = OrderedDict()

    def copy(self) -> ReuseHistory:
        other = ReuseHistory(self.history)
        other.key_of, other.num_keys = self.key_of[:], self.num_keys
        other.live, other.refs = dict(self.live), dict(self.refs)
        other.queue, other.num_ghosts = self.queue.copy(), self.num_ghosts
        other.cap, other.counted = self.cap, self.counted
        other.reused, other.total = self.reused[:], self.total[:]
        other.prompts = self.prompts.copy()
        return other

    @property
    def ghosts(self) -> list[object]:
        """The ghost keys, oldest eviction first (for inspection; O(queue))."""
        newest = {key: i for i, key in enumerate(self.queue)}
        live, refs = self.live, self.refs
        return [key for i, key in enumerate(self.queue)
                if newest[key] == i and key not in live and refs[key] & 3]

    def cached_keys(self) -> dict[int, Hashable]:
        """Every block that has a key, with its key (for inspection; O(blocks))."""
        return {b: key for b, key in enumerate(self.key_of) if key is not None}

    def uses(self, key: object) -> int:
        """How many requests used ``key``, counted up to 2 (0: unknown or forgotten)."""
        return self.refs.get(key, 0) & 3

    def reference(self, key: object) -> None:
        """A request used ``key`` (cached it or hit it)."""
        refs = self.refs
        v = refs.get(key, 0)
        r = v & 3
        if r:
            self.reused[r - 1] += 1.0
            self.total[1] += 1.0
            refs[key] = v - r + 2
        else:
            self.total[0] += 1.0
            refs[key] = v + 1
        self.counted += 1

    def cached(self, block_id: int, key: Hashable) -> None:
        """``block_id`` was given hash ``key``; a first cached copy is a use."""
        key_of = self.key_of
        if not 0 <= block_id < len(key_of):
            key_of.extend([None] * room(len(key_of), block_id))
        if key_of[block_id] is None:
            self.num_keys += 1
            if self.num_keys > self.cap:
                self.cap = self.num_keys
        key_of[block_id] = key
        live_counts = self.live
        live = live_counts.get(key, 0)
        live_counts[key] = live + 1
        if live:
            return   # a duplicate of a cached block is not a new use
        if self.refs.get(key, 0) & 3:
            self.num_ghosts -= 1   # a ghost comes back; its queue entry goes stale
        self.reference(key)

    def hit(self, block_id: int) -> None:
        """A prefix hit referenced ``block_id``."""
        key_of = self.key_of
        key = key_of[block_id] if 0 <= block_id < len(key_of) else None
        if key is not None:
            self.reference(key)

    def again(self, block_id: int) -> bool:
        """Whether ``block_id``'s hash was used by more than one request."""
        key_of = self.key_of
        key = key_of[block_id] if 0 <= block_id < len(key_of) else None
        return key is not None and self.refs.get(key, 1) & 3 > 1

    def dropped(self, block_id: int) -> None:
        """``block_id`` lost its hash without an eviction: no ghost is kept."""
        key_of = self.key_of
        key = key_of[block_id] if 0 <= block_id < len(key_of) else None
        if key is None:
            return
        key_of[block_id] = None
        self.num_keys -= 1
        live = self.live[key] - 1
        if live:
            self.live[key] = live
            return
        del self.live[key]
        queued = self.refs[key] & ~3
        if queued:
            self.refs[key] = queued   # unused, until its stale queue entries are passed
        else:
            del self.refs[key]

    def evicted(self, victims: Sequence[int]) -> None:
        """``victims`` gave up their hashes; a key with no cached copy left is
        remembered as a ghost (the ``history`` x ``cap`` newest are kept)."""
        key_of, live_counts, refs, queue = self.key_of, self.live, self.refs, self.queue
        limit = self.history * self.cap
        n = len(key_of)
        ghosts = self.num_ghosts
        lost = 0
        for b in victims:
            key = key_of[b] if 0 <= b < n else None
            if key is None:
                continue
            key_of[b] = None
            lost += 1
            live = live_counts[key] - 1
            if live:
                live_counts[key] = live
                continue
            del live_counts[key]
            queue.append(key)
            refs[key] += 4
            ghosts += 1
            while ghosts > limit:
                old = queue.popleft()
                v = refs[old] - 4
                if v > 3 or old in live_counts:
                    refs[old] = v          # queued again later, or cached again: stale
                elif v:
                    del refs[old]          # the oldest ghost is forgotten
                    ghosts -= 1
                else:
                    del refs[old]          # dropped since: no ghost to forget
        self.num_ghosts = ghosts
        self.num_keys -= lost

    # -- conversations, from the hash-id chain ------------------------------
    def prompt(self, hashes: Sequence[object]) -> bool:
        """A request arrived whose prompt's full blocks have chained hashes
        ``hashes`` (in order; the attention group's block hashes). Returns
        whether it *continues* an earlier prompt.

        Because hashes are chained, the prompt contains an earlier prompt whole
        exactly when one of its hashes is the last full block of that prompt.
        The test looks at the deepest hash heard before: the prompt continues
        when a prompt ended there (a conversation's next turn, or a resend),
        not when the deepest known hash lies inside an earlier prompt (a new
        conversation that shares a system prompt or a document with others,
        or a turn that edits the previous one). The hashes of a continuing
        prompt are marked (:meth:`continuing`), and the last
        :data:`PROMPT_END_BLOCKS` of every prompt are marked as its end. What is heard is
        kept for the ``history`` x ``cap`` hashes heard most recently (the ghosts' bound).

        On the Mooncake conversation trace the last full block of a prompt that
        continues an earlier one is used again within 1,000 requests 32-68 % of
        the time (rising with the number of turns), against 17 % for a block
        used once (``docs/results.md`` section 3.5).
        """
        if not hashes:
            return False
        memo = self.prompts
        get = memo.get
        cont = False
        for h in reversed(hashes):
            flags = get(h)
            if flags is not None:
                cont = bool(flags & 1)
                break
        mark = 2 if cont else 0
        move = memo.move_to_end
        for h in hashes:
            flags = get(h)
            if flags is None:
                memo[h] = mark
            else:
                memo[h] = flags | mark
                move(h)
        for h in hashes[-PROMPT_END_BLOCKS:]:
            memo[h] |= 1
        limit = max(1, self.history * self.cap)
        while len(memo) > limit:
            memo.popitem(last=False)
        return cont

    def continuing(self, block_id: int) -> bool:
        """Whether ``block_id``'s hash was used again (:meth:`again`) or belongs to
        a prompt that continued an earlier one (:meth:`prompt`). Keys are
        ``(group, block hash)`` pairs: every KV cache group's block at a
        position shares the mark."""
        if self.again(block_id):
            return True
        key_of = self.key_of
        key = key_of[block_id] if 0 <= block_id < len(key_of) else None
        # The keys of blocks a prompt is heard for are (group, block hash) pairs
        # (EvictionPolicy.on_cache): their second item is the hash.
        return key is not None and self.prompts.get(cast(_Pair, key)[1], 0) & 2 != 0

    def age(self) -> None:
        """Halve the statistics once per ``cap`` references counted. Called when
        a victim is chosen, not per reference, so that the order in which one
        step's blocks are cached (group by group) does not matter."""
        while self.counted >= self.cap:
            self.counted -= self.cap
            for i in (0, 1):
                self.reused[i] *= 0.5
                self.total[i] *= 0.5

    @property
    def ratio(self) -> float:
        """``r = max(1, p_again / p_first)``: how much likelier a reused hash is
        to be used again than a first-time one."""
        p_first = self.reused[0] / self.total[0]
        p_again = self.reused[1] / self.total[1]
        return max(1.0, p_again / p_first)
