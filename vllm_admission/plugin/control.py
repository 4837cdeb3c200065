"""Per-engine admission/eviction state: vLLM events in, core policy calls out.

:class:`AdmissionControl` is what the vLLM adapters (``scheduler.py``,
``kv_cache.py``, ``boundary/hooks.py``) call: a thin facade over three parts, each
with one responsibility, built once from the core's run setup
(:class:`~vllm_admission.core.run.RunPlan`):

* :class:`~vllm_admission.plugin.requests.RequestTracker`: the live requests under
  the admission policy: lookup and chunk stops, which states are admitted, tentative
  states superseded, states handed to the host tier, request and checkpoint counters;
* :class:`~vllm_admission.plugin.policy_events.PolicyEvents`: the eviction policy:
  what it is told of vLLM's blocks (keys, hits, requests) and the FLOP values of the
  blocks it orders, on the request clock
  (:class:`~vllm_admission.plugin.policy_events.RequestClock`);
* :class:`~vllm_admission.plugin.background.BackgroundTuning`: the alpha tuner or
  ``auto``'s controller, fed finished requests off the scheduler loop.

The facade itself keeps what spans them: switching the admission policy, the request
that finishes (forgotten by the tracker, then fed to the tuner), and the metrics
snapshot (:meth:`AdmissionControl.stats`). vLLM's blocks and block hashes become the
core's keys through :mod:`~vllm_admission.plugin.translate`. It holds no tensors and
copies none: vLLM's model runner writes the states.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from typing import TYPE_CHECKING

from vllm_admission.core.adaptive import Decision, LiveEvictions
from vllm_admission.core.admission import get_admission
from vllm_admission.core.cache_inputs import CacheSetup
from vllm_admission.core.eviction import EvictionPolicy, get_eviction
from vllm_admission.core.layout import CacheLayout
from vllm_admission.core.run import RunPlan, alpha_tuner, controller_kwargs
from vllm_admission.core.settings import Settings
from vllm_admission.core.tuning import GRIDS, AlphaTuner
from vllm_admission.plugin.background import (
    BackgroundTuning,
    policy_controller,
)
from vllm_admission.plugin.metrics.stats import AdmissionStats
from vllm_admission.plugin.policy_events import BlockValueFn, PolicyEvents, RequestClock
from vllm_admission.plugin.requests import Drop, RequestTrack, RequestTracker

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_utils import BlockHash, KVCacheBlock
    from vllm.v1.request import Request

    from vllm_admission.plugin.free_queue import PolicyFreeBlockQueue

__all__ = ["AdmissionControl"]


class AdmissionControl:
    """Admission decisions, block values and metrics for one engine.

    Args:
        plan: the run's policy decisions (:class:`~vllm_admission.core.run.RunPlan`):
            it serves ``plan.start`` first; ``plan.adaptive`` chooses among
            ``plan.admissions`` x ``plan.evictions`` online (``auto``,
            :class:`~vllm_admission.core.adaptive.PolicyController`; the free
            queue is then always the plugin's, so that eviction can switch);
            ``plan.tuned`` tunes a ``tunable`` policy's alpha online.
        geometry: the engine's cache layout (the core's ``CacheLayout``).
        prefill_flops: ``f(num_tokens, num_cached) -> FLOPs``
            (``ModelCosts.prefill_flops``); required by ``auto``, by policies
            that ``needs_values`` and by the alpha tuner (``plan.needs_flops``).
        settings: the user's settings (:class:`~vllm_admission.core.settings.Settings`):
            the alpha tuner's (``tune_multiplier``, ``tune_grid``) and, with
            ``plan.adaptive``, ``auto``'s (``settings.auto``).
        clock: the recency clock of the eviction policy; default
            :meth:`request_clock`, the index of the latest request that arrived
            (requests, as the simulator's ``now``; wall seconds would make the
            utility's recency term, and so alpha, depend on engine speed).
        is_cached_state: ``f(block_hash, group) -> bool``: whether vLLM's pool
            holds a state block for that hash in that group (for the values of
            states below a request's hit).
        group_of: ``f(block) -> KV cache group index`` of a cached block
            (vLLM's ``get_group_id`` of its hash; the adapter binds it).
        tune_in_thread: run the tuner (or the controller) on a daemon thread
            (default; ``auto``'s shadow caches then run in a child process,
            :mod:`~vllm_admission.core.shadows`) or inline
            (:mod:`~vllm_admission.plugin.background`).

    Raises:
        UnknownPolicyError: unknown policy name.
        ValueError: a policy that needs the future (simulator only), or one
            that needs values without ``prefill_flops``.
    """

    def __init__(self, *, plan: RunPlan, geometry: CacheLayout,
                 prefill_flops: Callable[[int, int], float] | None = None,
                 settings: Settings | None = None,
                 clock: Callable[[], float] | None = None,
                 is_cached_state: Callable[[BlockHash, int], bool] | None = None,
                 group_of: Callable[[KVCacheBlock], int] | None = None,
                 tune_in_thread: bool = True) -> None:
        settings = Settings() if settings is None else settings
        policy, eviction = plan.start.admission, plan.start.eviction
        policy_cls = plan.eviction_cls
        if plan.adaptive and prefill_flops is None:
            raise ValueError("auto policy selection needs prefill_flops")
        if policy_cls.needs_future:
            raise ValueError(f"eviction {eviction!r} needs future knowledge: simulator only")
        if (policy_cls.needs_values or plan.tuned) and prefill_flops is None:
            raise ValueError(f"eviction {eviction!r} needs prefill_flops")
        self.plan = plan
        self.geometry = geometry
        self.prefill_flops = prefill_flops
        self.first_state = geometry.pool.state_groups[0]
        self._arrivals = RequestClock()
        self.clock = clock if clock is not None else self.request_clock
        #: Per-tier admission: the host tier's admission policy (states it keeps that
        #: the GPU policy does not are handed to the host tier, then dropped from the
        #: GPU cache), or ``None``. Only with a host tier in ``geometry``.
        pool = geometry.pool
        host_policy = (get_admission(geometry.host.admission)
                       if geometry.host.chunks and geometry.host.admission else None)
        self.requests = RequestTracker(
            get_admission(policy, retention_interval=pool.retention_interval), host_policy,
            block_size=pool.block_size, first_state=self.first_state,
            state_groups=pool.state_groups,
            partial_hash_block_size=pool.hash_block_size if pool.partial_hash_hits else None,
            eagle=geometry.speculation.uses_eagle)
        self.tune_multiplier = settings.tune_multiplier
        self.tune_grid = GRIDS[settings.tune_grid]
        controller = None
        if plan.adaptive:
            controller = policy_controller(
                # ignore: plan.adaptive without prefill_flops raised above
                controller_kwargs(plan, geometry, prefill_flops, settings.auto),  # type: ignore[arg-type]
                in_child=tune_in_thread, nice=settings.auto.shadow_nice)
        #: Whether an eviction policy this control may run (``auto``: any it may
        #: switch to) reads FLOP values. Only then must each freeing call open a
        #: free batch to value its blocks (``AdmissionCoordinator``); without values a
        #: block freed outside a free batch gets the same time, the request clock.
        self.reads_values = plan.reads_values
        #: ``auto``: builds the eviction policies it switches among, all sharing
        #: one hash history (:class:`~vllm_admission.core.adaptive.LiveEvictions`).
        self.live_evictions: LiveEvictions | None = None
        # eviction: None keeps vLLM's own free-block queue (a policy in vLLM's order).
        eviction_policy: EvictionPolicy | None = None
        if plan.own_eviction:
            options = {} if plan.start_alpha is None else {"alpha": plan.start_alpha}
            if plan.adaptive:
                self.live_evictions = LiveEvictions(plan.evictions)
                eviction_policy = self.live_evictions.make(eviction, **options)
            else:
                eviction_policy = get_eviction(eviction, **options)
        self.events = PolicyEvents(eviction_policy, eviction, layout=geometry,
                                   prefill_flops=prefill_flops, clock=self.clock)
        self.events.bind_pool(is_cached_state, group_of)
        self.background = BackgroundTuning(
            make_tuner=self._make_tuner if plan.own_eviction and plan.tuned else None,
            controller=controller, block_size=pool.block_size,
            hashes_per_block=pool.hashes_per_block, sub_block=pool.partial_hash_hits,
            prefill_flops=prefill_flops, in_thread=tune_in_thread)

    def bind_pool(self, is_cached_state: Callable[[BlockHash, int], bool],
                  group_of: Callable[[KVCacheBlock], int]) -> None:
        """Read vLLM's block pool through these (:meth:`PolicyEvents.bind_pool
        <vllm_admission.plugin.policy_events.PolicyEvents.bind_pool>`)."""
        self.events.bind_pool(is_cached_state, group_of)

    # -- policy ------------------------------------------------------------
    def set_policy(self, name: str) -> None:
        """Switch the admission policy between requests (tests, benchmarks).

        Raises:
            UnknownPolicyError: unknown name.
            RuntimeError: requests are still tracked (switch only when idle).
        """
        policy = get_admission(name, retention_interval=self.geometry.pool.retention_interval)
        if self.requests.tracks:
            raise RuntimeError(f"cannot switch admission policy with "
                               f"{len(self.requests.tracks)} live requests")
        self.requests.set_policy(policy)
        self.background.restart_tuner()  # its replays use the policy's name

    def set_eviction(self, policy: EvictionPolicy) -> None:
        """Order free blocks by ``policy`` (fresh) from now on (``auto``); the free
        queue hands its candidates over itself."""
        self.events.set_eviction(policy)

    def _make_tuner(self) -> AlphaTuner:
        # The engine tunes once per bootstrap window, as Marconi does: re-tuning
        # needs snapshots of a simulated twin of the live cache, which the
        # engine does not keep.
        setup = CacheSetup(layout=self.geometry, admission=self.requests.policy.name,
                           eviction=self.events.eviction, segment_flops=self.prefill_flops)
        # ignore: a tuned plan without prefill_flops raised in __init__
        return alpha_tuner(setup, self.prefill_flops, grid=self.tune_grid,  # type: ignore[arg-type]
                           multiplier=self.tune_multiplier)

    # -- arrivals and clock ----------------------------------------------------
    def on_arrival(self) -> None:
        """A request was added to the scheduler (``Scheduler.add_request``)."""
        self._arrivals.tick()

    def request_clock(self) -> float:
        """Index of the latest request that arrived (0-based; 0.0 before any)."""
        return self._arrivals()

    # -- requests (RequestTracker) -----------------------------------------------
    def on_lookup(self, request: Request, num_local: int, shared_prefix_boundary: int) -> int:
        """A prefix lookup ran for ``request``; returns the boundary to store
        (:meth:`RequestTracker.on_lookup
        <vllm_admission.plugin.requests.RequestTracker.on_lookup>`). A request's first
        lookup also tells the eviction policy its prompt (:meth:`PolicyEvents.on_request
        <vllm_admission.plugin.policy_events.PolicyEvents.on_request>`)."""
        if request.request_id not in self.requests.tracks:
            self.events.on_request(request)
        return self.requests.on_lookup(request, num_local, shared_prefix_boundary)

    def clip_chunk(self, request: Request, start: int, num_new_tokens: int) -> int:
        """End the chunk ``[start, start + n)`` at the policy's next stop inside it."""
        return self.requests.clip_chunk(request, start, num_new_tokens)

    def on_scheduled(self, num_scheduled_tokens: dict[str, int],
                     requests: dict[str, Request]) -> None:
        """Count the requests admitted and the prefill chunks of this step."""
        self.requests.on_scheduled(num_scheduled_tokens, requests)

    def track(self, request: Request) -> RequestTrack:
        """The request's track (made for a request never looked up)."""
        return self.requests.track(request)

    def decide(self, track: RequestTrack, first: int, last: int,
               blocks: Sequence[KVCacheBlock]) -> tuple[list[int], list[int], list[int]]:
        """``(admitted, tentative, host)`` state positions of blocks ``first .. last - 1``."""
        return self.requests.decide(track, first, last, blocks)

    def hand_off_only(self, track: RequestTrack, group: int, host: Sequence[int],
                      blocks: Sequence[KVCacheBlock], drop: Drop) -> None:
        """Drop the states cached for the host tier only from the GPU cache."""
        self.requests.hand_off_only(track, group, host, blocks, drop)

    def supersede(self, track: RequestTrack, group: int, tentative: Sequence[int],
                  blocks: Sequence[KVCacheBlock], drop: Drop) -> None:
        """Keep only the request's latest tentative state in ``group``."""
        self.requests.supersede(track, group, tentative, blocks, drop)

    def supersede_ahead(self, track: RequestTrack, group: int, known: int, reach: int,
                        blocks: Sequence[KVCacheBlock], drop: Drop) -> None:
        """Async scheduling: supersede where the synchronous scheduler would
        (:meth:`RequestTracker.supersede_ahead
        <vllm_admission.plugin.requests.RequestTracker.supersede_ahead>`)."""
        self.requests.supersede_ahead(track, group, known, reach, blocks, drop)

    def observe_cached(self, track: RequestTrack, blocks: Sequence[KVCacheBlock],
                       first: int, last: int) -> None:
        """States of the first state group that just got a block hash (any policy)."""
        self.requests.observe_cached(track, blocks, first, last)

    def observe_sub_block_state(self, track: RequestTrack) -> None:
        """The first state group cached the request's state at its prompt's unit end (inside a block)."""
        self.requests.observe_sub_block_state(track)

    # -- the eviction policy (PolicyEvents) --------------------------------------
    def free_stamp(self, request_id: str) -> tuple[float, BlockValueFn]:
        """``(now, value_of)`` for the blocks of one request freed together."""
        return self.events.free_stamp(self.requests.tracks.get(request_id))

    def stage_values(self, queue_: PolicyFreeBlockQueue, request_id: str,
                     blocks: Sequence[KVCacheBlock]) -> None:
        """Value blocks now that are returned to the pool later (deferred frees)."""
        self.events.stage_values(queue_, self.requests.tracks.get(request_id), blocks)

    def on_hit(self, blocks: Sequence[KVCacheBlock]) -> None:
        """A prefix hit referenced ``blocks`` (``BlockPool.touch``)."""
        self.events.on_hit(blocks)

    def wants_keys(self) -> bool:
        """Whether the eviction policy keeps history by block hash (``needs_keys``)."""
        return self.events.wants_keys()

    def on_cache(self, request: Request, group: int, blocks: Sequence[KVCacheBlock]) -> None:
        """``blocks`` of ``group`` of ``request`` just got their first hash
        (:meth:`PolicyEvents.on_cache
        <vllm_admission.plugin.policy_events.PolicyEvents.on_cache>`; no key for a state
        the request keeps tentatively or for the host tier only)."""
        decide = (self.requests.track(request).adm.decide
                  if self.requests.transient(group) else None)
        self.events.on_cache(request, group, blocks, decide)

    def on_keys_moved(self, block: KVCacheBlock) -> None:
        """``block`` just took over another block's hashes (``BlockPool.move_block_hashes``)."""
        self.events.on_keys_moved(block)

    def on_hash_dropped(self, block: KVCacheBlock) -> None:
        """``block`` lost its hash without an eviction (a superseded state)."""
        self.events.on_hash_dropped(block)

    def unheld_by_shadow(self, held: Sequence[Container] | None) -> Callable[[KVCacheBlock], bool] | None:
        """``f(block) -> bool`` for the free queue's switch: whether a free cached
        block goes first."""
        return self.events.unheld_by_shadow(held)

    # -- finishing and tuning (BackgroundTuning) -----------------------------------
    def on_finishing(self, request: Request, drop: Drop) -> None:
        """The request finished and its blocks are about to be freed: settle its
        tentative sequence end at ``request.num_tokens`` tokens
        (:meth:`RequestTracker.settle <vllm_admission.plugin.requests.RequestTracker.settle>`)."""
        track = self.requests.tracks.get(request.request_id)
        if track is not None and track.tentative_ends:
            self.requests.settle(track, request.num_tokens, drop)

    def on_finished(self, request: Request, evicted_so_far: bool) -> None:
        """The request left the scheduler: forget it; feed the tuner or the controller."""
        track = self.requests.forget(request.request_id)
        self.background.on_finished(request, track.adm.probe if track is not None else None,
                                    evicted_so_far)

    def poll_alpha(self) -> float | None:
        """Apply an alpha the tuner decided; returns it (else ``None``)."""
        alpha = self.background.take_alpha()
        if alpha is not None:
            self.events.set_alpha(alpha)
        return alpha

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until the tuner or controller thread has digested every finished
        request (sequential replays, tests); False on timeout."""
        return self.background.drain(timeout)

    def stop(self) -> None:
        """Stop the tuner or controller thread after its queued requests."""
        self.background.stop()

    def take_switch(self) -> Decision | None:
        """The latest switch ``auto`` decided since the last call (its ``after``
        pair and ``held`` keys), or ``None``."""
        return self.background.take_switch()

    # -- metrics ---------------------------------------------------------------
    def stats(self, *, evictions_by_group: Sequence[int], free_blocks: int) -> AdmissionStats:
        """A snapshot of the metrics (see :class:`AdmissionStats`)."""
        kinds = self.geometry.pool.group_kinds
        by_group = {f"{kinds[g]}{g}": int(n) for g, n in enumerate(evictions_by_group)}
        counters = {**vars(self.requests.counters), "evictions": sum(by_group.values()),
                    "evictions_by_group": by_group}
        tuner, controller = self.background.tuner, self.background.controller
        return AdmissionStats(
            active=True, admission=self.requests.policy.name, eviction=self.events.eviction,
            alpha=self.events.alpha,
            **counters, superseded=self.requests.superseded,
            free_blocks=free_blocks, usable_blocks=self.geometry.pool.num_blocks - 1,
            tuning=list(tuner.events) if tuner is not None else [],
            adaptive=controller is not None,
            policy_switches=list(controller.switches) if controller is not None else [])
