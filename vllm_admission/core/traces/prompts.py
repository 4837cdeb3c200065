"""Prompt contents and their chained block hashes.

A prompt is either explicit token ids (:class:`TokenPrompt`) or a sequence of
content spans (:class:`SpanPrompt`). Both hash *full* blocks the way vLLM's
prefix cache does: the hash of block ``k`` covers the hash of block ``k - 1``
and the content of block ``k``, so two prompts share block hash ``k`` exactly
when they share all content up to the end of block ``k``.

Hashes are Python ``hash()`` values of tuples of ints. Those are not salted by
``PYTHONHASHSEED`` (only ``str``/``bytes`` hashing is), so they are the same
in every process of the same CPython build (3.8+, 64-bit). Strings are never
hashed here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from vllm_admission.core.errors import UserError
from vllm_admission.core.hashing import MASK64, mix64

__all__ = ["Prompt", "TokenPrompt", "SpanPrompt", "span_token"]

# Distinct chain roots so that a token prompt and a span prompt never share a chain by construction.
_TOKEN_ROOT = 0x746F6B656E73  # "tokens"
_SPAN_ROOT = 0x7370616E73  # "spans"


def span_token(key: int, offset: int, vocab_size: int) -> int:
    """Token id at ``offset`` (0-based) inside a span with ``key``: an integer in ``[0, vocab_size)``."""
    return mix64(mix64(key & MASK64) ^ offset) % vocab_size


def _check_block_size(block_size: int) -> None:
    if type(block_size) is not int or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")


def _check_vocab_size(vocab_size: int) -> None:
    if type(vocab_size) is not int or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")


class Prompt(Protocol):
    """What the simulator and the engine replay need from a prompt."""

    @property
    def num_tokens(self) -> int:
        """Prompt length in tokens (>= 1)."""
        ...

    def block_hashes(self, block_size: int, *, include_partial: bool = False) -> list[int]:
        """Chained hashes, one per full block of ``block_size`` tokens (plus the partial last block if asked)."""
        ...

    def token_ids(self, vocab_size: int) -> list[int]:
        """Concrete token ids, each in ``[0, vocab_size)``; the same on every call and in every process."""
        ...


@dataclass(frozen=True, slots=True)
class TokenPrompt:
    """A prompt given as explicit token ids.

    Block ``k``'s hash is ``hash((hash of block k-1, tokens of block k))``.
    """

    tokens: tuple[int, ...]

    def __post_init__(self) -> None:
        if type(self.tokens) is not tuple or not self.tokens:
            raise ValueError("TokenPrompt.tokens must be a non-empty tuple of ints")

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    def block_hashes(self, block_size: int, *, include_partial: bool = False) -> list[int]:
        """One hash per full block (``len == num_tokens // block_size``); with ``include_partial``
        a last hash for a shorter last block is appended when there is one.

        Raises ValueError for a non-positive ``block_size``.
        """
        _check_block_size(block_size)
        toks = self.tokens
        end = len(toks) if include_partial else len(toks) - len(toks) % block_size
        h = _TOKEN_ROOT
        out = []
        for start in range(0, end, block_size):
            h = hash((h, toks[start : start + block_size]))
            out.append(h)
        return out

    def token_ids(self, vocab_size: int) -> list[int]:
        """The tokens themselves. Raises UserError if one is ``>= vocab_size``."""
        _check_vocab_size(vocab_size)
        top = max(self.tokens)
        if top >= vocab_size:
            raise UserError(f"token id {top} does not fit a vocabulary of {vocab_size}")
        return list(self.tokens)


@dataclass(frozen=True, slots=True)
class SpanPrompt:
    """A prompt given as content spans ``((key, length), ...)``.

    ``key`` (an int >= 0) names the span's content given everything before it; ``length`` >= 1
    is its size in tokens. The token at offset ``o`` of a span with key ``s`` is
    :func:`span_token` ``(s, o, vocab_size)``, so a span with the same key and a shorter length
    is a prefix of the longer one.

    Block ``k`` of size ``B`` covers tokens ``[kB, (k+1)B)``; its hash is
    ``hash((hash of block k-1, pieces))`` where ``pieces`` is the tuple of
    ``(key, start_in_span, end_in_span)`` for every span that overlaps the block, in order.
    Because spans start at offset 0 and are never empty, the pieces of a block determine its
    tokens and vice versa, for any ``B``.
    """

    spans: tuple[tuple[int, int], ...]
    num_tokens: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        spans = self.spans
        if type(spans) is not tuple or not spans:
            raise ValueError("SpanPrompt.spans must be a non-empty tuple of (key, length) pairs")
        if set(map(type, spans)) != {tuple} or set(map(len, spans)) != {2}:
            raise ValueError("SpanPrompt.spans must hold (key, length) pairs")
        keys, lengths = zip(*spans, strict=True)
        if set(map(type, keys + lengths)) != {int} or min(keys) < 0 or min(lengths) < 1:
            bad = next((k, n) for k, n in spans if type(k) is not int or type(n) is not int or k < 0 or n < 1)
            raise ValueError(f"bad span {bad!r}: need an int key >= 0 and an int length >= 1")
        total = sum(lengths)
        object.__setattr__(self, "num_tokens", total)

    def block_hashes(self, block_size: int, *, include_partial: bool = False) -> list[int]:
        """One hash per full block (``len == num_tokens // block_size``); with ``include_partial``
        a last hash for a shorter last block is appended when there is one.

        Raises ValueError for a non-positive ``block_size``.
        """
        _check_block_size(block_size)
        B = block_size
        h = _SPAN_ROOT
        out: list[int] = []
        append = out.append
        pieces: list[tuple[int, int, int]] = []  # the open block's pieces (empty at a block boundary)
        room = B  # tokens the open block still lacks
        for key, length in self.spans:
            if pieces:  # finish the open block first
                if length < room:
                    pieces.append((key, 0, length))
                    room -= length
                    continue
                pieces.append((key, 0, room))
                h = hash((h, tuple(pieces)))
                append(h)
                pieces = []
                start, room = room, B
            elif length == B:  # the common case of a span that is exactly one block
                h = hash((h, ((key, 0, B),)))
                append(h)
                continue
            else:
                start = 0
            while length - start >= B:  # whole blocks inside this span
                h = hash((h, ((key, start, start + B),)))
                append(h)
                start += B
            if start < length:
                pieces = [(key, start, length)]
                room = B - (length - start)
        if include_partial and pieces:
            out.append(hash((h, tuple(pieces))))
        return out

    def token_ids(self, vocab_size: int) -> list[int]:
        """``num_tokens`` ids in ``[0, vocab_size)``, deterministic in the spans alone."""
        _check_vocab_size(vocab_size)
        out: list[int] = []
        mix = mix64
        for key, length in self.spans:
            base = mix(key & MASK64)
            out.extend(mix(base ^ o) % vocab_size for o in range(length))
        return out
