"""Long traces with a real trace's statistics: the source repeated, its private content renamed.

Production traces run far longer than the public ones (the Mooncake conversation
trace has 12,031 requests over an hour; a day of one serving instance has
hundreds of thousands). :func:`resample` makes a trace of any length out of a
source trace, one *pass* after another. A pass is the source itself, request for
request and with the same gaps between arrivals, except that every span key that
is not a *shared prefix* is renamed (``key + pass * span``, ``span`` above every
key of the source): a conversation's copy in a later pass never hits the
blocks of the earlier copies, while shared prefixes (a system prompt, a shared
document) stay shared by every pass, as they are in a service that runs on.

A shared prefix is a key followed by at least ``fanout`` distinct next keys
across the source (Mooncake's 512-token system prompt, key 0, precedes every
request; in all, 1,466 of its keys are shared prefixes with ``fanout`` 4), and
every key before one on a request.

So every pass has the source's request count, prompt and output lengths, turns,
think times, arrival pattern and shared prefixes; over passes the shared
prefixes are reused again and again, the rest is new. Shuffling the start times
of the source's conversations instead was tried and left out: it changes the
statistics it should keep (``vllm`` + ``lru`` at 64 GiB, Qwen3-Next: 3.67 % on
a pass at the source's own start times, 4.73 % and 5.82 % with two random
draws). Requests are produced lazily, one at a time from the source: memory is
bounded by the source, not by the length asked for.

This module imports neither vLLM nor torch.
"""

from __future__ import annotations

from collections.abc import Iterator

from vllm_admission.core.sampling import BranchTable
from vllm_admission.core.traces.prompts import SpanPrompt
from vllm_admission.core.traces.trace import Request, Trace, TraceError

__all__ = ["resample", "shared_prefix_keys"]


def shared_prefix_keys(trace: Trace, fanout: int = 4) -> frozenset[int]:
    """The span keys of ``trace`` that are shared prefixes: branch points
    (:class:`~vllm_admission.core.sampling.BranchTable`: followed by at least
    ``fanout`` distinct next keys over the whole trace), and every key before one
    on a request's spans.

    Raises:
        TraceError: a request whose prompt is not given as spans.
    """
    table = BranchTable(fanout)
    for req in trace.requests:
        table.record(_keys(req))
    shared: set[int] = set()
    for req in trace.requests:
        keys = _keys(req)
        shared.update(keys[:table.deepest(keys) + 1])
    return frozenset(shared)


def resample(source: Trace, num_requests: int, *, fanout: int = 4) -> Iterator[Request]:
    """``num_requests`` requests: ``source`` pass after pass, its private content renamed in
    each (see the module docstring), in arrival order, produced lazily.

    Args:
        source: a trace whose prompts are spans (Mooncake, the synthetic workload).
        num_requests: requests to produce (>= 1); the last pass is cut short.
        fanout: distinct next keys that make a key a shared prefix (>= 2).

    Raises:
        TraceError: ``num_requests`` or ``fanout`` out of range, an empty source or one
            whose prompts are not spans.
    """
    if type(num_requests) is not int or num_requests < 1:
        raise TraceError(f"num_requests must be an int >= 1, got {num_requests!r}")
    if type(fanout) is not int or fanout < 2:
        raise TraceError(f"fanout must be an int >= 2, got {fanout!r}")
    if not source.requests:
        raise TraceError(f"trace {source.name} is empty: nothing to resample")
    shared = shared_prefix_keys(source, fanout)
    return _passes(source, num_requests, shared)


def _passes(source: Trace, num_requests: int, shared: frozenset[int]) -> Iterator[Request]:
    reqs = source.requests
    span = 1 + max(max(k for r in reqs for k in _keys(r)), max((r.output_key or 0) for r in reqs))
    arrivals = [r.arrival_s or 0.0 for r in reqs]
    # A pass starts one mean gap after the previous one ended.
    period = arrivals[-1] - arrivals[0] + (arrivals[-1] - arrivals[0]) / max(len(reqs) - 1, 1)
    made = 0
    p = 0
    while True:
        for req, at in zip(reqs, arrivals, strict=True):
            if made == num_requests:
                return
            prompt = req.prompt
            assert isinstance(prompt, SpanPrompt)  # every one is (shared_prefix_keys checked)
            spans = tuple((k if k in shared else k + p * span, n) for k, n in prompt.spans)
            out = req.output_key
            if out is not None and out not in shared:
                out += p * span
            session = None if req.session is None else f"{req.session}@{p}"
            yield Request(f"{req.request_id}@{p}", SpanPrompt(spans), req.output_len,
                          None if req.arrival_s is None else at + p * period, session, out)
            made += 1
        p += 1


def _keys(req: Request) -> list[int]:
    prompt = req.prompt
    if not isinstance(prompt, SpanPrompt):
        raise TraceError(f"request {req.request_id}: resampling needs a prompt given as spans "
                         f"(a Mooncake or synthetic trace), not {type(prompt).__name__}")
    return [k for k, _ in prompt.spans]
