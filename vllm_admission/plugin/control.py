"""Per-engine admission/eviction state: vLLM events in, core policy calls out.

:class:`AdmissionControl` is what the vLLM adapters (``scheduler.py``,
``kv_cache.py``) call. It translates vLLM's view of a request into the core's
terms and keeps the per-request facts the policies need:

* at the prefix lookup (``Scheduler._get_local_prefix_cache_hit``) it builds a
  :class:`~vllm_admission.core.admission.HitProbe` and returns the
  ``shared_prefix_boundary`` the policy wants (:meth:`on_lookup`), plus any
  further chunk stops (:meth:`clip_chunk`, for ``dense``);
* when a recurrent-state group caches blocks (``MambaManager.cache_blocks``)
  it says which block-aligned state positions are admitted
  (:meth:`decide`), through the request's
  :class:`~vllm_admission.core.admission.RequestAdmission`, the object the
  simulator's cache model uses, built with ``total_len=None`` (a live
  request's length is unknown); for a policy with ``supersede_tail``
  (``marconi``) the latest state at or after the prompt end is kept
  tentatively and replaces the previous tentative one (:meth:`supersede`);
  the states that really got a hash are recorded by :meth:`observe_cached`;
* when a block gets its hash it tells an eviction policy that ``needs_keys``
  the block's key, as the simulator's cache model does (:meth:`on_cache`);
* when blocks are freed it values them with the same object's
  :meth:`~vllm_admission.core.admission.RequestAdmission.block_value` for
  eviction policies that ``needs_values`` (:meth:`scope`, :meth:`stage_values`);
* when a request finishes it feeds the alpha tuner or ``auto``'s controller
  (:meth:`on_finished`), which run off the scheduler loop
  (:mod:`~vllm_admission.plugin.worker`).

What it serves with is decided once, by the core's run setup
(:class:`~vllm_admission.core.run.RunPlan`); vLLM's blocks and block hashes
become the core's keys through :mod:`~vllm_admission.plugin.translate`. It
holds no tensors and copies none: vLLM's model runner writes the states.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_admission.core.adaptive import DEFAULT_INTERVAL, Decision, LiveEvictions
from vllm_admission.core.admission import (
    ADMIT,
    HOST,
    TENTATIVE,
    AdmissionPolicy,
    HitProbe,
    RequestAdmission,
    SegmentCosts,
    get_admission,
)
from vllm_admission.core.counters import CacheCounters
from vllm_admission.core.eviction import EvictionPolicy, get_eviction
from vllm_admission.core.layout import CacheLayout
from vllm_admission.core.replay import CacheSetup
from vllm_admission.core.run import RunPlan, alpha_tuner, controller_kwargs
from vllm_admission.core.tuning import GRIDS, AlphaTuner
from vllm_admission.plugin import translate
from vllm_admission.plugin.metrics.stats import AdmissionStats
from vllm_admission.plugin.worker import (
    ControllerThread,
    TunerThread,
    policy_controller,
)

__all__ = ["AdmissionControl"]


@dataclass(slots=True)
class _Track:
    """What the plugin knows about one live request (lengths in tokens)."""

    request: Any                     # vllm.v1.request.Request
    adm: RequestAdmission            # the core's per-request admission (probe, stops, ...)
    stops: tuple[int, ...]           # chunk stops besides the junction (vLLM ends that one)
    tails: dict[int, tuple[int, Any, Any]] = field(default_factory=dict)  # g -> (pos, block, key)


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
        tune_multiplier: the tuner's bootstrap multiplier.
        tune_grid: the tuner's bootstrap grid, a key of ``GRIDS``.
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
            (:mod:`~vllm_admission.plugin.worker`).
        auto_interval: with ``plan.adaptive``, finished requests between decisions.
        shadow_rate: with ``plan.adaptive``, the shadows' sample rate
            (``None``: chosen from the traffic; 1: full shadows).

    Raises:
        UnknownPolicyError: unknown policy name.
        ValueError: a policy that needs the future (simulator only), or one
            that needs values without ``prefill_flops``.
    """

    def __init__(self, *, plan: RunPlan, geometry: CacheLayout,
                 prefill_flops: Callable[[int, int], float] | None = None,
                 tune_multiplier: int = 5, tune_grid: str = "coarse",
                 clock: Callable[[], float] | None = None,
                 is_cached_state: Callable[[Any, int], bool] | None = None,
                 group_of: Callable[[Any], int] | None = None,
                 tune_in_thread: bool = True,
                 auto_interval: int = DEFAULT_INTERVAL,
                 shadow_rate: float | None = None) -> None:
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
        pool = geometry.pool
        self.B = pool.block_size
        self._hashes_per_block = pool.hashes_per_block
        #: vLLM's ``hash_block_size`` when below the block (partial hash hits: the
        #: prompt's tail hash block is then a checkpoint), else ``None``.
        self._partial_hash_block_size = pool.hash_block_size if pool.partial_hash_hits else None
        #: EAGLE/MTP speculative decoding: the prompt checkpoints are a block lower.
        self._eagle = geometry.speculation.uses_eagle
        self.state_groups = pool.state_groups
        self.first_state = self.state_groups[0]
        self._state_set = frozenset(self.state_groups)
        self._segment_costs = SegmentCosts(
            block_size=pool.block_size, num_attention_groups=len(pool.per_token_groups),
            num_state_groups=len(pool.state_groups), bytes_per_block=pool.bytes_per_block,
            segment_flops=prefill_flops)
        self.eviction = eviction
        self.prefill_flops = prefill_flops
        self.arrivals = 0
        self.clock = clock if clock is not None else self.request_clock
        self.is_cached_state = is_cached_state
        self.group_of = group_of
        self.tracks: dict[str, _Track] = {}
        self._pending: dict[str, HitProbe] = {}
        self._output_keys = itertools.count()  # keys of blocks holding generated tokens
        # metrics (evictions are counted by the block pool)
        self.counters = CacheCounters()
        self.superseded = 0
        #: Per-tier admission: the host tier's admission policy (states it keeps that
        #: the GPU policy does not are handed to the host tier, then dropped from the
        #: GPU cache), or ``None``. Only with a host tier in ``geometry``.
        self.host_policy = (get_admission(geometry.host.admission)
                            if geometry.host.chunks and geometry.host.admission else None)
        self._set_policy(get_admission(policy,
                                       retention_interval=pool.retention_interval))
        # eviction: None keeps vLLM's own free-block queue (a policy in vLLM's order).
        self.eviction_policy: EvictionPolicy | None = None
        self.tuner: TunerThread | None = None
        self.tune_multiplier = tune_multiplier
        self.tune_grid = GRIDS[tune_grid]
        self.tune_in_thread = tune_in_thread
        self.controller: ControllerThread | None = None
        self._finished = 0
        if plan.adaptive:
            self.controller = ControllerThread(policy_controller(
                controller_kwargs(plan, geometry, prefill_flops, interval=auto_interval,
                                  shadow_rate=shadow_rate),
                in_child=tune_in_thread))
        #: Whether an eviction policy this control may run (``auto``: any it may
        #: switch to) reads FLOP values. Only then must each freeing call open a
        #: scope to value its blocks (``AdmissionCoordinator``); without values a
        #: block freed outside a scope gets the same time, the request clock.
        self.reads_values = plan.reads_values
        #: ``auto``: builds the eviction policies it switches among, all sharing
        #: one hash history (:class:`~vllm_admission.core.adaptive.LiveEvictions`).
        self.live_evictions: LiveEvictions | None = None
        if plan.own_eviction:
            options = {} if plan.start_alpha is None else {"alpha": plan.start_alpha}
            if plan.adaptive:
                self.live_evictions = LiveEvictions(plan.evictions)
                self.eviction_policy = self.live_evictions.make(eviction, **options)
            else:
                self.eviction_policy = get_eviction(eviction, **options)
            if plan.tuned:
                self.tuner = TunerThread(self._make_tuner)

    # -- policy ------------------------------------------------------------
    def _set_policy(self, policy: AdmissionPolicy) -> None:
        self.policy = policy
        #: vLLM's own policy: vLLM decides what is cached; the plugin only watches
        #: (not with a host admission policy, whose states the plugin hands over).
        self.stock = policy.vllm_native and self.host_policy is None
        # Chunk stops besides the junction (vLLM handles that one itself).
        self.has_stops = policy.own_stops or self.host_policy is not None

    def set_policy(self, name: str) -> None:
        """Switch the admission policy between requests (tests, benchmarks).

        Raises:
            UnknownPolicyError: unknown name.
            RuntimeError: requests are still tracked (switch only when idle).
        """
        policy = get_admission(name, retention_interval=self.geometry.pool.retention_interval)
        if self.tracks:
            raise RuntimeError(f"cannot switch admission policy with {len(self.tracks)} live requests")
        self._set_policy(policy)
        self._pending.clear()
        if self.tuner is not None:  # its replays use the policy's name
            self.tuner.stop()
            self.tuner = TunerThread(self._make_tuner)

    # -- arrivals and clock ----------------------------------------------------
    def on_arrival(self) -> None:
        """A request was added to the scheduler (``Scheduler.add_request``)."""
        self.arrivals += 1

    def request_clock(self) -> float:
        """Index of the latest request that arrived (0-based; 0.0 before any)."""
        return float(max(self.arrivals - 1, 0))

    # -- lookup and chunking -------------------------------------------------
    def on_lookup(self, request: Any, num_local: int, shared_prefix_boundary: int) -> int:
        """A prefix lookup ran for ``request``; returns the boundary to store.

        Args:
            request: the vLLM request (``num_prompt_tokens``, ``request_id``).
            num_local: the hybrid hit vLLM found (tokens).
            shared_prefix_boundary: vLLM's junction (its longest single-group
                hit when that is longer than the hybrid hit, else 0).

        Returns:
            vLLM's value for ``vllm``; otherwise the policy's junction stop
            (``policy.stops(probe)`` for policies that use the junction, else 0).
        """
        kv_hit = shared_prefix_boundary if shared_prefix_boundary > num_local else num_local
        probe = HitProbe(request.num_prompt_tokens, self.B, kv_hit, num_local)
        rid = request.request_id
        if translate.counts_in_prefix_cache_stats(request):
            self._pending[rid] = probe
        native = self.policy.vllm_native
        adm = RequestAdmission(self.policy, probe, total_len=None,
                               junction=shared_prefix_boundary if native else None,
                               hash_block_size=self._partial_hash_block_size, eagle=self._eagle,
                               host_policy=self.host_policy)
        stops = (adm.host_stops if native
                 else tuple(s for s in adm.stops if s != adm.junction))
        old = self.tracks.get(rid)
        if old is None:
            self.on_request(request)
        track = _Track(request=request, adm=adm, stops=stops)
        if old is not None and old.tails:
            track.tails = old.tails  # a preempted request keeps its tentative tail
        self.tracks[rid] = track
        return adm.junction

    def clip_chunk(self, request: Any, start: int, num_new_tokens: int) -> int:
        """End the chunk ``[start, start + n)`` at the policy's next stop inside it."""
        track = self.tracks.get(request.request_id)
        if track is None or not track.stops:
            return num_new_tokens
        end = start + num_new_tokens
        for s in track.stops:  # ascending
            if s > start:
                if s < end:
                    return s - start
                break
        return num_new_tokens

    def on_scheduled(self, num_scheduled_tokens: dict[str, int], requests: dict[str, Any]) -> None:
        """Count the requests admitted this step (those looked up and scheduled),
        with the tokens a KV connector loaded for them (``host_hit_tokens``, part of
        ``hit_tokens``), first admissions only
        (:func:`~vllm_admission.plugin.translate.counts_in_prefix_cache_stats`), and the
        step's prefill chunks (requests given prompt tokens; called before vLLM advances
        ``num_computed_tokens``)."""
        self.counters.prefill_steps += sum(
            1 for rid, n in num_scheduled_tokens.items()
            if n > 0 and (r := requests.get(rid)) is not None
            and r.num_computed_tokens < r.num_prompt_tokens)
        pending = self._pending
        if not pending:
            return
        for rid in [r for r in pending if r in num_scheduled_tokens]:
            probe = pending.pop(rid)
            # Tokens a KV connector loaded beyond the local hit (a host tier's): the
            # request starts past the probe's hit, and vLLM's num_cached_tokens counts them.
            r = requests.get(rid)
            loaded = max(0, r.num_computed_tokens - probe.state_hit) if r is not None else 0
            self.counters.count_request(probe.prompt_len, probe.state_hit + loaded,
                                        probe.state_miss)
            self.counters.host_hit_tokens += loaded
            self.counters.junctions += bool(probe.junction)

    # -- caching ------------------------------------------------------------
    def track(self, request: Any) -> _Track:
        """The request's track; one with no hit is made for a request never looked up."""
        track = self.tracks.get(request.request_id)
        if track is None:
            probe = HitProbe(request.num_prompt_tokens, self.B, 0, 0)
            adm = RequestAdmission(self.policy, probe, total_len=None, junction=0,
                                   hash_block_size=self._partial_hash_block_size, eagle=self._eagle,
                                   host_policy=self.host_policy)
            track = _Track(request=request, adm=adm, stops=())
            self.tracks[request.request_id] = track
        return track

    def decide(self, track: _Track, first: int, last: int,
               blocks: Sequence[Any]) -> tuple[list[int], list[int], list[int]]:
        """Admission of the state blocks ``first .. last - 1`` of one state group.

        Block ``i`` holds the state after ``(i + 1) * B`` tokens; null blocks
        (no state written there) are skipped.

        Returns:
            ``(admitted, tentative, host)`` token positions, ascending: states the
            policy caches, states kept only until a later state of the same
            request replaces them (``supersede_tail`` policies), and states for the
            host tier only (:attr:`host_policy`; :meth:`hand_off_only`).
        """
        B = self.B
        decide = track.adm.decide
        admitted: list[int] = []
        tentative: list[int] = []
        host: list[int] = []
        for i in range(first, last):
            if blocks[i].is_null:
                continue
            pos = (i + 1) * B
            d = decide(pos)
            if d == ADMIT:
                admitted.append(pos)
            elif d == TENTATIVE:
                tentative.append(pos)
            elif d == HOST:
                host.append(pos)
        return admitted, tentative, host

    def hand_off_only(self, track: _Track, group: int, host: Sequence[int],
                      blocks: Sequence[Any], drop: Callable[[Any], None]) -> None:
        """The states at ``host`` were just cached so that vLLM hands them to the KV
        connector (``MambaManager.cache_blocks`` queues a boundary-state offload for
        every state block given a hash; the connector reads the block by id and fences
        it until the copy is done); drop them from the GPU cache now with
        ``drop(block)``, so they never hold GPU cache space (per-tier admission)."""
        B = self.B
        for pos in host:
            block = blocks[pos // B - 1]
            if block.block_hash is None:
                continue
            drop(block)
            if group == self.first_state:
                self.counters.state_checkpoints -= 1
                track.adm.unrecord(pos)

    def supersede(self, track: _Track, group: int, tentative: Sequence[int],
                  blocks: Sequence[Any], drop: Callable[[Any], None]) -> None:
        """Keep only the request's latest tentative state in ``group``.

        ``tentative`` are positions just cached as possible sequence ends
        (``supersede_tail`` policies); the previous one of the same request is
        dropped from the cache with ``drop(block)``.
        """
        B = self.B
        for pos in tentative:
            block = blocks[pos // B - 1]
            key = block.block_hash
            if key is not None:
                self._replace_tail(track, group, pos, block, key, drop)

    def supersede_ahead(self, track: _Track, group: int, known: int, reach: int,
                        blocks: Sequence[Any], drop: Callable[[Any], None]) -> None:
        """Async scheduling: a step in flight computes the state at the last block
        boundary ``p <= reach`` whose tokens are not all known yet (``p > known``).

        vLLM gives that state its hash only when the step's output arrives
        (``AsyncScheduler._update_request_with_output``), one step after the
        synchronous scheduler, which hashes it when the step is scheduled. If
        ``p`` is a tentative position, the previous tentative state is dropped
        now, where the synchronous scheduler drops it, so that its block is back
        at the head of the free queue before the next step allocates; ``p``
        itself replaces it when its hash arrives.

        Args:
            known: tokens of the request known now (``request.num_tokens``).
            reach: tokens computed once the steps in flight finish
                (``request.num_computed_tokens`` after scheduling).
        """
        pos = reach // self.B * self.B
        if pos <= known or track.adm.decide(pos) != TENTATIVE:
            return
        block = blocks[pos // self.B - 1]
        if not block.is_null:
            self._replace_tail(track, group, pos, block, None, drop)

    def _replace_tail(self, track: _Track, group: int, pos: int, block: Any, key: Any,
                      drop: Callable[[Any], None]) -> None:
        """Make the state at ``pos`` (hash ``key``; ``None`` while a step computes it)
        the request's tentative tail in ``group``; drop the previous tail if it is
        earlier and still holds the hash it was cached with."""
        old = track.tails.get(group)
        track.tails[group] = (pos, block, key)
        if old is None or old[0] >= pos:
            return
        old_pos, old_block, old_key = old
        if old_key is None or old_block.block_hash != old_key:
            return  # never hashed, or evicted (and maybe reused) meanwhile: nothing to drop
        drop(old_block)
        if group == self.first_state:
            self.counters.state_checkpoints -= 1
            self.superseded += 1
            track.adm.unrecord(old_pos)  # (absent after a preemption: a new track)

    def observe_cached(self, track: _Track, blocks: Sequence[Any], first: int, last: int) -> None:
        """States of the first state group that just got a block hash (any policy)."""
        B = self.B
        record = track.adm.record
        for i in range(first, last):
            b = blocks[i]
            if not b.is_null and b.block_hash is not None:
                record((i + 1) * B)
                self.counters.state_checkpoints += 1

    def observe_tail(self, track: _Track) -> None:
        """The first state group cached the request's tail-unit state."""
        track.adm.record(track.adm.tail)
        self.counters.state_checkpoints += 1

    # -- values for value-aware eviction (needs_values) -------------------
    def _is_cached_state(self, track: _Track) -> Callable[[int], bool]:
        """``f(i)``: whether vLLM's pool holds the first state group's state after
        block ``i`` of the request's prompt (for the checkpoints below its hit)."""
        if self.is_cached_state is None:
            return lambda i: False
        hashes = track.request.block_hashes
        stride = self._hashes_per_block
        g = self.first_state

        at = translate.block_hash_at

        def cached(i: int) -> bool:
            h = at(hashes, i, stride)
            return h is not None and self.is_cached_state(h, g)

        return cached

    def valuer(self, track: _Track | None) -> Callable[[Any], float]:
        """``f(block) -> FLOPs per byte`` for the request's cached blocks (lazy);
        0 for every block when the policy does not use values."""
        policy = self.eviction_policy
        if track is None or policy is None or not policy.needs_values:
            return lambda block: 0.0
        cached = self._is_cached_state(track)
        costs, states, group_of = self._segment_costs, self._state_set, self.group_of
        value_at = track.adm.block_value

        def value(block: Any) -> float:
            end = block.block_hash_num_tokens
            if end is None:
                return 0.0
            return value_at(end, group_of(block) in states, costs, cached)

        return value

    def scope(self, request_id: str) -> tuple[float, Callable[[Any], float]]:
        """``(now, valuer)`` for the blocks of one request freed together."""
        return self.clock(), self.valuer(self.tracks.get(request_id))

    def stage_values(self, queue_: Any, request_id: str, blocks: Sequence[Any]) -> None:
        """Value blocks now that are returned to the pool later (deferred frees)."""
        policy = self.eviction_policy
        if policy is None or not policy.needs_values:
            return
        value = self.valuer(self.tracks.get(request_id))
        for b in blocks:
            if not b.is_null and b.block_hash is not None:
                queue_.stage_value(b, value(b))

    def on_hit(self, blocks: Sequence[Any]) -> None:
        """A prefix hit referenced ``blocks`` (``BlockPool.touch``): tell a policy
        that :attr:`~vllm_admission.core.eviction.EvictionPolicy.needs_hits`."""
        policy = self.eviction_policy
        if policy is None or not policy.needs_hits:
            return
        now = self.clock()
        for b in blocks:
            if not b.is_null and b.block_hash is not None:
                policy.on_hit(b.block_id, now)

    def on_request(self, request: Any) -> None:
        """A request's first prefix lookup: tell a policy that
        :attr:`~vllm_admission.core.eviction.EvictionPolicy.needs_requests` its
        prompt's full-block keys (:func:`~vllm_admission.plugin.translate.prompt_block_keys`),
        as the simulator does when it starts the request."""
        policy = self.eviction_policy
        if policy is None or not policy.needs_requests:
            return
        keys = translate.prompt_block_keys(request.block_hashes, request.num_prompt_tokens,
                                           self.B, self._hashes_per_block)
        policy.on_request(keys, self.clock())

    def wants_keys(self) -> bool:
        """Whether the eviction policy keeps history by block hash (``needs_keys``)."""
        policy = self.eviction_policy
        return policy is not None and policy.needs_keys

    def on_cache(self, request: Any, group: int, blocks: Sequence[Any]) -> None:
        """``blocks`` of KV cache group ``group`` of ``request`` just got their first
        hash (``BlockPool.cache_full_blocks``, or ``cache_partial_block`` with a hash
        unit finer than the block); tell a policy that ``needs_keys``.

        The keys are the simulator's (``core.cache.groups``, the parts' ``cache_full``), so both
        tell the policy the same thing at the same moment:

        * a block of prompt tokens only (its hash covers at most
          ``num_prompt_tokens``): ``(group, translate.hash_key(block hash))``;
        * a block holding generated tokens: a key of its own that never
          recurs. The simulator cannot know output tokens and counts them as
          new content; vLLM's hash would tie a resent prompt's identical
          greedy output to the first one's;
        * a state kept tentatively as the sequence end (``marconi``,
          :data:`~vllm_admission.core.admission.TENTATIVE`): no key. The
          simulator knows the length and caches only the last such state,
          without telling the policy either;
        * a state for the host tier only
          (:data:`~vllm_admission.core.admission.HOST`): no key; the simulator
          never caches it on the GPU.
        """
        policy = self.eviction_policy
        transient = group in self._state_set and (self.policy.supersede_tail
                                                  or self.host_policy is not None)
        decide = self.track(request).adm.decide if transient else None
        prompt_len = request.num_prompt_tokens
        for b in blocks:
            end = b.block_hash_num_tokens
            if transient and decide(end) in (TENTATIVE, HOST):
                continue
            if end > prompt_len:
                key: Any = ("out", next(self._output_keys))
            else:
                key = (group, translate.hash_key(b.block_hash))
            policy.on_cache(b.block_id, key)

    def on_keys_moved(self, block: Any) -> None:
        """``block`` just took over another block's hashes (``BlockPool.move_block_hashes``:
        the prefix cache keeps a copy of a tail or hit block its request writes on); tell
        a policy that ``needs_keys`` its first one, as the simulator does
        (``BlockPool.move_keys`` in ``core/cache/block_pool.py``). Only prompt blocks
        move, so the key is the hash's."""
        self.eviction_policy.on_cache(block.block_id, (self.group_of(block),
                                                       translate.hash_key(block.block_hash)))

    def on_hash_dropped(self, block: Any) -> None:
        """``block`` lost its hash without an eviction (a superseded state)."""
        policy = self.eviction_policy
        if policy is not None and policy.needs_hits:
            policy.forget(block.block_id)

    # -- finishing and tuning ----------------------------------------------
    def on_finished(self, request: Any, evicted_so_far: bool) -> None:
        """The request left the scheduler: forget it; feed the tuner or the controller."""
        rid = request.request_id
        self._pending.pop(rid, None)
        track = self.tracks.pop(rid, None)
        worker = self.tuner if self.tuner is not None else self.controller
        if worker is None or track is None or worker.error is not None:
            return
        output_len = request.num_output_tokens
        P = track.adm.probe.prompt_len
        if output_len < 1 or P < 1:
            return
        item = translate.cache_request(request, P, self.B, self._hashes_per_block,
                                       self._partial_hash_block_size is not None)
        if self.controller is not None:
            index, self._finished = self._finished, self._finished + 1
            if self.tune_in_thread:
                self.controller.submit(index, item)
            else:
                self.controller._observe(index, item)  # noqa: SLF001
            return
        # A request resumed after a preemption looks up its outputs too; the
        # tuner's replay knows the prompt only.
        hit = min(track.adm.probe.state_hit, P)
        saved = self.prefill_flops(P, 0) - self.prefill_flops(P, hit)
        if self.tune_in_thread:
            self.tuner.submit(item, evicted_so_far, saved)
        else:
            self.tuner._observe(item, evicted_so_far, saved)  # noqa: SLF001

    def poll_alpha(self) -> float | None:
        """Apply an alpha the tuner decided; returns it (else ``None``)."""
        if self.tuner is None:
            return None
        alpha = self.tuner.take_alpha()
        if alpha is not None:
            self.eviction_policy.alpha = alpha
        return alpha

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until the tuner or controller thread has digested every finished
        request (sequential replays, tests); False on timeout."""
        worker = self.tuner if self.tuner is not None else self.controller
        return worker.drain(timeout) if worker is not None else True

    def stop(self) -> None:
        """Stop the tuner or controller thread after its queued requests."""
        for worker in (self.tuner, self.controller):
            if worker is not None:
                worker.stop()

    def take_switch(self) -> Decision | None:
        """The latest switch ``auto`` decided since the last call (its ``after``
        pair and ``held`` keys), or ``None``."""
        return self.controller.take_switch() if self.controller is not None else None

    def demoter(self, held: Sequence[Container] | None) -> Callable[[Any], bool] | None:
        """``f(block) -> bool`` for the free queue's switch: whether a free cached
        block goes first (:func:`vllm_admission.plugin.translate.demoter`, with
        this engine's ``group_of``)."""
        return translate.demoter(held, self.group_of)

    def set_eviction(self, policy: EvictionPolicy) -> None:
        """Order free blocks by ``policy`` (fresh) from now on (``auto``); the free
        queue hands its candidates over itself."""
        self.eviction_policy = policy
        self.eviction = policy.name

    def _make_tuner(self) -> AlphaTuner:
        # The engine tunes once per bootstrap window, as Marconi does: re-tuning
        # needs snapshots of a simulated twin of the live cache, which the
        # engine does not keep.
        setup = CacheSetup(layout=self.geometry, admission=self.policy.name,
                           eviction=self.eviction, segment_flops=self.prefill_flops)
        return alpha_tuner(setup, self.prefill_flops, grid=self.tune_grid,
                           multiplier=self.tune_multiplier)

    # -- metrics ---------------------------------------------------------------
    def stats(self, *, evictions_by_group: Sequence[int], free_blocks: int) -> AdmissionStats:
        """A snapshot of the metrics (see :class:`AdmissionStats`)."""
        kinds = self.geometry.pool.group_kinds
        by_group = {f"{kinds[g]}{g}": int(n) for g, n in enumerate(evictions_by_group)}
        counters = {**vars(self.counters), "evictions": sum(by_group.values()),
                    "evictions_by_group": by_group}
        return AdmissionStats(
            active=True, admission=self.policy.name, eviction=self.eviction,
            alpha=self.eviction_policy.alpha
            if self.eviction_policy is not None and self.eviction_policy.tunable else None,
            **counters, superseded=self.superseded,
            free_blocks=free_blocks, usable_blocks=self.geometry.pool.num_blocks - 1,
            tuning=list(self.tuner.events) if self.tuner is not None else [],
            adaptive=self.controller is not None,
            policy_switches=list(self.controller.switches) if self.controller is not None else [])
