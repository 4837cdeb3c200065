"""One 64-bit integer mixer, shared by the trace prompts and the shadow sampler.

This module imports neither vLLM nor torch.
"""

from __future__ import annotations

__all__ = ["MASK64", "mix64"]

MASK64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """The splitmix64 finaliser (Steele, Lea and Flood, "Fast splittable
    pseudorandom number generators", OOPSLA 2014): a bijective, well-scrambling
    map of 64-bit integers, the same in every process (unlike Python's ``hash``
    of ``bytes``). An ``int`` outside ``[0, 2**64)`` is taken modulo ``2**64``.
    """
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)
