"""The junction case, at any block size B (shared by the plugin tests).

One 1,500-token prefix; prompt i = prefix + one distinct token + the same 300-token suffix
(1,801 tokens), 4 output tokens, one at a time. The prompts share S = floor(1500 / B) * B
tokens (S = 1,408 at B = 128, 1,280 at B = 256; the block after S holds the distinct token).

* vllm / marconi: prompt 1 runs on an empty cache and keeps a state only at its prompt end
  floor(1800 / B) * B. Prompt 2 finds S attention tokens but no state at or below them:
  hybrid hit 0, junction S; its prefill stops there and the state is cached. Prompts 3..10
  hit S.
* last: no junction stop; every prompt keeps only its own prompt-end state: 0 everywhere.
* dense: prompt 1 keeps a state at every block boundary: prompts 2..10 hit S.
* none: no state is ever cached: 0.

(tests/test_cache.py::EXPECTED_JUNCTION is the same derivation at B = 256.)

Prefill steps (docs/engine-facts.md rule 6; the 4,096-token budget never binds): every prompt
ends a chunk at its checkpoint C = floor(1800 / B) * B and computes [C, 1801) in one more
step, whatever the policy (vLLM's own split stops at C). vllm / marconi add the junction stop
S for prompt 2 (0 -> S -> C -> 1801: 3 steps); dense ends a chunk at every block boundary
(prompt 1: C / B + 1 steps; prompts 2..10 resume at S: (C - S) / B + 1).

In the simulator's ``inpass`` checkpoint mode the same states are captured inside the forward
pass and no chunk ends at a checkpoint: with the budget not binding, every prompt of every
policy is one step (``expected_junction_inpass_prefill_steps``), and the hits are those above.
"""

from __future__ import annotations

from collections.abc import Callable


def expected_junction(block_size: int) -> dict[str, list[int]]:
    """Per policy, the ten prompts' hits (tokens) at ``block_size``."""
    shared = 1500 // block_size * block_size
    assert 0 < shared < 1500, "the case needs at least one shared block and a distinct one"
    return {
        "none": [0] * 10,
        "last": [0] * 10,
        "vllm": [0, 0] + [shared] * 8,
        "marconi": [0, 0] + [shared] * 8,
        "dense": [0] + [shared] * 9,
    }


def expected_junction_state_miss(block_size: int) -> dict[str, list[int]]:
    """Per policy, the ten prompts' state-miss tokens (attention-KV hit minus hybrid hit).

    Prompts 2..10 all find the prefix's S tokens of attention KV (prompt 1 computed them;
    the distinct token ends the shared chain); what of it has no state is recomputed:
    S for prompt 2 under vllm / marconi (the junction), S for every later prompt under
    last / none (no state is ever kept there), nothing under dense.
    """
    shared = 1500 // block_size * block_size
    return {
        "none": [0] + [shared] * 9,
        "last": [0] + [shared] * 9,
        "vllm": [0, shared] + [0] * 8,
        "marconi": [0, shared] + [0] * 8,
        "dense": [0] * 10,
    }


def expected_junction_prefill_steps(block_size: int) -> dict[str, list[int]]:
    """Per policy, the ten prompts' prefill steps (engine steps with prompt tokens) at ``block_size``."""
    shared = 1500 // block_size * block_size
    checkpoint = 1800 // block_size * block_size
    assert shared < checkpoint < 1801, "the junction and the checkpoint must be distinct stops"
    dense_rest = (checkpoint - shared) // block_size + 1
    return {
        "none": [2] * 10,
        "last": [2] * 10,
        "vllm": [2, 3] + [2] * 8,
        "marconi": [2, 3] + [2] * 8,
        "dense": [checkpoint // block_size + 1] + [dense_rest] * 9,
    }


def expected_junction_inpass_prefill_steps(block_size: int) -> dict[str, list[int]]:
    """Per policy, the ten prompts' prefill steps in ``inpass`` checkpoint mode: one each
    (the 4,096-token budget never binds on a 1,801-token prompt; ``block_size`` only checks
    the case)."""
    expected_junction(block_size)
    return {policy: [1] * 10 for policy in ("none", "last", "vllm", "marconi", "dense")}


def junction_prompts(toks: Callable[[int, int], list[int]]) -> list[list[int]]:
    """The 10 prompts, with ``toks(seed, n)`` giving the prefix (seed 2) and suffix (seed 3)."""
    prefix, suffix = toks(2, 1500), toks(3, 300)
    return [prefix + [3 + i] + suffix for i in range(10)]
