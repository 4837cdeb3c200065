"""``AdmissionScheduler``: vLLM 0.32's scheduler with policy-driven state admission.

Use it with ``LLM(..., scheduler_cls="vllm_admission.AdmissionScheduler")`` or
``vllm serve MODEL --scheduler-cls vllm_admission.AdmissionScheduler``; choose
the policies with the ``VLLM_ADMISSION_*`` environment variables
(:mod:`vllm_admission.plugin.env`).

Overridden ``vllm.v1.core.sched.scheduler.Scheduler`` methods:

* ``__init__``: reads the settings (an invalid value raises
  :class:`~vllm_admission.plugin.env.SettingsError`, one line),
  then installs the KV cache subclasses of :mod:`vllm_admission.plugin.kv_cache`
  into the freshly built ``KVCacheManager``;
* ``_get_local_prefix_cache_hit``: reports the request's attention-KV hit and
  hybrid hit to the admission policy and stores the policy's junction in
  ``request.shared_prefix_boundary`` (vLLM's own value for ``vllm``); under a
  KV connector that takes divergent hybrid hits, the policy plans from the
  reconciled local hit, and vLLM's fallback lookup (when the connector loads
  nothing) is shadowed to store the policy's junction too
  (:func:`~vllm_admission.plugin.boundary.hooks.bind_fallback_junction`);
* ``_mamba_block_aligned_split``: also ends prefill chunks at the policy's
  other stops (every block boundary for ``dense``; bound on the instance only
  for such a policy);
* ``add_request``: advances the eviction clock (requests, as in the simulator);
* ``schedule``: applies a newly tuned alpha before the step allocates blocks;
* ``_update_after_schedule``: counts admitted requests, writes the periodic
  metric line and the metrics snapshot for ``/metrics``
  (:mod:`vllm_admission.plugin.metrics.prometheus`);
* ``_free_blocks``: settles a finished request's tentative sequence end (under
  EAGLE it lags a block), forgets the request, feeds the alpha tuner, publishes
  the snapshot when the last running request ends;
* ``shutdown``: stops the tuner thread, removes the snapshot.

With prefix caching off, or a model without recurrent (or without attention)
layers, the scheduler logs one INFO line and behaves exactly as vLLM's.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from vllm_admission.core.geometry import inpass_capture_limit
from vllm_admission.core.settings import Settings
from vllm_admission.plugin import inpass
from vllm_admission.plugin.boundary import hooks, surface
from vllm_admission.plugin.boundary.engine_setup import EngineSetup
from vllm_admission.plugin.control import AdmissionControl
from vllm_admission.plugin.kv_cache import PolicyMambaManager
from vllm_admission.plugin.metrics.logs import ensure_log_output
from vllm_admission.plugin.metrics.snapshots import StatsPublisher
from vllm_admission.plugin.metrics.stats import AdmissionStats

if TYPE_CHECKING:
    from vllm_admission.core.adaptive import Pair

__all__ = ["AdmissionScheduler", "AsyncAdmissionScheduler", "admission_stats"]

logger = logging.getLogger("vllm_admission")


class AdmissionScheduler(EngineSetup, Scheduler):
    """vLLM's ``Scheduler`` whose hybrid prefix cache follows an admission policy.

    Takes vLLM's scheduler arguments unchanged. Settings are read once, when
    it is built (in the engine-core process), from the ``VLLM_ADMISSION_*``
    environment variables (:class:`~vllm_admission.plugin.env.Settings`),
    or given as a ``Settings`` object to a :meth:`configured` subclass;
    from then on they live in :attr:`admission_config`.

    Raises:
        SettingsError: an invalid setting, or a policy the engine's
            configuration cannot run (one line, naming the valid values or the
            unsupported feature).
    """

    #: The settings a :meth:`configured` subclass runs with; ``None``: read from the
    #: environment when the scheduler is built (:meth:`Settings.from_env`).
    admission_settings: Settings | None = None

    @classmethod
    def configured(cls, config: Settings) -> type[AdmissionScheduler]:
        """A subclass that runs with ``config`` instead of reading the environment.

        Pass it as ``scheduler_cls`` when the engine core runs in this process
        (``VLLM_ENABLE_V1_MULTIPROCESSING=0``; :func:`vllm_admission.engine.llm.build_llm`
        does): the settings then travel as this object, not through
        ``os.environ``. An engine core in its own process needs the class by
        name and the ``VLLM_ADMISSION_*`` variables instead. The subclass keeps
        the name ``AdmissionScheduler`` (``AsyncAdmissionScheduler``) and is
        reported as ``vllm_admission.<name>``.
        """
        return type(cls.__name__, (cls,), {"admission_settings": config,
                                           "__module__": "vllm_admission",
                                           "__doc__": cls.__doc__})

    @classmethod
    def _admission_read_config(cls) -> Settings:
        """The settings: the class's own (:meth:`configured`), else the environment's.

        Raises:
            SettingsError: an invalid variable (one line).
        """
        return cls.admission_settings or Settings.from_env()

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        """Pick the class the engine's configuration needs.

        * vLLM's async scheduling on (``scheduler_config.async_scheduling``, the
          GPU default, ``vllm/config/vllm.py``): an
          :class:`AsyncAdmissionScheduler`, so the engine's two batches in
          flight (``EngineCore.step_with_batch_queue``) get vLLM's output
          placeholders, as with vLLM's own ``AsyncScheduler``;
        * an unsupported vLLM release (:func:`surface.check_version`): vLLM's
          own ``Scheduler`` or ``AsyncScheduler``, built and returned as is, so
          no override of this class is active; or one line refusing a setting
          that asks for anything but vLLM's behaviour.

        Raises:
            UnsupportedVllmError: an unsupported release with a setting other
                than ``vllm`` + ``lru`` (one line).
            SettingsError: an invalid setting on an unsupported release.
        """
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        scheduler_config = getattr(vllm_config, "scheduler_config", None)
        is_async = bool(getattr(scheduler_config, "async_scheduling", False))
        if not surface.check_version():
            config = cls._admission_read_config()
            reason = surface.unsupported_reason(surface.installed_version(),
                                                     config.wants_changes())
            ensure_log_output()
            stock = AsyncScheduler if is_async else Scheduler
            logger.info("vllm_admission: %s; AdmissionScheduler builds vLLM's own %s instead "
                        "(nothing of the plugin is active)", reason, stock.__name__)
            return stock(*args, **kwargs)
        if is_async and not issubclass(cls, AsyncScheduler):
            # A configured class stays a base, so that its settings hold and
            # Python still calls __init__ (the instance is one of ``cls``).
            cls = (AsyncAdmissionScheduler if cls.admission_settings is None
                   else type(AsyncAdmissionScheduler.__name__, (cls, AsyncAdmissionScheduler),
                             {"__module__": "vllm_admission",
                              "__doc__": AsyncAdmissionScheduler.__doc__}))
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        config = self._admission_read_config()
        super().__init__(*args, **kwargs)
        ensure_log_output()
        self.admission_config = config
        self._admission: AdmissionControl | None = None
        self._admission_last_log = 0.0
        self._admission_last_line = ""
        self._admission_publisher = StatsPublisher.from_env(
            engine_index=self.vllm_config.parallel_config.data_parallel_rank)
        reason = self._admission_inert_reason()
        if reason is not None:
            logger.info("vllm_admission: %s; AdmissionScheduler runs as vLLM's stock scheduler "
                        "(nothing for the plugin to do)", reason)
            self._admission_publish(idle=True)
            return
        geometry = self._admission_geometry(config)
        plan = self._admission_plan(config)
        prefill_flops = self._admission_prefill_cost(plan) if plan.needs_flops else None
        control = AdmissionControl(plan=plan, geometry=geometry, prefill_flops=prefill_flops,
                                   settings=config)
        self._admission_pending_pair: Pair | None = None
        # EngineSetup._admission_setup_inpass (engine_setup.py) assigns ``{}`` with no
        # annotation, which mypy reads as a dict[Any, Any] declaration there.
        self._admission_inpass: dict[str, tuple[int, list[int]]] | None = None  # type: ignore[assignment]
        if config.checkpoint == "inpass":
            self._admission_setup_inpass()
        hooks.install(self.kv_cache_manager, control)
        self._admission = control
        self._admission_fallback_junctions: dict[str, int] = {}
        if self.connector is not None and self.connector.supports_divergent_local_hybrid_hits:
            hooks.bind_fallback_junction(self.kv_cache_manager,
                                         self._admission_fallback_junctions)
        if self._admission_inpass is not None:
            hooks.bind_inpass_managers(self._admission_state_managers(),
                                            self._admission_inpass)
        self._admission_bind_split()
        self._admission_last_log = time.monotonic()
        logger.info("vllm_admission: AdmissionScheduler active: %s; block_size=%d, groups=%s, "
                    "pool=%d blocks", config.describe(), geometry.pool.block_size,
                    ",".join(geometry.pool.group_kinds), geometry.pool.num_blocks)
        self._admission_log_smallest_prefix(geometry)
        self._admission_publish(idle=True)

    def _admission_publish(self, *, idle: bool) -> None:
        """Write the metrics snapshot if one is due (always when ``idle``)."""
        publisher = self._admission_publisher
        if publisher is not None and publisher.due(idle):
            publisher.publish(self.stats())

    def _admission_state_managers(self) -> list[Any]:
        from vllm.v1.core.single_type_kv_cache_manager import MambaManager

        return [m for m in self.kv_cache_manager.coordinator.single_type_managers
                if isinstance(m, MambaManager)]

    # -- overridden vLLM methods -------------------------------------------------
    def add_request(self, request: Any) -> None:
        if self._admission is not None:
            self._admission_apply_auto()
            self._admission.on_arrival()
        super().add_request(request)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self._admission is not None:
            # A tuned alpha, or auto's eviction, applies before this step's
            # allocations may evict.
            self._admission.poll_alpha()
            self._admission_apply_auto()
        return super().schedule(*args, **kwargs)

    def _admission_apply_auto(self) -> None:
        """Apply a switch ``auto`` decided: the eviction side at once (a fresh
        policy of the new pair gets the free cached blocks, those the new pair's
        shadow does not hold first, as in the simulator's
        ``HybridPrefixCache.switch``), the admission policy at the first moment
        no request is in the scheduler (a live request's checkpoints were
        planned under the old one)."""
        ctl = self._admission
        assert ctl is not None  # called only while the plugin is active
        switch = ctl.take_switch()
        if switch is not None:
            live = ctl.live_evictions
            assert live is not None  # switches come from auto, which builds live_evictions
            policy = live.make(switch.after.eviction)
            self.kv_cache_manager.block_pool.free_block_queue.switch(
                policy, ctl.unheld_by_shadow(switch.held))
            ctl.set_eviction(policy)
            self._admission_pending_pair = switch.after
        pending = self._admission_pending_pair
        if pending is None:
            return
        if pending.admission != ctl.requests.policy.name:
            if self.requests:
                return
            self._admission_use_admission(pending.admission)
        self._admission_pending_pair = None

    def _get_local_prefix_cache_hit(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        # vLLM 0.32 passes the request; 0.33 also ``max_cache_hit_length``.
        blocks, num_local, boundary, diverged = super()._get_local_prefix_cache_hit(
            request, *args, **kwargs)
        ctl = self._admission
        if ctl is not None:
            if diverged:
                # A connector that takes divergent hybrid hits (vLLM's
                # ``supports_divergent_local_hybrid_hits``) was told the attention
                # hit; the local cache's own hybrid hit and junction are the
                # reconciled lookup's, which vLLM falls back to when the connector
                # loads nothing. The policy plans from those, and that fallback
                # gets the policy's junction (hooks.bind_fallback_junction).
                _, local, junction = self.kv_cache_manager.get_computed_blocks(
                    request, *args, **kwargs)
                boundary = ctl.on_lookup(request, local, junction)
                self._admission_fallback_junctions[request.request_id] = boundary
            else:
                boundary = ctl.on_lookup(request, num_local, boundary)
        return blocks, num_local, boundary, diverged

    def _admission_split(self, request: Any, num_new_tokens: int,
                         num_new_local_computed_tokens: int = 0,
                         num_external_computed_tokens: int = 0) -> int:
        """``_mamba_block_aligned_split`` plus the policy's other chunk stops.

        Bound on the instance as ``_mamba_block_aligned_split`` only while the
        policy has such stops (``dense``), so other policies pay nothing per
        request and step.
        """
        n = Scheduler._mamba_block_aligned_split(self, request, num_new_tokens,
                                                 num_new_local_computed_tokens,
                                                 num_external_computed_tokens)
        if n <= 0:
            return n
        start = (request.num_computed_tokens + num_new_local_computed_tokens
                 + num_external_computed_tokens)
        if start >= request.num_prompt_tokens:
            return n
        ctl = self._admission
        assert ctl is not None  # bound only while the plugin is active (_admission_bind_split)
        return ctl.clip_chunk(request, start, n)

    def _admission_inpass_split(self, request: Any, num_new_tokens: int,
                                num_new_local_computed_tokens: int = 0,
                                num_external_computed_tokens: int = 0) -> int:
        """In ``inpass`` mode: the chunk ends at the budget and the prompt end
        only; split mode's stops inside it become checkpoints (see
        :func:`vllm_admission.plugin.inpass.inpass_split`)."""
        ctl = self._admission
        if ctl is not None and ctl.requests.has_stops:
            split = self._admission_split
        else:
            split = Scheduler._mamba_block_aligned_split.__get__(self)
        limit = None
        if ctl is not None:
            layout = ctl.geometry.pool
            limit = inpass_capture_limit(request.num_prompt_tokens, max(1, request.max_tokens),
                                         num_blocks=layout.num_blocks, block_size=layout.block_size,
                                         num_attention_groups=len(layout.per_token_groups),
                                         num_state_groups=len(layout.state_groups))
        plan = self._admission_inpass
        assert plan is not None  # bound only in inpass mode (_admission_bind_split)
        return inpass.inpass_split(self, split, plan, request, num_new_tokens,
                                   num_new_local_computed_tokens, num_external_computed_tokens,
                                   max_captures=limit)

    def _admission_bind_split(self) -> None:
        ctl = self._admission
        if getattr(self, "_admission_inpass", None) is not None:
            hooks.bind_chunk_split(self, self._admission_inpass_split)
            return
        hooks.bind_chunk_split(
            self, self._admission_split if ctl is not None and ctl.requests.has_stops else None)

    def _update_after_schedule(self, scheduler_output: Any) -> None:
        ctl = self._admission
        plan = getattr(self, "_admission_inpass", None)
        if plan is not None:
            hooks.attach_step_checkpoints(scheduler_output, inpass.step_checkpoints(
                self._admission_state_managers(), self.requests,
                scheduler_output.num_scheduled_tokens, plan))
        if ctl is not None:
            # A fallback junction not taken this step (the connector loaded tokens).
            self._admission_fallback_junctions.clear()
            ctl.on_scheduled(scheduler_output.num_scheduled_tokens, self.requests)
            interval = self.admission_config.log_interval
            if interval:
                now = time.monotonic()
                if now - self._admission_last_log >= interval:
                    self._admission_last_log = now
                    line = self.stats().summary()
                    if line != self._admission_last_line:
                        self._admission_last_line = line
                        logger.info("vllm_admission: %s", line)
            self._admission_publish(idle=False)
        super()._update_after_schedule(scheduler_output)

    def _free_blocks(self, request: Any) -> None:
        ctl = self._admission
        if ctl is not None:
            # Under EAGLE the sequence end lags a block: the latest tentative state goes
            # before the request's blocks are freed, as the simulator never caches it.
            ctl.on_finishing(request, self.kv_cache_manager.block_pool.drop_hash)
        super()._free_blocks(request)
        if ctl is not None:
            pool = self.kv_cache_manager.block_pool
            ctl.on_finished(request, any(pool.admission_evictions))
            self._admission_publish(idle=not self.requests)

    def shutdown(self) -> None:
        ctl = self._admission
        if ctl is not None:
            ctl.stop()
        if self._admission_publisher is not None:
            self._admission_publisher.remove()
        super().shutdown()

    # -- public helpers ------------------------------------------------------------
    def stats(self) -> AdmissionStats:
        """The plugin's cumulative metrics for this engine (:class:`AdmissionStats`).

        From an ``LLM`` whose engine core runs in-process
        (``VLLM_ENABLE_V1_MULTIPROCESSING=0``):
        ``llm.llm_engine.engine_core.engine_core.scheduler.stats()``
        (or :func:`admission_stats`).
        """
        pool = self.kv_cache_manager.block_pool
        ctl = self._admission
        if ctl is None:
            return AdmissionStats(active=False, admission=self.admission_config.admission,
                                  eviction=self.admission_config.eviction,
                                  free_blocks=pool.get_num_free_blocks(),
                                  usable_blocks=pool.num_gpu_blocks - 1)
        return ctl.stats(evictions_by_group=pool.admission_evictions,
                         free_blocks=pool.get_num_free_blocks())

    def set_admission_policy(self, name: str) -> None:
        """Switch the admission policy while no request is in the scheduler.

        Meant for tests and benchmarks that reuse one engine for several
        policies; the prefix cache is not reset.

        Raises:
            UnknownPolicyError: unknown name.
            SettingsError: the engine's configuration cannot run it.
            RuntimeError: requests are still in the scheduler, or the plugin
                is inactive for this model.
        """
        ctl = self._admission
        if ctl is None:
            raise RuntimeError("the AdmissionScheduler is inactive for this engine")
        if self.requests:
            raise RuntimeError(f"cannot switch admission policy with {len(self.requests)} "
                               f"requests in the scheduler")
        self._admission_check_supported(name)
        self._admission_use_admission(name)
        self.admission_config = dataclasses.replace(self.admission_config, admission=name)


    def _admission_use_admission(self, name: str) -> None:
        ctl = self._admission
        assert ctl is not None  # callers check that the plugin is active
        ctl.set_policy(name)
        hooks.use_policy_managers(self.kv_cache_manager.coordinator, ctl)
        self._admission_bind_split()


class AsyncAdmissionScheduler(AdmissionScheduler, AsyncScheduler):
    """:class:`AdmissionScheduler` on vLLM's ``AsyncScheduler``
    (``vllm/v1/core/sched/async_scheduler.py``).

    Built by ``AdmissionScheduler(...)`` itself whenever the engine runs with
    async scheduling (the user still names ``vllm_admission.AdmissionScheduler``).
    Method resolution puts the plugin's overrides first and vLLM's async ones
    under them: a scheduled decode step adds an output placeholder
    (``_update_after_schedule``), a request with a step in flight stays
    schedulable, and the blocks a step fills get their hashes when its output
    arrives, minus the placeholders still in flight
    (``_update_request_with_output`` calls ``cache_blocks``), which the
    plugin's ``PolicyMambaManager.cache_blocks`` decides on exactly as in the
    synchronous scheduler.

    One thing moves with that later hash: a policy that keeps tentative
    sequence-end states (``tentative_sequence_end``, ``marconi``) would drop the
    previous one a step late, after the next step's allocations. After each
    schedule this class drops it where the synchronous scheduler does
    (:meth:`PolicyMambaManager.supersede_ahead`), so that requests served one
    after another get the same blocks, evictions and hits in both.
    """

    def _update_after_schedule(self, scheduler_output: Any) -> None:
        super()._update_after_schedule(scheduler_output)
        ctl = self._admission
        if ctl is None or not ctl.requests.policy.tentative_sequence_end:
            return
        managers = [m for m in self._admission_state_managers()
                    if isinstance(m, PolicyMambaManager)]
        requests = self.requests
        for rid in scheduler_output.num_scheduled_tokens:
            request = requests[rid]
            if request.num_computed_tokens > request.num_tokens:
                for manager in managers:
                    manager.supersede_ahead(request)


def admission_stats(llm: Any) -> AdmissionStats:
    """The :class:`AdmissionStats` of a ``vllm.LLM`` running the plugin in-process.

    Raises:
        RuntimeError: the engine core runs in another process
            (``VLLM_ENABLE_V1_MULTIPROCESSING=1``), or its scheduler is not an
            :class:`AdmissionScheduler`.
    """
    scheduler = hooks.inprocess_scheduler(llm)
    if not isinstance(scheduler, AdmissionScheduler):
        raise RuntimeError(f"the engine's scheduler is {type(scheduler).__name__}, "
                           f"not AdmissionScheduler")
    return scheduler.stats()
