"""``conversation``: ``reuse`` in which the blocks of a prompt that continues an
earlier prompt count as reused from the start (the hash-id chain tells)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from vllm_admission.core.eviction.reuse import ReuseEviction

__all__ = ["ConversationEviction"]


class ConversationEviction(ReuseEviction):
    """Reuse-aware LRU that also protects conversations that go on.

    The order is ``reuse``'s (:class:`~vllm_admission.core.eviction.reuse.ReuseEviction`:
    two LRU queues, the *again* queue's blocks may grow ``r`` times older, ``r``
    learned online). What joins the *again* queue differs: besides a block whose
    hash was used by a second request, a block whose hash belongs to a prompt
    that *continues* an earlier prompt, a conversation's next turn or an agent's
    next step, joins it from its first use. Such a prompt is recognised when it
    arrives (:meth:`on_request`) from its chained block hashes alone: the
    deepest of them heard before is where an earlier prompt ended
    (:meth:`ReuseHistory.prompt <vllm_admission.core.eviction.history.ReuseHistory.prompt>`).

    Why: a conversation that has gone on is likely to go on again, and its next
    turn reads the whole prompt; on the Mooncake conversation trace a prompt's
    last full block is used again within 1,000 requests 35 % of the time on a
    first turn and 32-68 % on later ones (rising with the turn), against 17 %
    for the average block used once, and most of the trace's reuse comes after
    more traffic than a 64 GiB cache holds (``docs/results.md`` sections 3.2 and
    3.5). With stock admission on Qwen3-Next this online test gets 60 % (64 GiB)
    and 32 % (128 GiB) of what an oracle that knows which prompts a later
    request continues gains over ``reuse`` (section 3.5).

    The engine tells the policy the same thing at the same moment: the plugin
    calls :meth:`on_request` at a request's first prefix lookup with the keys of
    its prompt's full blocks (``plugin/translate.py``), the simulator at the
    start of the request; both before any of the request's blocks is freed.

    Args:
        history: ghost hashes, and prompt hashes remembered, as a multiple of
            the most blocks ever cached.
        shared: a history to use (and keep up to date) instead of a new one.
    """

    name = "conversation"
    summary = "reuse, and blocks of a prompt that continues an earlier prompt count as reused"

    def on_request(self, hashes: Sequence[int], now: float) -> None:
        self.hist.prompt(hashes)

    def _protected(self) -> Callable[[int], bool]:
        return self.hist.continuing
