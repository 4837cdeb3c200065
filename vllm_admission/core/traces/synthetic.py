"""A seeded synthetic workload: chat sessions, few-shot templates and agent loops, interleaved.

Every prompt is a :class:`SpanPrompt`; span keys come from one counter, so a key is shared
only where content really is shared (a system prompt, a few-shot template, an agent's long
context, or a session's own history). ``random.Random(seed)`` is the only source of
randomness: the same config and seed give the same trace in any process.

The distributions and defaults are listed in ``docs/trace-format.md`` ("Synthetic workload").
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from dataclasses import dataclass
from typing import Any, NamedTuple

from vllm_admission.core.traces.prompts import SpanPrompt
from vllm_admission.core.traces.trace import Request, Trace, TraceError

__all__ = ["LogNormal", "SyntheticConfig", "generate"]


class LogNormal(NamedTuple):
    """A length in tokens: lognormal with the given ``median`` and ``sigma`` (of the log),
    rounded and clipped to ``[lo, hi]``."""

    median: float
    sigma: float
    lo: int
    hi: int

    def draw(self, rng: random.Random) -> int:
        value = round(rng.lognormvariate(math.log(self.median), self.sigma))
        return min(self.hi, max(self.lo, value))


@dataclass(frozen=True)
class SyntheticConfig:
    """Parameters of :func:`generate`; each is also a keyword of ``load_trace("synthetic", ...)``.

    Fractions are of requests and must sum to 1. Lengths are in tokens, times in seconds.
    A 4-tuple ``(median, sigma, lo, hi)`` is accepted wherever a :class:`LogNormal` is expected.
    Raises TraceError for an invalid value.
    """

    num_requests: int = 2000
    chat_fraction: float = 0.5
    fewshot_fraction: float = 0.2
    agent_fraction: float = 0.3
    request_rate: float = 2.0  # mean requests per second over the whole trace
    max_prompt_len: int = 32768  # a session stops before a turn whose prompt would be longer
    # chat: a system prompt from a Zipf-popular pool, then user message / model output turns
    num_system_prompts: int = 8
    system_prompt_zipf: float = 1.1
    system_prompt_len: LogNormal = LogNormal(1200, 0.5, 200, 4000)
    chat_turns_mean: float = 5.0
    chat_turns_max: int = 20
    user_message_len: LogNormal = LogNormal(150, 1.0, 8, 4000)
    chat_output_len: LogNormal = LogNormal(250, 0.8, 1, 2048)
    chat_think_s: float = 30.0
    # few-shot: a Zipf-popular shared template, then one unique query
    num_templates: int = 6
    template_zipf: float = 1.1
    template_len: LogNormal = LogNormal(2500, 0.5, 500, 8000)
    fewshot_query_len: LogNormal = LogNormal(120, 0.8, 8, 1000)
    fewshot_output_len: LogNormal = LogNormal(60, 1.0, 1, 512)
    # agent loops: a long shared context and a task, then steps that append output + tool result
    num_agent_contexts: int = 4
    agent_context_zipf: float = 1.0
    agent_context_len: LogNormal = LogNormal(10000, 0.4, 3000, 24000)
    agent_task_len: LogNormal = LogNormal(200, 0.7, 16, 2000)
    agent_steps_mean: float = 8.0
    agent_steps_max: int = 30
    tool_output_len: LogNormal = LogNormal(600, 1.0, 16, 8000)
    agent_output_len: LogNormal = LogNormal(120, 0.7, 1, 1024)
    agent_step_gap_s: float = 4.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if isinstance(f.default, LogNormal):
                object.__setattr__(self, f.name, _lognormal(f.name, getattr(self, f.name)))
        _require(type(self.num_requests) is int and self.num_requests >= 1, "num_requests must be an int >= 1")
        fractions = (self.chat_fraction, self.fewshot_fraction, self.agent_fraction)
        _require(all(_is_number(x) and x >= 0 for x in fractions), "the *_fraction parameters must be numbers >= 0")
        _require(abs(sum(fractions) - 1) < 1e-9, f"chat/fewshot/agent fractions must sum to 1, got {sum(fractions)}")
        _require(_is_number(self.request_rate) and self.request_rate > 0, "request_rate must be a number > 0")
        ints = ("max_prompt_len", "num_system_prompts", "num_templates", "num_agent_contexts",
                "chat_turns_max", "agent_steps_max")
        for name in ints:
            value = getattr(self, name)
            _require(type(value) is int and value >= 1, f"{name} must be an int >= 1, got {value!r}")
        at_least = {"system_prompt_zipf": 0, "template_zipf": 0, "agent_context_zipf": 0, "chat_think_s": 0,
                    "agent_step_gap_s": 0, "chat_turns_mean": 1, "agent_steps_mean": 1}
        for name, low in at_least.items():
            value = getattr(self, name)
            _require(_is_number(value) and value >= low, f"{name} must be a number >= {low}, got {value!r}")

    def changed(self) -> dict[str, object]:
        """The parameters that differ from the defaults, in field order."""
        default = SyntheticConfig()
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }


def _is_number(value: object) -> bool:
    return (type(value) is int or type(value) is float) and math.isfinite(value)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise TraceError(f"SyntheticConfig: {message}")


def _lognormal(name: str, value: Any) -> LogNormal:
    # ``value`` is what the caller gave (a LogNormal, a 4-tuple, or anything else): a
    # TypeError from unpacking it is the check.
    try:
        dist = LogNormal(*value)
    except TypeError:
        raise TraceError(f"SyntheticConfig: {name} must be (median, sigma, lo, hi), got {value!r}") from None
    ok = (
        _is_number(dist.median) and dist.median > 0 and _is_number(dist.sigma) and dist.sigma >= 0
        and type(dist.lo) is int and type(dist.hi) is int and 1 <= dist.lo <= dist.hi
    )
    _require(ok, f"{name} needs median > 0, sigma >= 0 and ints 1 <= lo <= hi, got {value!r}")
    return dist


class _Turn(NamedTuple):
    spans: tuple[tuple[int, int], ...]
    output_len: int
    gap_s: float  # seconds after the previous turn of the session (0 for the first)
    output_key: int  # the span key of this turn's output (the next turn's prompt holds it)


class _Session(NamedTuple):
    session_id: str
    turns: list[_Turn]


class _Builder:
    """Draws sessions of each kind from one Random, sharing one key counter and the pools."""

    def __init__(self, cfg: SyntheticConfig, rng: random.Random) -> None:
        self.cfg, self.rng = cfg, rng
        self.keys = itertools.count(1)
        self.system_prompts = self._pool(cfg.num_system_prompts, cfg.system_prompt_len, cfg.system_prompt_zipf)
        self.templates = self._pool(cfg.num_templates, cfg.template_len, cfg.template_zipf)
        self.contexts = self._pool(cfg.num_agent_contexts, cfg.agent_context_len, cfg.agent_context_zipf)

    def _pool(self, n: int, dist: LogNormal, zipf: float) -> tuple[list[tuple[int, int]], list[float]]:
        spans = [(next(self.keys), dist.draw(self.rng)) for _ in range(n)]
        return spans, [1 / (rank + 1) ** zipf for rank in range(n)]

    def _pick(self, pool: tuple[list[tuple[int, int]], list[float]]) -> tuple[int, int]:
        spans, weights = pool
        return self.rng.choices(spans, weights)[0]

    def _count(self, mean: float, cap: int) -> int:
        """1 + a geometric number of further turns, so the mean is ``mean`` before the cap."""
        n, p_more = 1, 1 - 1 / mean
        while n < cap and self.rng.random() < p_more:
            n += 1
        return n

    def _span(self, dist: LogNormal) -> tuple[int, int]:
        return next(self.keys), dist.draw(self.rng)

    def _grow(self, spans: list[tuple[int, int]], wanted: int, added: LogNormal, output: LogNormal,
              gap_s: float) -> list[_Turn]:
        """Emit up to ``wanted`` turns starting from ``spans``; after each turn append its output
        span and a new span drawn from ``added`` (the next user message or tool result)."""
        turns: list[_Turn] = []
        gap = 0.0
        while True:
            out = output.draw(self.rng)
            out_key = next(self.keys)
            turns.append(_Turn(tuple(spans), out, gap, out_key))
            if len(turns) >= wanted:
                return turns
            spans += [(out_key, out), self._span(added)]
            if sum(length for _, length in spans) > self.cfg.max_prompt_len:
                return turns
            gap = self.rng.expovariate(1 / gap_s) if gap_s > 0 else 0.0

    def chat(self, budget: int) -> list[_Turn]:
        cfg = self.cfg
        spans = [self._pick(self.system_prompts), self._span(cfg.user_message_len)]
        wanted = min(budget, self._count(cfg.chat_turns_mean, cfg.chat_turns_max))
        return self._grow(spans, wanted, cfg.user_message_len, cfg.chat_output_len, cfg.chat_think_s)

    def fewshot(self, budget: int) -> list[_Turn]:
        cfg = self.cfg
        spans = [self._pick(self.templates), self._span(cfg.fewshot_query_len)]
        return [_Turn(tuple(spans), cfg.fewshot_output_len.draw(self.rng), 0.0, next(self.keys))]

    def agent(self, budget: int) -> list[_Turn]:
        cfg = self.cfg
        spans = [self._pick(self.contexts), self._span(cfg.agent_task_len)]
        wanted = min(budget, self._count(cfg.agent_steps_mean, cfg.agent_steps_max))
        return self._grow(spans, wanted, cfg.tool_output_len, cfg.agent_output_len, cfg.agent_step_gap_s)


def _split(total: int, fractions: tuple[float, ...]) -> list[int]:
    """Integer counts summing to ``total`` in proportion to ``fractions`` (largest remainder)."""
    exact = [total * f for f in fractions]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: counts[i] - exact[i])
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def generate(config: SyntheticConfig, seed: int) -> Trace:
    """Generate ``config.num_requests`` requests (exactly) of a chat/few-shot/agent mix.

    Sessions start as a Poisson process, in shuffled order, at a rate that makes the overall
    request rate ``config.request_rate``; later turns follow after exponential gaps, so turns
    of one session are interleaved with other requests. Requests are sorted by arrival.
    Request ids are ``"<session>-<turn>"``; sessions are ``"chat-<i>"``, ``"fewshot-<i>"``,
    ``"agent-<i>"``. Returns a Trace named ``"synthetic(seed=<seed>[, changed params])"``.
    """
    rng = random.Random(seed)
    builder = _Builder(config, rng)
    kinds = (("chat", builder.chat), ("fewshot", builder.fewshot), ("agent", builder.agent))
    fractions = (config.chat_fraction, config.fewshot_fraction, config.agent_fraction)
    sessions: list[_Session] = []
    for (kind, make), count in zip(kinds, _split(config.num_requests, fractions), strict=True):
        made = 0
        for index in itertools.count():
            if made >= count:
                break
            turns = make(count - made)
            sessions.append(_Session(f"{kind}-{index}", turns))
            made += len(turns)
    rng.shuffle(sessions)
    return Trace(name=_name(config, seed), requests=_schedule(sessions, config, rng), source="synthetic")


def _schedule(sessions: list[_Session], cfg: SyntheticConfig, rng: random.Random) -> list[Request]:
    session_rate = cfg.request_rate * len(sessions) / cfg.num_requests
    start = 0.0
    timed: list[tuple[float, int, int, Request]] = []
    for order, session in enumerate(sessions):
        if order:
            start += rng.expovariate(session_rate)
        at = start
        for index, turn in enumerate(session.turns):
            at += turn.gap_s
            rid = f"{session.session_id}-{index}"
            req = Request(rid, SpanPrompt(turn.spans), turn.output_len, at, session.session_id,
                          output_key=turn.output_key)
            timed.append((at, order, index, req))
    timed.sort(key=lambda item: item[:3])
    return [item[3] for item in timed]


def _name(config: SyntheticConfig, seed: int) -> str:
    params = "".join(f", {k}={v!r}" for k, v in config.changed().items())
    return f"synthetic(seed={seed}{params})"
