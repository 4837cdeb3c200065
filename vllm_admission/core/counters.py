"""The counters every run reports, under one set of names.

The simulator's records (:class:`~vllm_admission.sim.simulator.RunResult`), the core's
replay sums (:class:`~vllm_admission.core.cache_inputs.ReplayTotals`) and the plugin's
``AdmissionScheduler.stats()``
(:class:`~vllm_admission.plugin.metrics.stats.AdmissionStats`) all extend
:class:`CacheCounters`, so a quantity has one name and one definition wherever it is
read. (The plugin's Prometheus metrics keep their published names; the plugin's
metrics module maps them.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CacheCounters", "TokenHitRate", "ratio"]


@dataclass(kw_only=True)
class CacheCounters:
    """Cumulative counts over the requests served. Counts are events; lengths are tokens.

    Attributes:
        requests: requests served after a prefix lookup (the simulator: requests that
            ran; the engine: first admissions into the running batch, as vLLM's
            ``vllm:prefix_cache_queries`` counts them).
        prompt_tokens: prompt tokens of those requests.
        hit_tokens: their hybrid prefix hits summed: prompt tokens served from the cache
            (vLLM's ``num_cached_tokens``).
        hit_requests: those of them with a hybrid hit > 0.
        state_miss_tokens: their attention-KV hit minus their hybrid hit, summed: prompt
            tokens whose attention KV blocks were all cached but which were recomputed
            because no recurrent state was kept at their end (whole blocks;
            :attr:`HitProbe.state_miss <vllm_admission.core.admission.HitProbe.state_miss>`).
        junctions: requests whose attention-KV hit ran past their hybrid hit (a shared
            prefix without a state: Marconi's admission signal, section 4.1).
        state_checkpoints: recurrent-state positions admitted into the prefix cache
            (given a block hash in the first state group), each position once.
        evictions: cached blocks whose hash was dropped to reuse the block.
        evictions_by_group: ``evictions`` per KV cache group, keyed
            ``"<kind><group index>"`` (``"state0"``, ``"attention1"``).
        host_hit_tokens: the part of ``hit_tokens`` loaded from a host tier (vLLM's
            ``OffloadingConnector``: ``vllm:prompt_tokens_cached_by_source{source="host"}``).
        prefill_steps: prefill chunks: engine steps that scheduled a request's prompt
            tokens, summed over requests (the simulator predicts them for requests run one
            at a time; the engine counts them as they run, a preempted request's
            recomputation included).
    """

    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    hit_requests: int = 0
    state_miss_tokens: int = 0
    junctions: int = 0
    state_checkpoints: int = 0
    evictions: int = 0
    evictions_by_group: dict[str, int] = field(default_factory=dict)
    prefill_steps: int = 0
    host_hit_tokens: int = 0

    def count_request(self, prompt_tokens: int, hit_tokens: int, state_miss_tokens: int) -> None:
        """Add one served request's prompt length, hybrid hit and state-miss tokens."""
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        self.hit_tokens += hit_tokens
        self.hit_requests += hit_tokens > 0
        self.state_miss_tokens += state_miss_tokens


def ratio(a: float, b: float) -> float:
    """``a / b``, 0.0 when ``b`` is 0 (a hit rate over no requests)."""
    return a / b if b else 0.0


class TokenHitRate:
    """Gives a result with ``hit_tokens`` and ``prompt_tokens`` its ``token_hit_rate``
    (a base class for the bounds' answers, which are not counters)."""

    hit_tokens: float
    prompt_tokens: int

    @property
    def token_hit_rate(self) -> float:
        """``hit_tokens / prompt_tokens`` (0 without prompt tokens)."""
        return ratio(self.hit_tokens, self.prompt_tokens)
