"""Trace files: the Mooncake JSONL reader, the project's token JSONL reader and writer,
and :func:`load_trace`, the one entry point for files and the synthetic workload.

The formats and every validation rule are described in ``docs/trace-format.md``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from vllm_admission.core.traces.prompts import SpanPrompt, TokenPrompt
from vllm_admission.core.traces.synthetic import SyntheticConfig, generate
from vllm_admission.core.traces.trace import Request, Trace, TraceError

__all__ = [
    "load_trace",
    "write_token_jsonl",
    "MOONCAKE_BLOCK_TOKENS",
    "SKIP_BEYOND_MAX_REQUESTS",
    "SKIP_OVER_MAX_PROMPT",
]

MOONCAKE_BLOCK_TOKENS = 512
SKIP_BEYOND_MAX_REQUESTS = "beyond max_requests"
SKIP_OVER_MAX_PROMPT = "prompt over max_prompt_tokens"

_MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
_TOKEN_FIELDS = ("prompt_token_ids", "output_len", "session_id", "timestamp", "request_id")

#: One line of a trace file: a JSON object as ``json.loads`` gives it (its values are
#: checked field by field).
_Record = dict[str, Any]


def load_trace(
    spec: str | os.PathLike[str],
    *,
    max_requests: int | None = None,
    max_prompt_tokens: int | None = None,
    seed: int = 0,
    mooncake_block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    **synthetic_params: Any,
) -> Trace:
    """Load a trace: ``"synthetic"`` for the generated workload, otherwise a JSONL file path.

    A file's format comes from its first record: a ``hash_ids`` field means Mooncake, a
    ``prompt_token_ids`` field means the project's token JSONL. ``seed`` and
    ``synthetic_params`` (the fields of :class:`SyntheticConfig`) apply to ``"synthetic"`` only.

    Filters, applied in file order: a request longer than ``max_prompt_tokens`` is skipped;
    of the rest the first ``max_requests`` are kept. Every skipped record is counted in
    ``Trace.skipped`` under :data:`SKIP_OVER_MAX_PROMPT` or :data:`SKIP_BEYOND_MAX_REQUESTS`.
    All lines are validated, kept or not.

    ``mooncake_block_tokens`` is how many tokens each Mooncake hash id stands for. The
    trace's own block is :data:`MOONCAKE_BLOCK_TOKENS` (512), and lines are checked against
    it; a smaller value shrinks every prompt in proportion (a full block becomes
    ``mooncake_block_tokens`` tokens, the last partial block ``ceil(len * s / 512)``) and
    keeps which blocks requests share. An engine on CPU cannot prefill the published lengths
    in useful time; ``mooncake_block_tokens=128`` maps one hash id to one 128-token engine
    block. The filters see the scaled lengths; ``output_length`` is not scaled.

    Raises TraceError for a missing file, a malformed line (``"<file>:<line>: field '<name>': ..."``),
    an unknown format, unknown synthetic parameters, or a trace left with no request.
    """
    _check_limit("max_requests", max_requests)
    _check_limit("max_prompt_tokens", max_prompt_tokens)
    _check_limit("mooncake_block_tokens", mooncake_block_tokens)
    if mooncake_block_tokens > MOONCAKE_BLOCK_TOKENS:
        raise TraceError(f"mooncake_block_tokens must be <= {MOONCAKE_BLOCK_TOKENS} (the trace's own "
                         f"block), got {mooncake_block_tokens}")
    if str(spec) == "synthetic":
        trace = generate(_synthetic_config(synthetic_params), seed)
    else:
        if synthetic_params:
            raise TraceError(
                f"synthetic parameters {sorted(synthetic_params)} only apply to load_trace('synthetic'), not to a file"
            )
        trace = _read_file(Path(spec), mooncake_block_tokens)
    if not trace.requests:
        raise TraceError(f"trace {trace.source} is empty: it has no records")
    _apply_filters(trace, max_requests, max_prompt_tokens)
    return trace


def _check_limit(name: str, value: int | None) -> None:
    if value is not None and (type(value) is not int or value < 1):
        raise TraceError(f"{name} must be None or an int >= 1, got {value!r}")


def _synthetic_config(params: dict[str, Any]) -> SyntheticConfig:
    known = {f.name for f in dataclasses.fields(SyntheticConfig)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise TraceError(f"unknown synthetic parameter(s) {unknown}; known: {', '.join(sorted(known))}")
    return SyntheticConfig(**params)


def _apply_filters(trace: Trace, max_requests: int | None, max_prompt_tokens: int | None) -> None:
    kept = trace.requests
    if max_prompt_tokens is not None:
        short = [r for r in kept if r.prompt_len <= max_prompt_tokens]
        if len(short) < len(kept):
            trace.skipped[SKIP_OVER_MAX_PROMPT] = len(kept) - len(short)
        kept = short
    if max_requests is not None and len(kept) > max_requests:
        trace.skipped[SKIP_BEYOND_MAX_REQUESTS] = len(kept) - max_requests
        kept = kept[:max_requests]
    if not kept:
        raise TraceError(f"no request of {trace.source} is left after the filters (skipped: {trace.skipped})")
    trace.requests = kept


# ---------------------------------------------------------------- reading files


def _read_file(path: Path, mooncake_block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> Trace:
    if not path.exists():
        raise TraceError(f"trace file not found: {path}")
    if not path.is_file():
        raise TraceError(f"trace path is not a file: {path}")
    with path.open("rb") as f:
        records = _json_records(f, str(path))
        first = next(records, None)
        if first is None:
            return Trace(name=f"file/{path.stem}", requests=[], source=str(path))
        where, rec = first
        parse: Callable[[str, _Record], Request]
        if "hash_ids" in rec:
            kind, parse = "mooncake", _MooncakeParser(mooncake_block_tokens)
        elif "prompt_token_ids" in rec:
            kind, parse = "tokens", _TokenParser()
        else:
            raise TraceError(
                f"{where}: cannot tell the trace format: a Mooncake record has 'hash_ids', a token record "
                f"has 'prompt_token_ids'; this one has {sorted(rec)}"
            )
        requests = [parse(where, rec)]
        requests.extend(parse(w, r) for w, r in records)
    return Trace(name=f"{kind}/{path.stem}", requests=requests, source=str(path))


def _json_records(lines: Iterator[bytes], file: str) -> Iterator[tuple[str, _Record]]:
    """Yield ``("<file>:<line>", object)`` for each non-blank line (UTF-8); blank lines are skipped."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{file}:{number}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
        except UnicodeDecodeError as e:
            raise TraceError(f"{where}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        if not isinstance(rec, dict):
            raise TraceError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        yield where, rec


def _bad(where: str, name: str, what: str) -> TraceError:
    return TraceError(f"{where}: field '{name}': {what}")


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_fields(where: str, rec: _Record, required: tuple[str, ...], known: tuple[str, ...]) -> None:
    for name in rec:
        if name not in known:
            raise _bad(where, name, f"unknown field (known fields: {', '.join(known)})")
    for name in required:
        if name not in rec:
            raise _bad(where, name, "missing")


def _int(where: str, rec: _Record, name: str, minimum: int) -> int:
    value = rec[name]
    if type(value) is not int:
        raise _bad(where, name, f"expected an integer, got {_short(value)}")
    if value < minimum:
        raise _bad(where, name, f"must be >= {minimum}, got {value}")
    return value


def _seconds(where: str, rec: _Record, name: str, scale: float) -> float:
    value = rec[name]
    if type(value) not in (int, float) or not math.isfinite(value):
        raise _bad(where, name, f"expected a finite number, got {_short(value)}")
    if value < 0:
        raise _bad(where, name, f"must be >= 0, got {value}")
    return float(value) * scale


def _int_list(where: str, rec: _Record, name: str) -> list[int]:
    value = rec[name]
    if type(value) is not list:
        raise _bad(where, name, f"expected a list of integers, got {_short(value)}")
    if value and (set(map(type, value)) != {int} or min(value) < 0):
        i, x = next((i, x) for i, x in enumerate(value) if type(x) is not int or x < 0)
        raise _bad(where, name, f"item {i} must be an integer >= 0, got {_short(x)}")
    return value


class _Monotone:
    """Arrival times must not go backwards (the requests stay in file order)."""

    def __init__(self) -> None:
        self.last: float | None = None
        self.last_where = ""

    def check(self, where: str, name: str, value: float) -> None:
        if self.last is not None and value < self.last:
            raise _bad(where, name, f"goes backwards ({value} after {self.last} at {self.last_where})")
        self.last, self.last_where = value, where


class _MooncakeParser:
    """One Mooncake record -> a Request with 512-token spans keyed by ``hash_ids``."""

    def __init__(self, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> None:
        self.clock = _Monotone()
        self.block_tokens = block_tokens

    def __call__(self, where: str, rec: _Record) -> Request:
        _check_fields(where, rec, _MOONCAKE_FIELDS, _MOONCAKE_FIELDS)
        arrival = _seconds(where, rec, "timestamp", 1e-3)
        self.clock.check(where, "timestamp", arrival)
        length = _int(where, rec, "input_length", 1)
        output = _int(where, rec, "output_length", 1)
        ids = _int_list(where, rec, "hash_ids")
        B = MOONCAKE_BLOCK_TOKENS
        if len(ids) != -(-length // B):
            need = -(-length // B)
            what = f"has {len(ids)} ids, but input_length {length} needs ceil({length}/{B}) = {need}"
            raise _bad(where, "hash_ids", what)
        S = self.block_tokens
        last = length - B * (len(ids) - 1)
        spans = list(zip(ids, itertools.repeat(S)))
        spans[-1] = (ids[-1], last if S == B else -(-last * S // B))
        line = where.rsplit(":", 1)[1]
        return Request(f"mooncake-{line}", SpanPrompt(tuple(spans)), output, arrival, None)


class _TokenParser:
    """One token JSONL record -> a Request with a TokenPrompt."""

    def __init__(self) -> None:
        self.clock = _Monotone()
        self.timed: tuple[bool, str] | None = None  # (first record has a timestamp, its location)
        self.ids: dict[str, str] = {}

    def __call__(self, where: str, rec: _Record) -> Request:
        _check_fields(where, rec, ("prompt_token_ids", "output_len"), _TOKEN_FIELDS)
        tokens = _int_list(where, rec, "prompt_token_ids")
        if not tokens:
            raise _bad(where, "prompt_token_ids", "is empty")
        output = _int(where, rec, "output_len", 1)
        rid = self._request_id(where, rec)
        arrival = self._arrival(where, rec)
        return Request(rid, TokenPrompt(tuple(tokens)), output, arrival, self._session(where, rec))

    def _request_id(self, where: str, rec: _Record) -> str:
        rid = rec.get("request_id")
        if rid is None:
            rid = f"line-{where.rsplit(':', 1)[1]}"
        elif type(rid) is not str or not rid:
            raise _bad(where, "request_id", f"expected a non-empty string, got {_short(rid)}")
        if rid in self.ids:
            raise _bad(where, "request_id", f"duplicate {rid!r} (first at {self.ids[rid]})")
        self.ids[rid] = where
        return rid

    def _arrival(self, where: str, rec: _Record) -> float | None:
        has = "timestamp" in rec
        if self.timed is None:
            self.timed = (has, where)
        elif has != self.timed[0]:
            state = "missing" if not has else "present"
            first = "has one" if self.timed[0] else "has none"
            what = f"{state}, but {self.timed[1]} {first} (give it on every line or on none)"
            raise _bad(where, "timestamp", what)
        if not has:
            return None
        arrival = _seconds(where, rec, "timestamp", 1.0)
        self.clock.check(where, "timestamp", arrival)
        return arrival

    @staticmethod
    def _session(where: str, rec: _Record) -> str | None:
        session = rec.get("session_id")
        if session is not None and type(session) is not str:
            raise _bad(where, "session_id", f"expected a string, got {_short(session)}")
        return session


# ---------------------------------------------------------------- writing


def write_token_jsonl(trace: Trace, path: str | os.PathLike[str], vocab_size: int) -> int:
    """Write ``trace`` as token JSONL (one line per request, in order) and return the line count.

    Each line has ``request_id``, ``prompt_token_ids`` (``Request.token_ids(vocab_size)``) and
    ``output_len``, plus ``session_id`` and ``timestamp`` (seconds) when the request has them.
    Raises TraceError when some requests have an arrival time and others not (the reader would
    refuse the file), ValueError when a token id does not fit ``vocab_size``.
    """
    timed = {r.arrival_s is not None for r in trace.requests}
    if len(timed) > 1:
        raise TraceError(f"trace {trace.name}: some requests have arrival times and some do not")
    count = 0
    with Path(path).open("w", encoding="utf-8") as f:
        for r in trace.requests:
            rec: dict[str, Any] = {"request_id": r.request_id}
            if r.session is not None:
                rec["session_id"] = r.session
            if r.arrival_s is not None:
                rec["timestamp"] = r.arrival_s
            rec["output_len"] = r.output_len
            rec["prompt_token_ids"] = r.token_ids(vocab_size)
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
            count += 1
    return count

