"""Every place where vllm_admission reaches into vLLM's internals, in one module.

The plugin enters vLLM through two documented doors, ``--scheduler-cls``
(:class:`~vllm_admission.plugin.scheduler.AdmissionScheduler` subclasses
vLLM's ``Scheduler``) and the ``vllm.general_plugins`` /
``vllm.stat_logger_plugins`` entry points. Everything beyond that, the live
objects it changes and the private members it overrides or reads, is done
here, behind a version check:

* :func:`check_version`, :func:`unsupported_reason`: vLLM 0.32.x and 0.33.x
  are supported. Another version gets one line: the AdmissionScheduler refuses
  to start when a setting asks for anything but vLLM's own behaviour, and
  otherwise builds vLLM's own scheduler class instead of itself (no override
  of the plugin's is active);
* :func:`install`: re-types the freshly built block pool, Mamba managers and
  hybrid coordinator into the subclasses of
  :mod:`vllm_admission.plugin.kv_cache` (their fields stay vLLM's) and swaps
  the pool's free-block queue for a
  :class:`~vllm_admission.plugin.free_queue.PolicyFreeBlockQueue`;
* :func:`use_policy_managers`, :func:`bind_chunk_split`: what a policy switch
  changes (the Mamba managers' class, the chunk-split override on the
  scheduler instance);
* ``inpass`` checkpoints: :func:`bind_inpass_managers` (the state managers'
  allocation, shadowed per instance), :func:`attach_step_checkpoints` /
  :func:`step_checkpoints_of` (the step's checkpoint list on its
  ``SchedulerOutput``), :func:`install_inpass_runner` (the model runner's
  ``execute_model`` and the CPU GDN core, wrapped process-wide, and on CPU the
  Mamba2 metadata builder, SSD scan and checkpoint store; all share one
  :class:`~vllm_admission.plugin.runner.inpass_runner.StepCheckpoints`);
* :func:`wrap_mamba2_spec`: ``MambaMixer2.get_kv_cache_spec`` on vLLM's CPU
  platform (:mod:`vllm_admission.plugin.cpu_mamba2`: no prefill-checkpoint export);
* :func:`wrap_schedule`: observes each step's output on one scheduler
  instance (:class:`vllm_admission.engine.llm.PrefillStepCounter`);
* :func:`register_env_vars`: adds the plugin's variables to
  ``vllm.envs.environment_variables``;
* :func:`cached_blocks`: iterates vLLM's block-hash map (no public iterator);
  :func:`inprocess_scheduler`: the live scheduler of an in-process ``LLM``.

:data:`PRIVATE_MEMBERS` lists each private member relied on, with the vLLM
file it comes from; :data:`OVERRIDES` names the plugin's method for each one it
overrides or shadows. ``tests/test_plugin_scheduler.py`` checks that the
installed vLLM still has every member (:func:`missing_members`, and the
instance attributes on a live scheduler) and that every override accepts the
arguments vLLM passes (:func:`override_mismatches`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from vllm_admission.plugin.config import AdmissionConfigError

__all__ = [
    "INPASS_ATTR",
    "OVERRIDES",
    "PRIVATE_MEMBERS",
    "SUPPORTED_VLLM",
    "UnsupportedVllmError",
    "attach_step_checkpoints",
    "bind_chunk_split",
    "bind_inpass_managers",
    "cached_blocks",
    "check_version",
    "inprocess_scheduler",
    "install",
    "install_inpass_runner",
    "mamba2_spec_wrapped",
    "missing_members",
    "override_mismatches",
    "register_env_vars",
    "step_checkpoints_of",
    "supported_text",
    "unsupported_reason",
    "use_policy_managers",
    "wrap_mamba2_spec",
    "wrap_schedule",
]

#: The vLLM release lines the plugin supports (``major.minor``).
SUPPORTED_VLLM: tuple[str, ...] = ("0.32", "0.33")

#: ``(file under vllm/, qualified member, how the plugin uses it)`` for every
#: private (or undocumented) member of vLLM the plugin overrides, calls or reads.
PRIVATE_MEMBERS: tuple[tuple[str, str, str], ...] = (
    ("model_executor/layers/mamba/mamba_mixer2.py", "MambaMixer2.get_kv_cache_spec",
     "wrapped on the CPU platform: the spec declares no prefill-checkpoint export"),
    ("v1/core/sched/scheduler.py", "Scheduler._get_local_prefix_cache_hit",
     "overridden: reports the probe, returns the policy's junction (0.32 passes the request, "
     "0.33 also max_cache_hit_length)"),
    ("v1/core/sched/async_scheduler.py", "AsyncScheduler._update_after_schedule",
     "inherited: the plugin's async variant runs vLLM's output placeholders"),
    ("v1/core/sched/scheduler.py", "Scheduler._mamba_block_aligned_split",
     "called, and shadowed on the instance for policies with extra chunk stops"),
    ("v1/core/sched/scheduler.py", "Scheduler._update_after_schedule",
     "overridden: counts admitted requests, logs, publishes metrics"),
    ("v1/core/sched/scheduler.py", "Scheduler._free_blocks",
     "overridden: forgets a finished request, feeds the alpha tuner"),
    ("v1/core/kv_cache_coordinator.py", "HybridKVCacheCoordinator.single_type_managers",
     "read: the per-group managers (instance attribute)"),
    ("v1/core/kv_cache_coordinator.py", "HybridKVCacheCoordinator.free",
     "overridden: one free scope per request"),
    ("v1/core/kv_cache_coordinator.py", "HybridKVCacheCoordinator.remove_skipped_blocks",
     "overridden: one free scope for retired state blocks"),
    ("v1/core/kv_cache_coordinator.py", "HybridKVCacheCoordinator.pop_blocks_for_free",
     "overridden: values deferred frees"),
    ("v1/core/single_type_kv_cache_manager.py", "MambaManager.cache_blocks",
     "overridden: caches only the admitted states (replay_boundaries)"),
    ("v1/core/single_type_kv_cache_manager.py", "MambaManager._cache_partial_tail_block",
     "overridden: off"),
    ("v1/core/block_pool.py", "BlockPool.cache_full_blocks",
     "overridden: records the states that got a hash"),
    ("v1/core/block_pool.py", "BlockPool.get_new_blocks",
     "overridden: marks allocation-time evictions"),
    ("v1/core/block_pool.py", "BlockPool._maybe_evict_cached_block",
     "overridden (counts evictions per group) and called (drops a superseded state's hash)"),
    ("v1/core/block_pool.py", "BlockPool.touch", "overridden: the eviction policy's hit hook"),
    ("v1/core/block_pool.py", "BlockPool.reset_prefix_cache",
     "overridden: re-orders the policy's free queue"),
    ("v1/core/block_pool.py", "BlockPool.free_block_queue",
     "replaced by PolicyFreeBlockQueue (instance attribute)"),
    ("v1/core/block_pool.py", "BlockHashToBlockMap._cache",
     "iterated by cached_blocks (instance attribute)"),
    ("v1/core/kv_cache_utils.py", "FreeKVCacheBlockQueue.get_all_free_blocks",
     "read once: the free blocks in order, when the queue is swapped"),
    ("v1/core/kv_cache_utils.py", "get_group_id", "called: a block hash's KV cache group"),
    ("v1/core/kv_cache_utils.py", "make_block_hash_with_group_id",
     "called: looks up a state block by hash and group"),
    ("envs.py", "environment_variables", "extended with the plugin's variables"),
    ("v1/core/sched/scheduler.py", "Scheduler.schedule",
     "overridden: applies a tuned alpha and auto's switch before the step allocates; "
     "shadowed on an instance by wrap_schedule (engine.llm.PrefillStepCounter)"),
    ("v1/core/sched/scheduler.py", "Scheduler.add_request",
     "overridden: advances the request clock, applies auto's switch"),
    ("v1/core/sched/scheduler.py", "Scheduler.shutdown",
     "overridden: stops the worker thread, removes the metrics snapshot"),
    ("v1/core/sched/output.py", "SchedulerOutput",
     "given the attribute admission_inpass (inpass: the step's checkpoint list, "
     "attach_step_checkpoints / step_checkpoints_of)"),
    ("v1/core/single_type_kv_cache_manager.py", "MambaManager.get_num_blocks_to_allocate",
     "shadowed on the instance (inpass): also counts the checkpoint blocks"),
    ("v1/core/single_type_kv_cache_manager.py", "MambaManager.allocate_new_blocks",
     "shadowed on the instance (inpass): a real block at each checkpoint"),
    ("v1/core/single_type_kv_cache_manager.py", "MambaManager.req_to_blocks",
     "read (instance attribute, inpass): a request's block table"),
    ("v1/worker/gpu_model_runner.py", "GPUModelRunner.execute_model",
     "wrapped process-wide (inpass): publishes the step's checkpoint list to the GDN core"),
    ("model_executor/layers/mamba/ops/cpu/gdn_attention.py", "_cpu_gdn_attention_nonspec",
     "wrapped process-wide (inpass): prefills with checkpoints run in segments"),
    ("v1/attention/backends/mamba2_attn.py", "Mamba2AttentionMetadataBuilder.build",
     "wrapped process-wide (inpass, CPU): the step's checkpoints go into the export fields"),
    ("v1/attention/backends/mamba_attn.py", "BaseMambaAttentionMetadataBuilder._prefill_cpu_metadata",
     "called (inpass, CPU): the prefill rows' computed tokens"),
    ("v1/attention/backends/mamba2_attn.py", "Mamba2AttentionMetadata",
     "read and replaced (inpass): num_prefills, num_decodes, state_indices_tensor_p, "
     "query_start_loc_p; cu_chunk_seqlen_p, seq_idx_p, last_chunk_indices_p, "
     "checkpoint_chunk_idx, checkpoint_meta"),
    ("model_executor/layers/mamba/ops/ssd_combined.py", "_mamba_chunk_scan_combined_fwd",
     "replaced on CPU (inpass): the CPU scan, returning the state at every chunk end when asked"),
    ("model_executor/layers/mamba/mamba_mixer2.py", "store_prefill_checkpoint",
     "replaced on CPU (inpass): a torch store, several checkpoints per prefill row"),
    ("v1/attention/backends/gdn_attn.py", "GDNAttentionMetadata",
     "read by the inpass GDN core (num_decodes, num_decode_tokens, num_prefills, "
     "num_prefill_tokens, non_spec_state_indices_tensor, non_spec_query_start_loc, "
     "has_initial_state) and narrowed to the decodes with dataclasses.replace"),
    ("v1/engine/llm_engine.py", "LLMEngine.engine_core",
     "read by inprocess_scheduler (instance attribute): the engine-core client"),
    ("v1/engine/core_client.py", "InprocClient.engine_core",
     "read by inprocess_scheduler (instance attribute): the in-process EngineCore"),
    ("v1/engine/core.py", "EngineCore.scheduler",
     "read by inprocess_scheduler (instance attribute): the live scheduler"),
)

# Members that are instance attributes (checked on a live object, not the class).
_INSTANCE_ATTRIBUTES = frozenset({
    "HybridKVCacheCoordinator.single_type_managers", "BlockPool.free_block_queue",
    "BlockHashToBlockMap._cache", "environment_variables", "MambaManager.req_to_blocks",
    "LLMEngine.engine_core", "InprocClient.engine_core", "EngineCore.scheduler",
})


class UnsupportedVllmError(AdmissionConfigError):
    """The installed vLLM is not the release line the plugin supports."""


def installed_version() -> str:
    """``vllm.__version__``."""
    import vllm

    return str(vllm.__version__)


def check_version(version: str | None = None) -> bool:
    """Whether ``version`` (default: the installed vLLM's) is a supported release.

    Returns:
        ``True`` for a release line in :data:`SUPPORTED_VLLM`; ``False`` otherwise.
    """
    version = installed_version() if version is None else version
    parts = version.split("+")[0].split(".")
    return ".".join(parts[:2]) in SUPPORTED_VLLM


def supported_text() -> str:
    """The supported release lines in words, e.g. ``"0.32.x and 0.33.x"``."""
    lines = [f"{v}.x" for v in SUPPORTED_VLLM]
    return ", ".join(lines[:-1]) + f" and {lines[-1]}" if len(lines) > 1 else lines[0]


def unsupported_reason(version: str, wants_changes: bool) -> str:
    """What an unsupported vLLM gets: the reason the scheduler logs as it runs stock.

    Raises:
        UnsupportedVllmError: ``wants_changes`` (a setting other than vLLM's own
            behaviour); the message is one line.
    """
    text = f"vllm_admission supports vLLM {supported_text()}, found {version}"
    if wants_changes:
        raise UnsupportedVllmError(
            f"{text}; the AdmissionScheduler refuses to change vLLM's caching on it "
            f"(valid here: VLLM_ADMISSION_POLICY=vllm with VLLM_ADMISSION_EVICTION=lru)")
    return text


def missing_members() -> list[str]:
    """The :data:`PRIVATE_MEMBERS` the installed vLLM lacks (class members only;
    instance attributes are checked by the tests on a live engine)."""
    import importlib

    from vllm.v1.core import block_pool, kv_cache_coordinator, kv_cache_utils
    from vllm.v1.core import single_type_kv_cache_manager as stkm
    from vllm.v1.core.sched import async_scheduler, scheduler

    modules: dict[str, Any] = {"v1/core/sched/scheduler.py": scheduler,
                               "v1/core/sched/async_scheduler.py": async_scheduler,
                               "v1/core/block_pool.py": block_pool,
                               "v1/core/kv_cache_coordinator.py": kv_cache_coordinator,
                               "v1/core/single_type_kv_cache_manager.py": stkm,
                               "v1/core/kv_cache_utils.py": kv_cache_utils}
    missing = []
    for path, member, _ in PRIVATE_MEMBERS:
        if member in _INSTANCE_ATTRIBUTES or path == "envs.py":
            continue
        if path not in modules:
            name = "vllm." + path.removesuffix(".py").replace("/", ".")
            try:
                modules[path] = importlib.import_module(name)
            except ImportError as exc:
                missing.append(f"{path}: {member} (cannot import {name}: {exc})")
                modules[path] = None
        if modules[path] is None:
            continue
        obj: Any = modules[path]
        for part in member.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                missing.append(f"{path}: {member}")
                break
    return missing


#: ``(vLLM class member of PRIVATE_MEMBERS, the plugin's "module:Class.method")`` for every
#: method the plugin overrides or shadows: vLLM calls the plugin's with its own arguments.
OVERRIDES: tuple[tuple[str, str], ...] = (
    ("Scheduler._get_local_prefix_cache_hit",
     "vllm_admission.plugin.scheduler:AdmissionScheduler._get_local_prefix_cache_hit"),
    ("Scheduler._update_after_schedule",
     "vllm_admission.plugin.scheduler:AdmissionScheduler._update_after_schedule"),
    ("Scheduler._free_blocks", "vllm_admission.plugin.scheduler:AdmissionScheduler._free_blocks"),
    ("Scheduler._mamba_block_aligned_split",
     "vllm_admission.plugin.scheduler:AdmissionScheduler._admission_split"),
    ("Scheduler._mamba_block_aligned_split",
     "vllm_admission.plugin.scheduler:AdmissionScheduler._admission_inpass_split"),
    ("HybridKVCacheCoordinator.free", "vllm_admission.plugin.kv_cache:AdmissionCoordinator.free"),
    ("HybridKVCacheCoordinator.remove_skipped_blocks",
     "vllm_admission.plugin.kv_cache:AdmissionCoordinator.remove_skipped_blocks"),
    ("HybridKVCacheCoordinator.pop_blocks_for_free",
     "vllm_admission.plugin.kv_cache:AdmissionCoordinator.pop_blocks_for_free"),
    ("MambaManager.cache_blocks", "vllm_admission.plugin.kv_cache:PolicyMambaManager.cache_blocks"),
    ("MambaManager._cache_partial_tail_block",
     "vllm_admission.plugin.kv_cache:PolicyMambaManager._cache_partial_tail_block"),
    ("BlockPool.cache_full_blocks", "vllm_admission.plugin.kv_cache:AdmissionBlockPool.cache_full_blocks"),
    ("BlockPool.get_new_blocks", "vllm_admission.plugin.kv_cache:AdmissionBlockPool.get_new_blocks"),
    ("BlockPool._maybe_evict_cached_block",
     "vllm_admission.plugin.kv_cache:AdmissionBlockPool._maybe_evict_cached_block"),
    ("BlockPool.touch", "vllm_admission.plugin.kv_cache:AdmissionBlockPool.touch"),
    ("BlockPool.reset_prefix_cache",
     "vllm_admission.plugin.kv_cache:AdmissionBlockPool.reset_prefix_cache"),
    ("Scheduler.schedule", "vllm_admission.plugin.scheduler:AdmissionScheduler.schedule"),
    ("Scheduler.add_request", "vllm_admission.plugin.scheduler:AdmissionScheduler.add_request"),
    ("Scheduler.shutdown", "vllm_admission.plugin.scheduler:AdmissionScheduler.shutdown"),
    ("MambaManager.get_num_blocks_to_allocate",
     "vllm_admission.plugin.inpass:InpassAllocation.get_num_blocks_to_allocate"),
    ("MambaManager.allocate_new_blocks",
     "vllm_admission.plugin.inpass:InpassAllocation.allocate_new_blocks"),
)


def _accepts(theirs: Any, ours: Any) -> list[str]:
    """What a call made with ``theirs``'s parameters would break in ``ours``."""
    import inspect

    kinds = inspect.Parameter
    ours_params = list(inspect.signature(ours).parameters.values())[1:]
    theirs_params = list(inspect.signature(theirs).parameters.values())[1:]
    by_name = {p.name: p for p in ours_params}
    var_pos = any(p.kind is kinds.VAR_POSITIONAL for p in ours_params)
    var_kw = any(p.kind is kinds.VAR_KEYWORD for p in ours_params)
    positional = [p for p in ours_params
                  if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
    problems = []
    for i, p in enumerate(theirs_params):
        if p.kind in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD):
            continue
        mine = by_name.get(p.name)
        if p.kind is kinds.KEYWORD_ONLY:
            if not (mine is not None and mine.kind is not kinds.POSITIONAL_ONLY) and not var_kw:
                problems.append(f"keyword {p.name!r}")
        elif i >= len(positional) and not var_pos:
            problems.append(f"positional {p.name!r} (argument {i + 1})")
    for p in ours_params:
        if p.default is p.empty and p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD) \
                and p.name not in {q.name for q in theirs_params}:
            problems.append(f"requires {p.name!r}, which vLLM does not pass")
    return problems


def override_mismatches() -> list[str]:
    """For each entry of :data:`OVERRIDES`: the arguments the installed vLLM's
    method takes that the plugin's override could not take (``[]``: every
    override accepts what vLLM passes). Catches, for example, vLLM 0.33's
    ``Scheduler._get_local_prefix_cache_hit(request, max_cache_hit_length)``
    against an override taking only ``request``."""
    import importlib

    from vllm.v1.core import block_pool, kv_cache_coordinator
    from vllm.v1.core import single_type_kv_cache_manager as stkm
    from vllm.v1.core.sched import scheduler

    owners = {"Scheduler": scheduler.Scheduler, "BlockPool": block_pool.BlockPool,
              "HybridKVCacheCoordinator": kv_cache_coordinator.HybridKVCacheCoordinator,
              "MambaManager": stkm.MambaManager}
    out = []
    for member, target in OVERRIDES:
        cls_name, meth = member.split(".")
        theirs = getattr(owners[cls_name], meth, None)
        if theirs is None:
            out.append(f"{member}: missing in vLLM")
            continue
        module, qual = target.split(":")
        ours: Any = importlib.import_module(module)
        for part in qual.split("."):
            ours = getattr(ours, part)
        out += [f"{qual} vs vLLM's {member}: {p}" for p in _accepts(theirs, ours)]
    return out


# ---------------------------------------------------------------- live objects
def _retype(obj: Any, base: type, cls: type) -> None:
    if type(obj) is not base:
        raise TypeError(f"vllm_admission expected vLLM's {base.__name__}, found "
                        f"{type(obj).__module__}.{type(obj).__name__}")
    obj.__class__ = cls


def use_policy_managers(coordinator: Any, control: Any) -> None:
    """Give the state groups the manager class the control's current policy needs:
    vLLM's own ``MambaManager`` for a ``vllm_native`` policy,
    :class:`~vllm_admission.plugin.kv_cache.PolicyMambaManager` otherwise."""
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager

    from vllm_admission.plugin.kv_cache import PolicyMambaManager

    cls = MambaManager if control.stock else PolicyMambaManager
    for manager in coordinator.single_type_managers:
        if isinstance(manager, MambaManager):
            manager.__class__ = cls
            manager._admission = control


def install(kv_cache_manager: Any, control: Any) -> Any:
    """Attach ``control`` to a freshly built ``KVCacheManager`` (no request seen yet).

    Re-types the block pool and the Mamba managers into the subclasses of
    :mod:`vllm_admission.plugin.kv_cache`. For an eviction policy not in
    vLLM's order it swaps the pool's free queue for a
    :class:`~vllm_admission.plugin.free_queue.PolicyFreeBlockQueue` holding the
    same blocks in the same order, and, where a policy reads FLOP values
    (``AdmissionControl.reads_values``), re-types the hybrid coordinator too.
    With ``lru`` (or ``reuse``) the coordinator stays vLLM's own.

    Returns:
        The coordinator.

    Raises:
        TypeError: the objects are not vLLM's own classes (another plugin
            replaced them).
    """
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator
    from vllm.v1.core.kv_cache_utils import get_group_id, make_block_hash_with_group_id
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager

    from vllm_admission.plugin.free_queue import PolicyFreeBlockQueue
    from vllm_admission.plugin.kv_cache import AdmissionBlockPool, AdmissionCoordinator

    coordinator = kv_cache_manager.coordinator
    if type(coordinator) is not HybridKVCacheCoordinator:
        raise TypeError(f"vllm_admission expected vLLM's HybridKVCacheCoordinator, found "
                        f"{type(coordinator).__module__}.{type(coordinator).__name__}")
    managers = coordinator.single_type_managers
    for manager in managers:
        if isinstance(manager, MambaManager) and type(manager) is not MambaManager:
            raise TypeError(f"vllm_admission expected vLLM's MambaManager, found "
                            f"{type(manager).__module__}.{type(manager).__name__}")
    pool = coordinator.block_pool
    _retype(pool, BlockPool, AdmissionBlockPool)
    pool._init_admission(len(managers), control, control.first_state)
    use_policy_managers(coordinator, control)
    if control.eviction_policy is not None:
        queue = PolicyFreeBlockQueue(pool.free_block_queue.get_all_free_blocks(),
                                     control.eviction_policy, clock=control.clock,
                                     switchable=control.controller is not None)
        pool.free_block_queue = queue
        if control.reads_values:
            # Values are made per request as it frees its blocks; a policy without
            # values keeps vLLM's coordinator (the scopes would cost every step).
            _retype(coordinator, HybridKVCacheCoordinator, AdmissionCoordinator)
            coordinator._admission = control
            queue.scope_maker = control.scope
            coordinator._admission_queue = queue

    def is_cached_state(block_hash: Any, group: int) -> bool:
        return pool.cached_block_hash_to_block.get_one_block(
            make_block_hash_with_group_id(block_hash, group)) is not None

    control.is_cached_state = is_cached_state
    control.group_of = lambda block: get_group_id(block.block_hash)
    return coordinator


def bind_chunk_split(scheduler: Any, split: Callable[..., int] | None) -> None:
    """Shadow ``Scheduler._mamba_block_aligned_split`` on ``scheduler`` with
    ``split`` (the policy has extra chunk stops), or remove the shadow (``None``),
    so that other policies pay nothing per request and step."""
    if split is not None:
        scheduler._mamba_block_aligned_split = split
    else:
        scheduler.__dict__.pop("_mamba_block_aligned_split", None)


def wrap_schedule(scheduler: Any, after: Callable[[Any], None]) -> Callable[[], None]:
    """Shadow ``schedule`` on one scheduler instance (``EngineCore.step`` calls it):
    each call returns vLLM's ``SchedulerOutput`` after ``after(output)`` saw it.

    Returns:
        ``undo()``: restores the instance as it was (idempotent).
    """
    had_own = "schedule" in scheduler.__dict__
    original = scheduler.schedule

    def schedule(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        after(out)
        return out

    scheduler.schedule = schedule

    def undo() -> None:
        if scheduler.__dict__.get("schedule") is not schedule:
            return
        if had_own:
            scheduler.schedule = original
        else:
            del scheduler.__dict__["schedule"]

    return undo


# ---------------------------------------------------------------- inpass checkpoints
#: Attribute the scheduler adds to a step's ``SchedulerOutput`` (``inpass`` mode):
#: ``{running state block id: ((token offset in the chunk, checkpoint block id), ...)}``.
#: Under the ``uni`` executor the runner receives that very object.
INPASS_ATTR = "admission_inpass"


def attach_step_checkpoints(scheduler_output: Any, plan: dict[int, tuple[tuple[int, int], ...]],
                            ) -> None:
    """Give a step's ``SchedulerOutput`` its checkpoint list (:data:`INPASS_ATTR`)."""
    setattr(scheduler_output, INPASS_ATTR, plan)


def step_checkpoints_of(scheduler_output: Any) -> dict[int, tuple[tuple[int, int], ...]] | None:
    """The checkpoint list a step's ``SchedulerOutput`` carries; ``None`` when it
    has none (an empty list, or a scheduler that is not the plugin's: the runner
    hooks are process-wide)."""
    return getattr(scheduler_output, INPASS_ATTR, None) or None


def bind_inpass_managers(managers: Sequence[Any], plan: dict[str, tuple[int, list[int]]]) -> None:
    """Shadow ``get_num_blocks_to_allocate`` and ``allocate_new_blocks`` on each
    state-group manager with an
    :class:`~vllm_admission.plugin.inpass.InpassAllocation`'s, so that every
    planned checkpoint gets a real block. Instance attributes: they survive the
    re-typing of a policy switch (:func:`use_policy_managers`)."""
    from vllm_admission.plugin.inpass import InpassAllocation

    for manager in managers:
        hooks = InpassAllocation(manager, plan)
        manager.get_num_blocks_to_allocate = hooks.get_num_blocks_to_allocate
        manager.allocate_new_blocks = hooks.allocate_new_blocks


def install_inpass_runner() -> Any:
    """Wrap ``GPUModelRunner.execute_model`` and the CPU GDN core
    ``gdn_attention._cpu_gdn_attention_nonspec`` (process-wide, idempotent).

    The two wrappers share one
    :class:`~vllm_admission.plugin.runner.inpass_runner.StepCheckpoints`:
    ``execute_model`` publishes the step's list (:func:`step_checkpoints_of`),
    and the GDN core runs
    :func:`~vllm_admission.plugin.runner.inpass_runner.segmented_core` when a
    prefill of the step has checkpoints. Without a list, or when no prefill of
    the step has a checkpoint, both call the originals unchanged.

    Returns:
        The shared ``StepCheckpoints`` (the one installed earlier, if any).
    """
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_admission.plugin.runner.inpass_runner import (
        StepCheckpoints,
        segmented_core,
    )

    channel = getattr(GPUModelRunner.execute_model, "_admission_step", None)
    if channel is None:
        channel = StepCheckpoints()
        original_execute = GPUModelRunner.execute_model

        def execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            channel.plan = step_checkpoints_of(scheduler_output)
            return original_execute(self, scheduler_output, *args, **kwargs)

        execute_model._admission_step = channel  # type: ignore[attr-defined]
        GPUModelRunner.execute_model = execute_model
    if getattr(gdn_attention._cpu_gdn_attention_nonspec, "_admission_step", None) is not channel:
        original_core = getattr(gdn_attention._cpu_gdn_attention_nonspec, "_admission_original",
                                gdn_attention._cpu_gdn_attention_nonspec)

        def core(layer: Any, md: Any, mixed_qkv: Any, b: Any, a: Any, core_attn_out: Any) -> None:
            plan = channel.plan
            if not plan or not md.num_prefills or not segmented_core(
                    original_core, plan, layer, md, mixed_qkv, b, a, core_attn_out,
                    channel.copiers):
                original_core(layer, md, mixed_qkv, b, a, core_attn_out)

        core._admission_step = channel  # type: ignore[attr-defined]
        core._admission_original = original_core  # type: ignore[attr-defined]
        gdn_attention._cpu_gdn_attention_nonspec = core
    _install_mamba2_export(channel)
    return channel


def _install_mamba2_export(channel: Any) -> None:
    """The Mamba2 half of :func:`install_inpass_runner`, on the CPU platform (idempotent).

    ``Mamba2AttentionMetadataBuilder.build`` is wrapped to put the step's
    checkpoints into vLLM's export fields
    (:func:`~vllm_admission.plugin.runner.inpass_runner.mamba2_step_metadata`);
    ``ssd_combined._mamba_chunk_scan_combined_fwd`` (the CPU scan there) and
    ``mamba_mixer2.store_prefill_checkpoint`` (a Triton kernel) are replaced by the
    CPU pieces of :mod:`~vllm_admission.plugin.runner.mamba2_export`, so that
    ``MambaMixer2.conv_ssm_forward`` runs unchanged.
    """
    from functools import partial

    from vllm.model_executor.layers.mamba import mamba_mixer2
    from vllm.model_executor.layers.mamba.ops import ssd_combined
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionMetadataBuilder

    from vllm_admission.plugin.runner.inpass_runner import mamba2_step_metadata
    from vllm_admission.plugin.runner.mamba2_export import scan_with_chunk_states, store_checkpoints

    if not current_platform.is_cpu():
        return
    if getattr(ssd_combined._mamba_chunk_scan_combined_fwd, "_admission_original", None) is None:
        scan = partial(scan_with_chunk_states, ssd_combined._mamba_chunk_scan_combined_fwd)
        scan._admission_original = scan.args[0]  # type: ignore[attr-defined]
        ssd_combined._mamba_chunk_scan_combined_fwd = scan
    mamba_mixer2.store_prefill_checkpoint = store_checkpoints
    built = Mamba2AttentionMetadataBuilder.build
    if getattr(built, "_admission_step", None) is channel:
        return
    original_build = getattr(built, "_admission_original", built)

    def build(self: Any, common_prefix_len: int, common_attn_metadata: Any, fast_build: bool = False,
              **kwargs: Any) -> Any:
        md = original_build(self, common_prefix_len, common_attn_metadata, fast_build, **kwargs)
        if channel.plan and md.num_prefills:
            computed, _ = self._prefill_cpu_metadata(common_attn_metadata, common_attn_metadata.num_reqs,
                                                     md.num_prefills, md.num_decode_tokens)
            md = mamba2_step_metadata(md, channel.plan, block_size=self.kv_cache_spec.block_size,
                                      computed=computed.tolist(),
                                      block_table=common_attn_metadata.block_table_tensor, chunk_size=None)
        return md

    build._admission_step = channel  # type: ignore[attr-defined]
    build._admission_original = original_build  # type: ignore[attr-defined]
    Mamba2AttentionMetadataBuilder.build = build


def wrap_mamba2_spec(transform: Callable[[Any], Any]) -> None:
    """Wrap ``MambaMixer2.get_kv_cache_spec`` (process-wide, once) so that it returns
    ``transform(spec)``; :func:`vllm_admission.plugin.cpu_mamba2.install` decides when."""
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2

    if mamba2_spec_wrapped():
        return
    original = MambaMixer2.get_kv_cache_spec

    def get_kv_cache_spec(self: Any, vllm_config: Any) -> Any:
        return transform(original(self, vllm_config))

    get_kv_cache_spec._admission_original = original  # type: ignore[attr-defined]
    MambaMixer2.get_kv_cache_spec = get_kv_cache_spec


def mamba2_spec_wrapped() -> bool:
    """Whether :func:`wrap_mamba2_spec` has wrapped ``MambaMixer2.get_kv_cache_spec`` here."""
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2

    return getattr(MambaMixer2.get_kv_cache_spec, "_admission_original", None) is not None


def register_env_vars(names: Sequence[str], getter: Callable[[], Any]) -> None:
    """Add ``names`` to ``vllm.envs.environment_variables`` (idempotent), so vLLM's
    environment validation accepts them (``Platform.validate_environ``)."""
    import vllm.envs as envs

    for name in names:
        envs.environment_variables.setdefault(name, getter)


def inprocess_scheduler(llm: Any) -> Any:
    """The live ``vllm.v1.core.sched.scheduler.Scheduler`` (or subclass) of a ``vllm.LLM``.

    Path: ``llm.llm_engine.engine_core`` is an ``InprocClient`` when the engine
    core runs in this process; its ``.engine_core`` is the ``EngineCore`` whose
    ``.scheduler`` holds ``kv_cache_manager`` -> ``coordinator`` /
    ``block_pool``.

    Raises:
        RuntimeError: if the engine core runs in another process
            (``VLLM_ENABLE_V1_MULTIPROCESSING=1``).
    """
    client = llm.llm_engine.engine_core
    core = getattr(client, "engine_core", None)
    scheduler = getattr(core, "scheduler", None)
    if scheduler is None:
        raise RuntimeError(
            "the engine core runs in another process; build the engine with "
            "VLLM_ENABLE_V1_MULTIPROCESSING=0 to inspect its scheduler"
        )
    return scheduler


def cached_blocks(block_pool: Any) -> Iterator[tuple[Any, Any]]:
    """``(block hash with group id, block)`` for every block in vLLM's prefix cache.

    vLLM 0.32's ``BlockHashToBlockMap`` maps a key to one block or to a dict of
    duplicates; it has no public iterator, so this reads its ``_cache``.
    """
    for key, blocks in block_pool.cached_block_hash_to_block._cache.items():  # noqa: SLF001
        many = blocks.values() if isinstance(blocks, dict) else (blocks,)
        for block in many:
            yield key, block
