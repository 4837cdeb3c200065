"""The junction case at the tiny engine's block size, B = 128 (shared by the plugin tests).

One 1,500-token prefix; prompt i = prefix + one distinct token + the same 300-token suffix
(1,801 tokens), 4 output tokens, one at a time. The prompts share floor(1500 / 128) = 11
full blocks = 1,408 tokens (block 12 holds the distinct token).

* vllm / marconi: prompt 1 runs on an empty cache and keeps a state only at its prompt end
  floor(1800 / 128) * 128 = 1,792. Prompt 2 finds 1,408 attention tokens but no state at or
  below them: hybrid hit 0, junction 1,408; its prefill stops there and the state is cached.
  Prompts 3..10 hit 1,408.
* last: no junction stop; every prompt keeps only its own 1,792 state: 0 everywhere.
* dense: prompt 1 keeps a state at every block boundary: prompts 2..10 hit 1,408.
* none: no state is ever cached: 0.

(tests/test_cache.py::EXPECTED_JUNCTION is the same derivation at B = 256: 1,280.)
"""

from __future__ import annotations

from collections.abc import Callable

EXPECTED_JUNCTION = {
    "none": [0] * 10,
    "last": [0] * 10,
    "vllm": [0, 0] + [1408] * 8,
    "marconi": [0, 0] + [1408] * 8,
    "dense": [0] + [1408] * 9,
}


def junction_prompts(toks: Callable[[int, int], list[int]]) -> list[list[int]]:
    """The 10 prompts, with ``toks(seed, n)`` giving the prefix (seed 2) and suffix (seed 3)."""
    prefix, suffix = toks(2, 1500), toks(3, 300)
    return [prefix + [3 + i] + suffix for i in range(10)]
