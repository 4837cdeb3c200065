"""The plugin's per-engine metrics (no vLLM import)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["AdmissionStats"]


@dataclass(frozen=True)
class AdmissionStats:
    """Cumulative metrics of one engine's :class:`AdmissionScheduler` since it started.

    Counts are events; lengths are tokens. The request and token counters
    count a request's first admission only, as vLLM's prefix-cache counters
    (``vllm:prefix_cache_queries`` / ``_hits``) do: a request admitted again
    after a preemption, or one that skips the prefix-cache lookup, is left out
    (:func:`~vllm_admission.plugin.translate.counts_in_prefix_cache_stats`), so
    ``tokens_saved / prompt_tokens`` and vLLM's hit rate have the same
    denominator.

    Attributes:
        active: ``False`` when the scheduler runs stock (prefix caching off,
            no recurrent or no attention layers); every count is then 0.
        admission: admission policy name.
        eviction: eviction policy name.
        alpha: the current alpha of a tunable eviction policy (``flop``);
            ``None`` for the others.
        requests: requests admitted into the running batch after a prefix
            lookup.
        prompt_tokens: prompt tokens of those requests.
        junctions: admitted requests whose attention-KV hit ran past their
            hybrid hit (a shared prefix without a state: Marconi's signal).
        checkpoints: recurrent-state positions given a block hash (cached) in
            the first state group, minus tentative sequence-end states that a
            later one of the same request replaced (``marconi``).
        superseded: tentative sequence-end states dropped that way.
        state_hits: admitted requests with a hybrid hit > 0.
        tokens_saved: sum of the hybrid hits of admitted requests (prompt
            tokens served from the cache; vLLM's ``num_cached_tokens``).
        state_miss_tokens: sum over admitted requests of their attention-KV
            hit minus their hybrid hit: prompt tokens whose attention KV blocks
            were all cached but which were recomputed because no recurrent
            state was kept at their end (whole blocks;
            :attr:`HitProbe.state_miss
            <vllm_admission.core.admission.HitProbe.state_miss>`; the
            simulator's ``state_miss_tokens``).
        evictions: cached blocks whose hash was dropped to reuse the block.
        evictions_by_group: ``evictions`` per KV cache group, keyed
            ``"<kind><group index>"`` (``"state0"``, ``"attention1"``).
        free_blocks: blocks free now (uncached plus evictable).
        usable_blocks: blocks in the pool minus vLLM's null block.
        tuning: alpha tuning decisions so far, each
            ``{"at", "window", "alpha", "kind"}``.
        adaptive: whether ``auto`` chooses the pair online.
        policy_switches: ``auto``'s switches so far, each ``{"at", "window",
            "from", "to", "scores"}`` (``at``: index of the finished request
            after which the switch was decided).
    """

    active: bool
    admission: str
    eviction: str
    alpha: float | None = None
    requests: int = 0
    prompt_tokens: int = 0
    junctions: int = 0
    checkpoints: int = 0
    superseded: int = 0
    state_hits: int = 0
    tokens_saved: int = 0
    state_miss_tokens: int = 0
    evictions: int = 0
    evictions_by_group: dict[str, int] = field(default_factory=dict)
    free_blocks: int = 0
    usable_blocks: int = 0
    tuning: list[dict[str, Any]] = field(default_factory=list)
    adaptive: bool = False
    policy_switches: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy."""
        return asdict(self)

    def summary(self) -> str:
        """One log line."""
        groups = " ".join(f"{k}={v}" for k, v in self.evictions_by_group.items())
        alpha = "" if self.alpha is None else f" alpha={self.alpha:g}"
        auto = f" (auto, {len(self.policy_switches)} switches)" if self.adaptive else ""
        return (f"admission={self.admission} eviction={self.eviction}{alpha}{auto} "
                f"requests={self.requests} junctions={self.junctions} "
                f"checkpoints={self.checkpoints} state_hits={self.state_hits} "
                f"tokens_saved={self.tokens_saved}/{self.prompt_tokens} "
                f"state_miss_tokens={self.state_miss_tokens} "
                f"evictions={self.evictions} ({groups}) "
                f"free_blocks={self.free_blocks}/{self.usable_blocks}")
