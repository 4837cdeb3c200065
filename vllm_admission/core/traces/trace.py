"""Requests, traces and the infinite-cache prefix-reuse bound."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from vllm_admission.core.counters import TokenHitRate, ratio
from vllm_admission.core.errors import UserError
from vllm_admission.core.traces.prompts import Prompt, SpanPrompt

__all__ = ["TraceError", "Request", "Trace", "PrefixReuse", "capacity_bound"]


class TraceError(UserError):
    """A trace cannot be read or built.

    For a malformed line the message is ``"<file>:<line>: field '<name>': <what is wrong>"``
    (or ``"<file>:<line>: <what is wrong>"`` when the line is not a JSON object at all).
    """


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a trace.

    ``output_len`` is the number of tokens to generate (>= 1); ``arrival_s`` is seconds from
    the trace start (``None`` when the trace has no timestamps); ``session`` groups the turns
    of one conversation or agent loop (``None`` when unknown).
    """

    request_id: str
    prompt: Prompt
    output_len: int
    arrival_s: float | None
    session: str | None
    #: Span key of the output's content when the trace knows it (the synthetic
    #: workload does: a later turn's prompt contains it); ``None`` otherwise.
    output_key: int | None = None

    @property
    def prompt_len(self) -> int:
        """Prompt length in tokens."""
        return self.prompt.num_tokens

    def block_hashes(self, block_size: int) -> list[int]:
        """Chained hashes of the full prompt blocks: ``prompt_len // block_size`` ints.

        A partial last block is not hashed (vLLM never caches it). Raises ValueError for a
        non-positive ``block_size``. Use :meth:`Trace.block_hashes` for a whole trace (memoised).
        """
        return self.prompt.block_hashes(block_size)

    def sequence_block_hashes(self, block_size: int) -> list[int]:
        """Full-block hashes of prompt + output when the output's content is known.

        Equal to :meth:`block_hashes` for blocks inside the prompt; when
        ``output_key`` is set the chain continues through the output, so a later
        turn whose prompt contains this output shares those blocks. Without an
        ``output_key`` this is :meth:`block_hashes`.
        """
        if self.output_key is None or not isinstance(self.prompt, SpanPrompt):
            return self.prompt.block_hashes(block_size)
        return SpanPrompt(self.prompt.spans + ((self.output_key, self.output_len),)).block_hashes(block_size)

    def token_ids(self, vocab_size: int) -> list[int]:
        """``prompt_len`` concrete token ids in ``[0, vocab_size)`` for a real engine (deterministic)."""
        return self.prompt.token_ids(vocab_size)


@dataclass(frozen=True)
class PrefixReuse(TokenHitRate):
    """Prefix reuse of a trace under an infinite cache (see :meth:`Trace.prefix_reuse`)."""

    hit_blocks: int
    total_blocks: int
    hit_tokens: int
    prompt_tokens: int

    @property
    def block_hit_rate(self) -> float:
        """``hit_blocks / total_blocks`` (0 without blocks)."""
        return ratio(self.hit_blocks, self.total_blocks)


@dataclass
class Trace:
    """An ordered list of requests plus where they came from.

    ``skipped`` maps a reason to the number of records a filter the user asked for left out
    (empty when nothing was filtered). ``source`` is the file path or ``"synthetic"``.
    Block hashes are memoised per block size on first use: do not mutate ``requests``
    (or the returned lists) afterwards.
    """

    name: str
    requests: list[Request]
    skipped: dict[str, int] = field(default_factory=dict)
    source: str = "synthetic"
    # (block size, include_partial) or (block size, "sequence") -> the hashes
    _hash_memo: dict[tuple[int, bool | str], list[list[int]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def block_hashes(self, block_size: int) -> list[list[int]]:
        """Full-block hashes of every request, in request order: ``result[i] ==
        requests[i].block_hashes(block_size)``. Computed once per block size and memoised.

        Raises ValueError for a non-positive ``block_size``.
        """
        return self._hashes(block_size, include_partial=False)

    def sequence_block_hashes(self, block_size: int) -> list[list[int]]:
        """:meth:`Request.sequence_block_hashes` of every request (memoised)."""
        key = (block_size, "sequence")
        memo = self._hash_memo.get(key)
        if memo is None:
            memo = [r.sequence_block_hashes(block_size) for r in self.requests]
            self._hash_memo[key] = memo
        return memo

    def with_max_output_len(self, cap: int | None) -> Trace:
        """This trace with every request's output capped at ``cap`` tokens
        (``None``: this trace itself).

        Raises:
            UserError: ``cap`` below 1.
        """
        if cap is None:
            return self
        if cap < 1:
            raise UserError(f"max output length must be >= 1, got {cap}")
        return Trace(name=self.name, source=self.source, skipped=dict(self.skipped),
                     requests=[dataclasses.replace(r, output_len=min(r.output_len, cap))
                               for r in self.requests])

    def _hashes(self, block_size: int, include_partial: bool) -> list[list[int]]:
        key = (block_size, include_partial)
        memo = self._hash_memo.get(key)
        if memo is None:
            memo = [r.prompt.block_hashes(block_size, include_partial=include_partial) for r in self.requests]
            self._hash_memo[key] = memo
        return memo

    def summary(self) -> dict[str, object]:
        """Flat dict of sizes: ``requests``, ``prompt_tokens_total/mean/max``,
        ``output_tokens_total/mean/max``, ``sessions`` (distinct non-None ids),
        ``duration_s`` (last minus first arrival, None without timestamps) and ``skipped``."""
        reqs = self.requests
        n = len(reqs)
        prompt = [r.prompt_len for r in reqs]
        output = [r.output_len for r in reqs]
        arrivals = [r.arrival_s for r in reqs if r.arrival_s is not None]
        return {
            "name": self.name,
            "requests": n,
            "prompt_tokens_total": sum(prompt),
            "prompt_tokens_mean": sum(prompt) / n if n else 0.0,
            "prompt_tokens_max": max(prompt, default=0),
            "output_tokens_total": sum(output),
            "output_tokens_mean": sum(output) / n if n else 0.0,
            "output_tokens_max": max(output, default=0),
            "sessions": len({r.session for r in reqs if r.session is not None}),
            "duration_s": max(arrivals) - min(arrivals) if arrivals else None,
            "skipped": dict(self.skipped),
        }

    def prefix_reuse(self, block_size: int, *, partial_blocks: bool = False, cap: bool = True) -> PrefixReuse:
        """Hits with an infinite cache that holds (and has a state at) every block of every
        earlier request's prompt; outputs are never reused.

        Each request, in order, matches its longest run of leading blocks whose chained hash
        appeared in an earlier prompt; ``m`` is that number of blocks.

        - ``partial_blocks=False``: only full blocks are hashed and counted
          (``total_blocks = sum(prompt_len // B)``). With ``True`` a partial last block is a block
          too (``sum(ceil(prompt_len / B))``), matched when an earlier prompt had the very same last block.
        - ``cap=True`` (vLLM): the hit is limited to ``(prompt_len - 1) // B`` blocks, so the last
          prompt token is always computed; ``hit_tokens = blocks * B``. With ``cap=False``
          ``hit_tokens = min(m * B, prompt_len)`` (a matched partial block counts its real length).

        ``prompt_tokens`` is the sum of all prompt lengths. One pass over the memoised hashes.
        Raises ValueError for a non-positive ``block_size``.
        """
        seen: set[int] = set()
        hit_blocks = total_blocks = hit_tokens = prompt_tokens = 0
        B = block_size
        for req, hashes in zip(self.requests, self._hashes(block_size, partial_blocks), strict=True):
            n = len(hashes)
            m = 0
            while m < n and hashes[m] in seen:  # chained: the first miss ends the prefix
                m += 1
            seen.update(hashes)
            length = req.prompt_len
            if cap:
                m = min(m, (length - 1) // B)
                hit_tokens += m * B
            else:
                hit_tokens += min(m * B, length)
            hit_blocks += m
            total_blocks += n
            prompt_tokens += length
        return PrefixReuse(hit_blocks, total_blocks, hit_tokens, prompt_tokens)

    def infinite_capacity_bound(self, block_size: int) -> tuple[int, int]:
        """``(hit_tokens, prompt_tokens)`` under an infinite cache with a state at every
        block: :func:`capacity_bound` over the requests' :meth:`sequence_block_hashes`
        (prompts, and outputs whose content the trace knows)."""
        return capacity_bound(((h, r.prompt_len, r.output_len) for h, r in
                               zip(self.sequence_block_hashes(block_size), self.requests, strict=True)),
                              block_size)


def capacity_bound(requests: Iterable[tuple[Sequence[int], int, int]],
                   block_size: int) -> tuple[int, int]:
    """Hit tokens with an infinite cache and a state at every block boundary.

    ``requests`` yields ``(block_hashes, prompt_len, output_len)`` in arrival
    order; ``block_hashes`` are the full blocks of the prompt and, where the
    output's content is known, of the output. Each request hits its longest
    run of leading blocks that an earlier request computed, capped as vLLM caps
    a hit: ``(prompt_len - 1) // block_size`` blocks. An earlier request
    computed ``(prompt_len + output_len - 1) // block_size`` full blocks: vLLM
    caches the KV of full blocks filled during decode too (the last output
    token's KV is never computed; docs/engine-facts.md rule 3), so a later turn
    that repeats an earlier output can hit it. This is the one bound of the
    project: the simulator's ``results.json`` and the trace statistics use it.

    Returns:
        ``(hit_tokens, prompt_tokens)`` summed over the requests.
    """
    seen: set[int] = set()
    hit = prompt = 0
    for hashes, prompt_len, output_len in requests:
        cap = min((prompt_len - 1) // block_size, len(hashes))
        k = 0
        while k < cap and hashes[k] in seen:
            k += 1
        hit += k * block_size
        prompt += prompt_len
        seen.update(hashes[:(prompt_len + output_len - 1) // block_size])
    return hit, prompt
