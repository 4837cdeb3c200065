"""Run setup, decided once: from a run's settings to what it serves with.

A run (a simulation of a trace, or a vLLM engine with the plugin) is set up by
the same few decisions, made here for both the simulator
(:func:`vllm_admission.sim.simulator.simulate`) and the plugin
(:class:`~vllm_admission.plugin.scheduler.AdmissionScheduler`, which hands the
plan to :class:`~vllm_admission.plugin.control.AdmissionControl`):

* which pairs the run may serve (``auto`` admission and/or eviction expand to
  their candidates, :func:`~vllm_admission.core.adaptive.candidate_policies`;
  the engine may then leave out candidates it cannot run) and the pair served
  first (:meth:`PolicyController.default_start
  <vllm_admission.core.adaptive.PolicyController.default_start>`);
* a fixed pair with a fixed alpha, a fixed pair whose alpha is tuned online
  (:func:`alpha_tuner`, whose window replay, :func:`window_replay`, is the one
  both use), or ``auto`` (:func:`controller_kwargs`: the arguments of the
  :class:`~vllm_admission.core.adaptive.PolicyController`, which the plugin may
  run in a child process);
* what the run needs for that: FLOP costs, FLOP values of freed blocks, an
  eviction policy object of its own instead of vLLM's order.

Pure Python: no vLLM, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_admission.core.adaptive import (
    AUTO,
    Pair,
    PolicyController,
    candidate_policies,
)
from vllm_admission.core.cache import HybridPrefixCache
from vllm_admission.core.cache_inputs import CacheRequest, CacheSetup, replay_requests
from vllm_admission.core.eviction import EvictionPolicy, eviction_class
from vllm_admission.core.layout import DEFAULT_CHECKPOINT, CacheLayout
from vllm_admission.core.settings import AutoSettings
from vllm_admission.core.tuning import AlphaTuner

__all__ = ["RunPlan", "alpha_tuner", "auto_run", "controller_kwargs", "window_replay"]


@dataclass(frozen=True)
class RunPlan:
    """The policy decisions of one run.

    Build it with :meth:`from_settings` (the user's names) or :meth:`of` (candidate
    lists an engine has narrowed).

    Attributes:
        admissions, evictions: the names the run may serve with (one each for a
            fixed pair).
        adaptive: whether a :class:`~vllm_admission.core.adaptive.PolicyController`
            chooses among them online (``auto``).
        alpha: the fixed alpha of a tunable eviction policy; ``None``: tuned
            online (fixed pair) or the policy's own start (``auto``).
        checkpoint: the checkpoint mode (``split``, ``inpass``); decides the
            start pair of ``auto``.
        start: the pair served first (a fixed run's only pair).
    """

    admissions: tuple[str, ...]
    evictions: tuple[str, ...]
    adaptive: bool
    alpha: float | None = None
    checkpoint: str = DEFAULT_CHECKPOINT
    start: Pair = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "admissions", tuple(self.admissions))
        object.__setattr__(self, "evictions", tuple(self.evictions))
        object.__setattr__(self, "start", PolicyController.default_start(
            self.admissions, self.evictions, self.checkpoint))

    @classmethod
    def from_settings(cls, admission: str, eviction: str, *, alpha: float | None = None,
                      checkpoint: str = DEFAULT_CHECKPOINT, sub_block: bool = False,
                      auto_admissions: Sequence[str] | None = None) -> RunPlan:
        """The plan for the names a user gives (either may be ``"auto"``);
        ``sub_block``: the engine hashes finer than the block; ``auto_admissions``:
        ``auto``'s admission candidates when the user names them
        (:func:`~vllm_admission.core.adaptive.candidate_policies`).

        Raises:
            UnknownPolicyError: an unknown name.
            UserError: an eviction policy that needs the future with ``auto``
                admission; ``auto_admissions`` that are invalid or beside a fixed
                admission policy.
        """
        admissions, evictions = candidate_policies(admission, eviction, sub_block=sub_block,
                                                   admissions=auto_admissions)
        return cls(admissions, evictions, AUTO in (admission, eviction), alpha, checkpoint)

    @classmethod
    def of(cls, admissions: Sequence[str], evictions: Sequence[str], *, adaptive: bool,
           alpha: float | None = None, checkpoint: str = DEFAULT_CHECKPOINT) -> RunPlan:
        """The plan for candidate lists (an engine's, after leaving out what it cannot run).

        With one pair left ``adaptive`` may be false: the run serves that pair fixed.
        """
        return cls(tuple(admissions), tuple(evictions), adaptive, alpha, checkpoint)

    # -- what the plan implies -----------------------------------------------------
    @property
    def eviction_cls(self) -> type[EvictionPolicy]:
        """The class of the eviction policy served first."""
        return eviction_class(self.start.eviction)

    @property
    def tunable(self) -> bool:
        """A fixed pair whose eviction policy has an alpha (``flop``)."""
        return not self.adaptive and self.eviction_cls.tunable

    @property
    def tuned(self) -> bool:
        """Whether an :class:`~vllm_admission.core.tuning.AlphaTuner` sets alpha online."""
        return self.tunable and self.alpha is None

    @property
    def start_alpha(self) -> float | None:
        """The alpha the eviction policy served first is built with: the fixed one,
        else 0 (where a tuner starts); ``None`` for a policy without alpha."""
        if not self.eviction_cls.tunable:
            return None
        return 0.0 if self.alpha is None else self.alpha

    @property
    def needs_flops(self) -> bool:
        """Whether the run needs the model's prefill FLOPs: ``auto`` (its scores),
        a policy that values blocks, or a tuner (its replays)."""
        return self.adaptive or self.eviction_cls.needs_values or self.tuned

    @property
    def reads_values(self) -> bool:
        """Whether an eviction policy the run may serve with reads FLOP values of
        freed blocks (``needs_values``; under ``auto``, any candidate)."""
        return any(eviction_class(e).needs_values for e in self.evictions)

    @property
    def own_eviction(self) -> bool:
        """Whether an engine orders free blocks by a policy object of its own
        (not in vLLM's order, or ``auto``, which may switch)."""
        return self.adaptive or not self.eviction_cls.vllm_order

    def setup(self, layout: CacheLayout, segment_flops: Callable[[int, int], float] | None,
              ) -> CacheSetup:
        """The :class:`~vllm_admission.core.cache_inputs.CacheSetup` of the start pair."""
        return CacheSetup(layout=layout, admission=self.start.admission,
                          eviction=self.start.eviction, segment_flops=segment_flops)


def window_replay(setup: CacheSetup, prefill_flops: Callable[[int, int], float],
                  ) -> Callable[[float, Sequence[tuple[int, CacheRequest]], Any], float]:
    """The alpha tuner's replay: ``f(alpha, window, snapshot) -> FLOPs saved``.

    ``window`` holds ``(index, request)`` pairs, consecutive in serving order;
    they are served with ``alpha`` on ``snapshot`` cloned (``None``: an empty
    cache of ``setup``), numbered from the first pair's index (the recency
    clock of the eviction policy).
    """
    def replay(alpha: float, window: Sequence[tuple[int, CacheRequest]], snapshot: Any) -> float:
        first = window[0][0]
        start = setup.build(alpha=alpha) if snapshot is None else snapshot.clone(alpha=alpha)
        return replay_requests(start, [req for _, req in window], prefill_flops=prefill_flops,
                               first_index=first).flops_saved

    return replay


def alpha_tuner(setup: CacheSetup, prefill_flops: Callable[[int, int], float], *,
                grid: tuple[float, ...], multiplier: int,
                snapshot: Callable[[], HybridPrefixCache] | None = None,
                retune_every: int | None = None) -> AlphaTuner:
    """An :class:`~vllm_admission.core.tuning.AlphaTuner` whose replays run ``setup``.

    Feed it ``(index, request)`` pairs. ``snapshot`` clones the live cache for
    re-tuning (the simulator); ``None`` tunes once, at bootstrap (the engine
    keeps no simulated twin of its cache).
    """
    return AlphaTuner(replay=window_replay(setup, prefill_flops), snapshot=snapshot,
                      grid=grid, multiplier=multiplier, retune_every=retune_every)


def controller_kwargs(plan: RunPlan, layout: CacheLayout,
                      prefill_flops: Callable[[int, int], float],
                      auto: AutoSettings | None = None) -> dict[str, Any]:
    """The arguments of ``PolicyController(live, **kwargs)`` for an ``auto`` run
    (they pickle, for a controller in a child process:
    :class:`~vllm_admission.core.shadows.ShadowProcess`).

    Args:
        auto: ``auto``'s settings (default: the defaults): the decision interval
            (``min_window``), the shadows' sample rate and the margin over stock
            (``stock_margin``).
    """
    auto = AutoSettings() if auto is None else auto
    return {"setup": plan.setup(layout, prefill_flops), "admissions": plan.admissions,
            "evictions": plan.evictions, "prefill_flops": prefill_flops, "start": plan.start,
            "min_window": auto.interval, "shadow_rate": auto.shadow_rate,
            "stock_margin": auto.margin}


def auto_run(plan: RunPlan, layout: CacheLayout, prefill_flops: Callable[[int, int], float],
             auto: AutoSettings | None = None) -> tuple[HybridPrefixCache, PolicyController]:
    """The live cache of an ``auto`` run (built switchable, serving ``plan.start``) and the
    controller that switches it: what the simulator replays a trace with, and the twin the
    scheduler tests compare the engine to. Serve each request on the cache, then hand it to
    :meth:`PolicyController.observe <vllm_admission.core.adaptive.PolicyController.observe>`.
    """
    cache = plan.setup(layout, prefill_flops).build(switchable=True, track_values=plan.reads_values)
    return cache, PolicyController(cache, **controller_kwargs(plan, layout, prefill_flops, auto))
