"""The plugin's per-engine metrics (no vLLM import)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from vllm_admission.core.counters import CacheCounters

__all__ = ["AdmissionStats"]


@dataclass(kw_only=True)
class AdmissionStats(CacheCounters):
    """Cumulative metrics of one engine's :class:`AdmissionScheduler` since it started.

    The counters are the core's :class:`~vllm_admission.core.counters.CacheCounters`,
    the simulator's names and definitions, counted over first admissions as vLLM's
    prefix-cache counters (``vllm:prefix_cache_queries`` / ``_hits``) count them: a
    request admitted again after a preemption, or one that skips the prefix-cache
    lookup, is left out
    (:func:`~vllm_admission.plugin.translate.counts_in_prefix_cache_stats`), so
    ``hit_tokens / prompt_tokens`` and vLLM's hit rate have the same denominator.
    Under a KV connector ``hit_tokens`` is vLLM's ``num_cached_tokens``, the tokens the
    connector loaded included; ``host_hit_tokens`` is that part (a host tier's loads with
    the ``OffloadingConnector``), which vLLM's ``vllm:prefix_cache_hits`` leaves out.
    ``state_checkpoints`` does not count tentative sequence-end states that a later one
    of the same request replaced (``marconi``), nor under EAGLE/MTP the latest one dropped
    when the request finished (the end lags a block); ``superseded`` counts those.

    Attributes:
        active: ``False`` when the scheduler runs stock (prefix caching off,
            no recurrent or no attention layers); every count is then 0.
        admission: admission policy name.
        eviction: eviction policy name.
        alpha: the current alpha of a tunable eviction policy (``flop``);
            ``None`` for the others.
        superseded: tentative sequence-end states dropped that way.
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
    superseded: int = 0
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
                f"state_checkpoints={self.state_checkpoints} hit_requests={self.hit_requests} "
                f"hit_tokens={self.hit_tokens}/{self.prompt_tokens}"
                f"{f' (host {self.host_hit_tokens})' if self.host_hit_tokens else ''} "
                f"state_miss_tokens={self.state_miss_tokens} "
                f"evictions={self.evictions} ({groups}) "
                f"free_blocks={self.free_blocks}/{self.usable_blocks}")
