"""Replay trace requests through a real vLLM ``LLM`` with prefix caching on.

This is the engine-side twin of the simulator: it sends the same requests to
vLLM 0.32 and reads back how many prompt tokens each one found in the prefix
cache (``RequestOutput.num_cached_tokens``). The engine comes from
:mod:`vllm_admission.engine.llm`.

Only :class:`ReplayResult` and the pure helpers are usable without vLLM
installed; :func:`replay` imports vLLM lazily.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from vllm_admission.core.errors import UserError
from vllm_admission.engine.engine_geometry import EngineGeometry
from vllm_admission.engine.llm import PrefillStepCounter, engine_geometry, prefix_cache_counters

if TYPE_CHECKING:  # pragma: no cover
    import vllm

__all__ = [
    "SEQUENTIAL_MODE",
    "TIMED_MODE",
    "ReplayResult",
    "Req",
    "blocks_needed",
    "replay",
]

SEQUENTIAL_MODE = "sequential: one request at a time, in trace order"
TIMED_MODE = "timed: each request submitted at its trace arrival time x time_scale; requests overlap"

_MODES = {"sequential": SEQUENTIAL_MODE, "timed": TIMED_MODE}


class Req(Protocol):
    """What :func:`replay` needs from a request (``vllm_admission.core.traces.Request`` fits)."""

    @property
    def request_id(self) -> str: ...

    @property
    def prompt_len(self) -> int: ...

    @property
    def output_len(self) -> int: ...

    @property
    def arrival_s(self) -> float | None: ...

    def token_ids(self, vocab_size: int) -> list[int]: ...


@dataclass
class ReplayResult:
    """Outcome of :func:`replay`.

    Attributes:
        requests: one dict per input request, in input order, with
            ``request_id``, ``prompt_tokens`` (int), ``output_len`` (tokens
            asked for), ``cached_tokens`` (prompt tokens served from the
            prefix cache, ``RequestOutput.num_cached_tokens``; ``None`` when
            skipped), ``output_tokens`` (generated token ids; ``[]`` when
            skipped), ``prefill_seconds`` (engine-core time from the request's
            first scheduling to its first token, from vLLM's request metrics;
            ``None`` when skipped or unavailable), ``prefill_steps`` (engine
            steps that scheduled prompt tokens for it: its prefill chunks, see
            :class:`~vllm_admission.engine.llm.PrefillStepCounter`; ``None``
            when skipped or when the engine core runs in another process),
            ``submitted_s`` (seconds after the replay start when it was
            handed to the engine), ``finished_s`` (seconds after the start
            when its output came back) and ``status`` (``"ok"`` or
            ``"skipped: <reason>"``).
        prompt_tokens: sum of prompt tokens over the requests that ran.
        hit_tokens: sum of ``cached_tokens`` over the requests that ran.
        token_hit_rate: ``hit_tokens / prompt_tokens`` (0.0 when nothing ran).
        skipped: reason -> number of requests skipped for it.
        wall_seconds: wall-clock seconds spent in the replay loop.
        prefill_seconds: sum of the requests' ``prefill_seconds``.
        prefill_steps: sum of the requests' ``prefill_steps`` (``None`` when
            the engine core runs in another process).
        mode: how requests were submitted, in words.
        engine_prefix_cache_hits: change of vLLM's ``vllm:prefix_cache_hits``
            counter over the replay, in tokens (``None`` if unavailable).
        engine_prefix_cache_queries: change of ``vllm:prefix_cache_queries``
            over the replay, in tokens (``None`` if unavailable). vLLM counts
            a request's full length (prompt) as queried.
    """

    requests: list[dict[str, Any]]
    prompt_tokens: int
    hit_tokens: int
    token_hit_rate: float
    skipped: dict[str, int]
    wall_seconds: float
    mode: str
    prefill_seconds: float = 0.0
    prefill_steps: int | None = None
    engine_prefix_cache_hits: int | None = None
    engine_prefix_cache_queries: int | None = None


# ---------------------------------------------------------------- accounting


def blocks_needed(prompt_len: int, output_len: int, geometry: EngineGeometry) -> int:
    """Pool blocks one request holds at its peak on the engine described by ``geometry``
    (:func:`~vllm_admission.engine.llm.engine_geometry`):
    :func:`vllm_admission.core.geometry.blocks_needed` with the engine's group counts. When
    the groups are unknown (engine core in another process) one attention group and one
    Mamba group are assumed.

    Raises:
        ValueError: non-positive lengths.
    """
    from vllm_admission.core.geometry import blocks_needed as core_blocks_needed

    kinds = geometry.group_kinds or ("attention", "state")
    states = sum(kind == "state" for kind in kinds)
    return core_blocks_needed(prompt_len, output_len, block_size=geometry.block_size,
                              num_attention_groups=len(kinds) - states, num_state_groups=states,
                              mamba_cache_mode=geometry.mamba_cache_mode or "none",
                              hash_block_size=geometry.prefix_match_unit,
                              async_scheduling=geometry.async_scheduling)


def _skip_reason(prompt_len: int, output_len: int, geometry: EngineGeometry) -> str | None:
    total = prompt_len + output_len
    if prompt_len <= 0:
        return "empty prompt"
    if output_len <= 0:
        return "output_len < 1"
    if total > geometry.max_model_len:
        return "longer than max_model_len"
    usable = geometry.num_gpu_blocks - 1 if geometry.num_gpu_blocks else None
    if usable is not None and blocks_needed(prompt_len, output_len, geometry) > usable:
        return "needs more KV blocks than the pool holds"
    return None


# ---------------------------------------------------------------- replay


def replay(
    llm: vllm.LLM,
    requests: Iterable[Req],
    *,
    vocab_size: int,
    mode: str = "sequential",
    time_scale: float = 1.0,
    after_request: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Send ``requests`` through ``llm`` and record prefix-cache hits per request.

    Every request is sampled greedily (temperature 0) with
    ``max_tokens = output_len``, ``ignore_eos=True`` and no detokenization,
    so it produces exactly ``output_len`` tokens.

    * ``"sequential"``: one request at a time in input order (one
      ``llm.generate`` call each); each finishes before the next is sent.
    * ``"timed"``: request ``i`` is added to the engine
      (``llm.llm_engine.add_request``) once ``arrival_s * time_scale``
      seconds have passed since the start, while the engine steps; requests
      overlap whenever the engine is slower than the trace. Needs every
      request's ``arrival_s``.

    A request that cannot run is skipped before submission and counted in
    ``ReplayResult.skipped`` under its reason: prompt + output longer than
    the engine's ``max_model_len`` (``"longer than max_model_len"``), more
    pool blocks than the pool could ever hand out (see :func:`blocks_needed`;
    ``"needs more KV blocks than the pool holds"``), an empty prompt or
    ``output_len < 1``.

    Args:
        llm: an engine from :func:`build_llm` (any ``vllm.LLM`` with prefix
            caching and ``skip_tokenizer_init=True`` works).
        requests: objects with ``request_id``, ``prompt_len``, ``output_len``,
            ``arrival_s`` (seconds; ``"timed"`` only) and
            ``token_ids(vocab_size)``.
        vocab_size: passed to ``token_ids``; must not exceed the model's
            vocabulary (512 for the tiny model).
        mode: ``"sequential"`` or ``"timed"``.
        time_scale: multiplies arrival times in ``"timed"`` mode (0.1 replays
            ten times faster than the trace); must be >= 0.
        after_request: ``"sequential"`` only: called with the request's index
            after it finished (e.g. to let the plugin's tuner catch up).

    Returns:
        A :class:`ReplayResult`.

    Raises:
        UserError: for an unknown ``mode``, a non-positive ``vocab_size``, a
            negative ``time_scale``, or a request without ``arrival_s`` in
            ``"timed"`` mode.
        ValueError: a request whose ``token_ids`` length differs from
            ``prompt_len`` (the trace model's bug, not the input's).
    """
    if mode not in _MODES:
        raise UserError(f"unknown replay mode {mode!r}; known: {sorted(_MODES)}")
    if vocab_size <= 0:
        raise UserError(f"vocab_size must be positive, got {vocab_size}")
    if not time_scale >= 0:
        raise UserError(f"time_scale must be >= 0, got {time_scale}")
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    geometry = engine_geometry(llm)
    hits0, queries0 = prefix_cache_counters(llm)
    rows: list[dict[str, Any]] = []
    skipped: dict[str, int] = {}
    runnable: list[tuple[int, Any, list[int]]] = []
    for req in requests:
        prompt_len = int(req.prompt_len)
        output_len = int(req.output_len)
        row: dict[str, Any] = {
            "request_id": str(req.request_id),
            "prompt_tokens": prompt_len,
            "output_len": output_len,
            "cached_tokens": None,
            "output_tokens": [],
            "prefill_seconds": None,
            "prefill_steps": None,
            "submitted_s": None,
            "finished_s": None,
        }
        rows.append(row)
        reason = _skip_reason(prompt_len, output_len, geometry)
        if reason is not None:
            row["status"] = f"skipped: {reason}"
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        if mode == "timed" and getattr(req, "arrival_s", None) is None:
            raise UserError(f"request {req.request_id!r} has no arrival time; timed replay needs one")
        ids = list(req.token_ids(vocab_size))
        if len(ids) != prompt_len:
            raise ValueError(
                f"request {req.request_id!r}: token_ids gave {len(ids)} ids, prompt_len is {prompt_len}"
            )
        runnable.append((len(rows) - 1, req, ids))

    def params(output_len: int) -> SamplingParams:
        return SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True, detokenize=False)

    counter = PrefillStepCounter(llm) if geometry.inprocess else None
    t0 = time.perf_counter()
    try:
        if mode == "sequential":
            for i, (index, req, ids) in enumerate(runnable):
                rows[index]["submitted_s"] = time.perf_counter() - t0
                (out,) = llm.generate([TokensPrompt(prompt_token_ids=ids)],
                                      params(req.output_len), use_tqdm=False)
                _record(rows[index], out)
                rows[index]["finished_s"] = time.perf_counter() - t0
                if counter is not None:
                    # One request in the engine: every step counted is its own.
                    rows[index]["prefill_steps"] = sum(counter.take_all().values())
                if after_request is not None:
                    after_request(i)
        else:
            _run_timed(llm, runnable, rows, params, TokensPrompt, time_scale, t0, counter)
    finally:
        if counter is not None:
            counter.close()
    wall = time.perf_counter() - t0
    ran = [r for r in rows if r["status"] == "ok"]
    prompt_tokens = sum(r["prompt_tokens"] for r in ran)
    hit_tokens = sum(r["cached_tokens"] for r in ran)
    hits1, queries1 = prefix_cache_counters(llm)
    return ReplayResult(
        requests=rows,
        prompt_tokens=prompt_tokens,
        hit_tokens=hit_tokens,
        token_hit_rate=hit_tokens / prompt_tokens if prompt_tokens else 0.0,
        skipped=skipped,
        wall_seconds=wall,
        mode=_MODES[mode],
        prefill_seconds=sum(r["prefill_seconds"] or 0.0 for r in ran),
        prefill_steps=None if counter is None else sum(r["prefill_steps"] for r in ran),
        engine_prefix_cache_hits=None if hits0 is None or hits1 is None else hits1 - hits0,
        engine_prefix_cache_queries=None if queries0 is None or queries1 is None else queries1 - queries0,
    )


def _record(row: dict[str, Any], out: Any) -> None:
    """Fill ``row`` from a finished ``RequestOutput``."""
    row["cached_tokens"] = int(out.num_cached_tokens or 0)
    row["output_tokens"] = list(out.outputs[0].token_ids)
    m = getattr(out, "metrics", None)
    first, scheduled = getattr(m, "first_token_ts", 0.0), getattr(m, "scheduled_ts", 0.0)
    row["prefill_seconds"] = float(first - scheduled) if first and scheduled else None
    row["status"] = "ok"


def _run_timed(llm: Any, runnable: list, rows: list, params: Callable, prompt_cls: Any,
               time_scale: float, t0: float, counter: PrefillStepCounter | None) -> None:
    """Add requests at their scaled arrival times while stepping the engine."""
    engine = llm.llm_engine
    start = min((req.arrival_s for _, req, _ in runnable), default=0.0)
    due = [(req.arrival_s - start) * time_scale for _, req, _ in runnable]
    by_id: dict[str, int] = {}
    engine_ids: dict[int, str] = {}
    nxt = 0
    while nxt < len(runnable) or engine.has_unfinished_requests():
        now = time.perf_counter() - t0
        while nxt < len(runnable) and due[nxt] <= now:
            index, req, ids = runnable[nxt]
            rid = f"timed-{index}"
            by_id[rid] = index
            rows[index]["submitted_s"] = now
            # vLLM may suffix the id internally; outputs carry one or the other.
            engine_id = engine.add_request(rid, prompt_cls(prompt_token_ids=ids),
                                           params(req.output_len))
            by_id[engine_id] = index
            engine_ids[index] = engine_id
            nxt += 1
        if engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    index = by_id[out.request_id]
                    row = rows[index]
                    _record(row, out)
                    row["finished_s"] = time.perf_counter() - t0
                    if counter is not None:
                        row["prefill_steps"] = counter.take(engine_ids[index])
        elif nxt < len(runnable):
            time.sleep(max(0.0, min(due[nxt] - now, 0.05)))
