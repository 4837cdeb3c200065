"""``conversation``'s own rules (the registry-wide eviction and engine-against-core tests run
it too): which prompts continue an earlier one, judged from chained block hashes alone, and
where their blocks wait in ``reuse``'s two queues."""

from __future__ import annotations

import random

import pytest

from vllm_admission.core.eviction import ConversationEviction, ReuseEviction, ReuseHistory
from vllm_admission.core.eviction.history import PROMPT_END_BLOCKS


def test_a_next_turn_continues_a_new_conversation_does_not():
    h = ReuseHistory()
    system, turn1 = [1, 2], [3, 4, 5]
    assert h.prompt(system + turn1) is False            # nothing heard before
    assert h.prompt(system + turn1 + [6, 7]) is True    # contains the first prompt whole
    assert h.prompt(system + [8, 9, 10]) is False       # shares only the system prompt
    assert h.prompt(system + [8, 9, 10]) is True        # a resend ends where a prompt ended
    assert h.prompt([]) is False


def test_the_end_is_the_last_two_full_blocks():
    # A model block that reaches into a trace's partial last block hashes differently in the
    # next turn, so the block before it counts as the end too (PROMPT_END_BLOCKS).
    assert PROMPT_END_BLOCKS == 2
    h = ReuseHistory()
    h.prompt([1, 2, 3, 4])
    assert h.prompt([1, 2, 3, 50]) is True     # deepest known: 3, the next-to-last block
    assert h.prompt([1, 2, 60]) is False       # deepest known: 2, inside the prompt


def test_continuing_marks_every_block_of_a_continuing_prompt_and_every_group():
    h = ReuseHistory()
    h.prompt([1, 2])
    h.prompt([1, 2, 3, 4])
    for b, key in enumerate([(0, 1), (0, 3), (1, 4), (0, 2)]):
        h.cached(b, key)
    h.cached(4, (0, 9))                       # never in a continuing prompt
    h.cached(5, (0, ("out", 7, 3)))           # an output block: a key of its own
    assert [h.continuing(b) for b in range(6)] == [True, True, True, True, False, False]
    assert h.continuing(99) is False          # no key


def test_continuing_includes_hashes_used_again():
    h = ReuseHistory()
    h.cached(0, (0, 11))
    h.hit(0)
    assert h.again(0) and h.continuing(0)


def test_prompt_memory_is_bounded_and_forgets_the_least_recently_heard():
    h = ReuseHistory(history=1.0)
    h.cached(0, (0, 0))                       # cap = 1 block: remember one hash
    h.prompt([1, 2])
    assert list(h.prompts) == [2]
    assert h.prompt([1, 2, 3]) is True        # 2 was remembered as an end
    assert len(h.prompts) == 1


def test_copy_is_independent():
    h = ReuseHistory()
    h.prompt([1, 2])
    c = h.copy()
    c.prompt([5, 6])
    assert 5 not in h.prompts and 5 in c.prompts


def _serve(pol, t, prompt_keys, blocks, hits=()):
    """One request in the order the cache gives it: the prompt, the hit blocks taken back,
    the new blocks cached, then every block freed."""
    pol.on_request(prompt_keys, t)
    for b in hits:
        if b in pol:
            pol.remove(b)
        pol.on_hit(b, t)
    for b, key in blocks:
        pol.on_cache(b, (0, key))
    pol.add_many([b for b in hits] + [b for b, _ in blocks], t, (), ())


@pytest.mark.parametrize("cls, protected", [(ConversationEviction, True), (ReuseEviction, False)])
def test_a_next_turns_new_blocks_join_the_again_queue(cls, protected):
    pol = cls()
    _serve(pol, 0.0, [10, 11], [(0, 10), (1, 11)])
    _serve(pol, 1.0, [10, 11, 12, 13], [(2, 12), (3, 13)], hits=(0, 1))
    _serve(pol, 2.0, [20, 21], [(4, 20), (5, 21)])
    assert pol.needs_requests is (cls is ConversationEviction)
    assert (2 in pol._again and 3 in pol._again) is protected
    assert 4 in pol._first and 5 in pol._first
    assert 0 in pol._again                    # hit: reused under both policies


@pytest.mark.parametrize("seed", range(5))
def test_without_continuing_prompts_the_order_is_reuses(seed):
    # Every prompt new: conversation must pop exactly as reuse, step for step.
    rng = random.Random(seed)
    conv, reuse = ConversationEviction(), ReuseEviction()
    free: list[int] = []
    next_block, next_key = 0, 1000
    for t in range(200):
        now = float(t)
        if free and rng.random() < 0.4:
            n = rng.randint(1, len(free))
            assert conv.pop_n(n, now) == reuse.pop_n(n, now)
            free = [b for b in free if b in reuse]
            continue
        keys = list(range(next_key, next_key + rng.randint(1, 4)))
        next_key += len(keys) + 1
        blocks = [(next_block + i, k) for i, k in enumerate(keys)]
        next_block += len(keys)
        for pol in (conv, reuse):
            _serve(pol, now, keys, blocks)
        free += [b for b, _ in blocks]
    assert len(conv) == len(reuse)
    assert conv.pop_n(len(conv), 999.0) == reuse.pop_n(len(reuse), 999.0)


def test_clone_keeps_the_marks_and_is_independent():
    pol = ConversationEviction()
    _serve(pol, 0.0, [10, 11], [(0, 10), (1, 11)])
    twin = pol.clone()
    assert type(twin) is ConversationEviction
    _serve(twin, 1.0, [10, 11, 12], [(2, 12)], hits=(0, 1))
    assert 2 in twin._again and 2 not in pol
    assert twin.hist.prompts is not pol.hist.prompts
