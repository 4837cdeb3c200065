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

The expectations below are derived for every registered policy from its own answers
(``stops``, ``admit``), so a new policy is covered; WRITTEN_OUT_B256 is the derivation
above written out at B = 256, which tests/test_cache.py checks the derived one against.

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

from vllm_admission.core.admission import (
    ADMISSION_POLICIES,
    ADMIT,
    HitProbe,
    RequestAdmission,
    get_admission,
)

PROMPT_LEN, OUTPUT_LEN = 1801, 4

#: The derivation above, written out at B = 256 for the policies it names (what the
#: derivation from each policy's own answers must reproduce; tests/test_cache.py).
WRITTEN_OUT_B256 = {
    "none": [0] * 10,
    "last": [0] * 10,
    "vllm": [0, 0] + [1280] * 8,
    "marconi": [0, 0] + [1280] * 8,
    "dense": [0] + [1280] * 9,
}


def _shared(block_size: int) -> int:
    shared = 1500 // block_size * block_size
    assert 0 < shared < 1500, "the case needs at least one shared block and a distinct one"
    return shared


def _keeps_shared(name: str, block_size: int, kv_hit: int) -> bool:
    """Whether a prompt with no state hit and ``kv_hit`` attention tokens cached keeps a
    state at the shared boundary S: the policy stops a chunk there and admits it."""
    S = _shared(block_size)
    adm = RequestAdmission(get_admission(name), HitProbe(PROMPT_LEN, block_size, kv_hit, 0),
                           total_len=PROMPT_LEN + OUTPUT_LEN)
    return S in adm.stops and adm.decide(S) == ADMIT


def junction_hits(name: str, block_size: int) -> list[int]:
    """The ten prompts' hits (tokens) under admission policy ``name``, from the policy's own
    answers (its stops and admit decisions): prompt 1 (empty cache) keeps S -> prompts 2..10
    hit S; else prompt 2 (attention KV of S cached, no state: the junction) keeps S ->
    prompts 3..10 hit S; else nothing is ever hit (each prompt end holds a distinct token)."""
    S = _shared(block_size)
    if _keeps_shared(name, block_size, 0):
        return [0] + [S] * 9
    if _keeps_shared(name, block_size, S):
        return [0, 0] + [S] * 8
    return [0] * 10


def junction_steps(name: str, block_size: int) -> list[int]:
    """The ten prompts' prefill steps in ``split`` mode: a chunk ends at each of the policy's
    stops and at the prompt checkpoint C, then one more step to the prompt's end."""
    S = _shared(block_size)
    C = (PROMPT_LEN - 1) // block_size * block_size
    assert S < C < PROMPT_LEN, "the junction and the checkpoint must be distinct stops"
    policy = get_admission(name)
    steps = []
    for i, hit in enumerate(junction_hits(name, block_size)):
        probe = HitProbe(PROMPT_LEN, block_size, S if i else 0, hit)
        steps.append(len(set(policy.stops(probe)) | {C}) + 1)
    return steps


def expected_junction(block_size: int) -> dict[str, list[int]]:
    """Per registered admission policy, the ten prompts' hits (tokens) at ``block_size``."""
    _shared(block_size)
    return {name: junction_hits(name, block_size) for name in ADMISSION_POLICIES}


def expected_junction_state_miss(block_size: int) -> dict[str, list[int]]:
    """Per policy, the ten prompts' state-miss tokens (attention-KV hit minus hybrid hit).

    Prompts 2..10 all find the prefix's S tokens of attention KV (prompt 1 computed them;
    the distinct token ends the shared chain); what of it has no state is recomputed:
    S for prompt 2 under vllm / marconi (the junction), S for every later prompt under
    last / none (no state is ever kept there), nothing under dense.
    """
    S = _shared(block_size)
    return {name: [0] + [S - h for h in hits[1:]]
            for name, hits in expected_junction(block_size).items()}


def expected_junction_prefill_steps(block_size: int) -> dict[str, list[int]]:
    """Per policy, the ten prompts' prefill steps (engine steps with prompt tokens) at
    ``block_size``: vllm / marconi 2, 3, then 2; none / last 2 each; dense C / B + 1, then
    (C - S) / B + 1 (C the prompt checkpoint floor(1800 / B) * B)."""
    return {name: junction_steps(name, block_size) for name in ADMISSION_POLICIES}


def expected_junction_inpass_prefill_steps(block_size: int) -> dict[str, list[int]]:
    """Per policy, the ten prompts' prefill steps in ``inpass`` checkpoint mode: one each
    (the 4,096-token budget never binds on a 1,801-token prompt; ``block_size`` only checks
    the case)."""
    _shared(block_size)
    return {policy: [1] * 10 for policy in ADMISSION_POLICIES}


def junction_prompts(toks: Callable[[int, int], list[int]]) -> list[list[int]]:
    """The 10 prompts, with ``toks(seed, n)`` giving the prefix (seed 2) and suffix (seed 3)."""
    prefix, suffix = toks(2, 1500), toks(3, 300)
    return [prefix + [3 + i] + suffix for i in range(10)]
