"""Engine against simulator, request by request, and the bar a record must meet (docs/fidelity.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm_admission.core.adaptive import AUTO
from vllm_admission.core.admission import ADMISSION_POLICIES
from vllm_admission.core.eviction import eviction_class

__all__ = ["EXACT_ADMISSIONS", "TOLERANCE", "compare_hits", "meets_bar"]


def compare_hits(prompt_tokens: Sequence[int], engine: Sequence[int | None],
                 simulator: Sequence[int | None]) -> dict[str, Any]:
    """Per-request agreement of two hit lists (tokens).

    ``None`` marks a request one side did not run; it counts as differing
    (its whole prompt as the absolute difference) unless both skipped it.

    Returns:
        ``requests`` (compared: run by at least one side), ``requests_differing``,
        ``abs_diff_tokens`` (sum of ``|engine - simulator|``), ``prompt_tokens``
        (of the compared requests), ``abs_diff_fraction``
        (``abs_diff_tokens / prompt_tokens``; 0.0 without prompts) and
        ``first_difference`` (index of the first differing request or ``None``).

    Raises:
        ValueError: the three lists differ in length.
    """
    if not len(prompt_tokens) == len(engine) == len(simulator):
        raise ValueError(f"lists differ in length: {len(prompt_tokens)} prompts, "
                         f"{len(engine)} engine, {len(simulator)} simulator")
    requests = differing = diff = prompts = 0
    first = None
    for i, (p, e, s) in enumerate(zip(prompt_tokens, engine, simulator, strict=True)):
        if e is None and s is None:
            continue
        requests += 1
        prompts += p
        d = p if e is None or s is None else abs(e - s)
        if d or (e is None) != (s is None):
            differing += 1
            diff += d
            if first is None:
                first = i
    return {"requests": requests, "requests_differing": differing, "abs_diff_tokens": diff,
            "prompt_tokens": prompts, "abs_diff_fraction": diff / prompts if prompts else 0.0,
            "first_difference": first}


#: Admission policies whose sequential replay with ``lru`` must match request by
#: request: every registered one that decides without knowing where the sequence
#: ends (not ``tentative_sequence_end``: ``marconi`` keeps its sequence end tentatively
#: in the engine, which does not know the output length: ``none``, ``last``,
#: ``vllm``, ``dense``).
EXACT_ADMISSIONS: tuple[str, ...] = tuple(n for n, c in ADMISSION_POLICIES.items()
                                          if not c().tentative_sequence_end)


#: Largest ``abs_diff_fraction`` allowed for ``marconi`` and for ``flop`` eviction.
TOLERANCE = 0.01


def meets_bar(record: dict[str, Any]) -> bool:
    """Whether a sequential record meets the fidelity bar.

    Exact (no differing request) for an eviction policy in vLLM's own order
    (``vllm_order``: ``lru``) with an admission of :data:`EXACT_ADMISSIONS`;
    otherwise (``auto`` included) ``abs_diff_fraction <= 1 %``. Timed
    records have no bar (their drift is reported, not judged): always True.
    """
    if record.get("mode", "sequential") != "sequential":
        return True
    if (record["eviction"] != AUTO and eviction_class(record["eviction"]).vllm_order
            and record["admission"] in EXACT_ADMISSIONS):
        return record["requests_differing"] == 0
    return record["abs_diff_fraction"] <= TOLERANCE
