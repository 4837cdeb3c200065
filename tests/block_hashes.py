"""Chained block hashes for tests that drive the core's cache model with token lists."""

from __future__ import annotations

from collections.abc import Sequence


def chained_hashes(tokens: Sequence, block_size: int) -> list[int]:
    """Chained block hashes of the full blocks of ``tokens`` (token ids or any hashable
    content labels), as the core model's keys: block ``i``'s hash covers blocks ``0..i``."""
    out, h = [], 0
    for i in range(len(tokens) // block_size):
        h = hash((h, tuple(tokens[i * block_size:(i + 1) * block_size])))
        out.append(h)
    return out
