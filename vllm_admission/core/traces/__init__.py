"""Trace readers, the synthetic workload and the request/prompt data model.

``load_trace("synthetic")`` or ``load_trace(path)`` gives a :class:`Trace` of
:class:`Request` objects whose prompts hash into vLLM-style chained block hashes at any
block size. Formats and rules: ``docs/trace-format.md``.
"""

from vllm_admission.core.traces.prompts import Prompt, SpanPrompt, TokenPrompt, span_token
from vllm_admission.core.traces.readers import (
    MOONCAKE_BLOCK_TOKENS,
    SKIP_BEYOND_MAX_REQUESTS,
    SKIP_OVER_MAX_PROMPT,
    load_trace,
    write_token_jsonl,
)
from vllm_admission.core.traces.synthetic import LogNormal, SyntheticConfig, generate
from vllm_admission.core.traces.trace import PrefixReuse, Request, Trace, TraceError

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "SKIP_BEYOND_MAX_REQUESTS",
    "SKIP_OVER_MAX_PROMPT",
    "LogNormal",
    "PrefixReuse",
    "Prompt",
    "Request",
    "SpanPrompt",
    "SyntheticConfig",
    "TokenPrompt",
    "Trace",
    "TraceError",
    "generate",
    "load_trace",
    "span_token",
    "write_token_jsonl",
]
