"""Every change vllm_admission makes to a vLLM object, in one module.

The plugin enters vLLM through two documented doors, ``--scheduler-cls``
(:class:`~vllm_admission.plugin.scheduler.AdmissionScheduler` subclasses
vLLM's ``Scheduler``) and the ``vllm.general_plugins`` /
``vllm.stat_logger_plugins`` entry points. Everything beyond that, the live
objects it changes and the private members it reads, is done here, behind the
version check of :mod:`vllm_admission.plugin.boundary.surface`:

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
  platform (:mod:`vllm_admission.plugin.repairs.cpu_mamba2`: no prefill-checkpoint export);
* :func:`install_cpu_spec_decode`: on vLLM's CPU platform, the speculative-decoding
  state copies and the Mamba2 conv update under drafts, which the CPU build lacks
  (:mod:`vllm_admission.plugin.repairs.cpu_spec_decode`);
* :func:`wrap_schedule`: observes each step's output on one scheduler
  instance (:class:`vllm_admission.engine.llm.PrefillStepCounter`);
* :func:`install_preflight`: ``EngineArgs.create_engine_config``, so that the
  plugin's settings are checked against the ``VllmConfig`` before the model
  loads, where the user asked for the plugin;
* :func:`register_env_vars`: adds the plugin's variables to
  ``vllm.envs.environment_variables``;
* :func:`cached_blocks`: iterates vLLM's block-hash map (no public iterator);
  :func:`inprocess_scheduler`: the live scheduler of an in-process ``LLM``.

:data:`vllm_admission.plugin.boundary.surface.PRIVATE_MEMBERS` lists every private
member these changes (and the plugin's reads and overrides) rely on, with the
vLLM file it comes from; ``vllm_surface`` also checks that the installed vLLM
still has each one and that every override accepts the arguments vLLM passes.
``tests/test_import_graph.py`` checks that no other plugin module stores an
attribute on a vLLM object.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

__all__ = [
    "INPASS_ATTR",
    "attach_step_checkpoints",
    "bind_chunk_split",
    "bind_inpass_managers",
    "cached_blocks",
    "inprocess_scheduler",
    "install",
    "bind_fallback_junction",
    "block_copy_installed",
    "cpu_spec_decode_installed",
    "install_block_copy",
    "install_cpu_spec_decode",
    "install_inpass_runner",
    "install_preflight",
    "preflight_installed",
    "mamba2_spec_wrapped",
    "register_env_vars",
    "step_checkpoints_of",
    "use_policy_managers",
    "wrap_mamba2_spec",
    "wrap_schedule",
]

# ---------------------------------------------------------------- live objects
def _retype(obj: Any, base: type, cls: type) -> None:
    if type(obj) is not base:
        raise TypeError(f"vllm_admission expected vLLM's {base.__name__}, found "
                        f"{type(obj).__module__}.{type(obj).__name__}")
    obj.__class__ = cls


def use_policy_managers(coordinator: Any, control: Any) -> None:
    """Give the state and full-attention groups the manager classes the control's
    current policy needs: vLLM's own ``MambaManager`` and ``FullAttentionManager`` for a
    ``vllm_native`` policy, :class:`~vllm_admission.plugin.kv_cache.PolicyMambaManager`
    and :class:`~vllm_admission.plugin.kv_cache.PolicyAttentionManager` otherwise
    (subclasses of the full-attention manager, sliding window and the like, keep
    their class)."""
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager, MambaManager

    from vllm_admission.plugin.kv_cache import PolicyAttentionManager, PolicyMambaManager

    state = MambaManager if control.requests.stock else PolicyMambaManager
    attention = FullAttentionManager if control.requests.stock else PolicyAttentionManager
    for manager in coordinator.single_type_managers:
        if isinstance(manager, MambaManager):
            manager.__class__ = state
            manager._admission = control
        elif type(manager) in (FullAttentionManager, PolicyAttentionManager):
            manager.__class__ = attention
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
    if control.events.eviction_policy is not None:
        queue = PolicyFreeBlockQueue(pool.free_block_queue.get_all_free_blocks(),
                                     control.events.eviction_policy, clock=control.clock,
                                     switchable=control.background.controller is not None)
        pool.free_block_queue = queue
        if control.reads_values:
            # Values are made per request as it frees its blocks; a policy without
            # values keeps vLLM's coordinator (the free batches would cost every step).
            _retype(coordinator, HybridKVCacheCoordinator, AdmissionCoordinator)
            coordinator._admission = control
            queue.free_stamp_maker = control.free_stamp
            coordinator._admission_queue = queue

    def is_cached_state(block_hash: Any, group: int) -> bool:
        return pool.cached_block_hash_to_block.get_one_block(
            make_block_hash_with_group_id(block_hash, group)) is not None

    control.bind_pool(is_cached_state, lambda block: get_group_id(block.block_hash))
    return coordinator


def bind_chunk_split(scheduler: Any, split: Callable[..., int] | None) -> None:
    """Shadow ``Scheduler._mamba_block_aligned_split`` on ``scheduler`` with
    ``split`` (the policy has extra chunk stops), or remove the shadow (``None``),
    so that other policies pay nothing per request and step."""
    if split is not None:
        scheduler._mamba_block_aligned_split = split
    else:
        scheduler.__dict__.pop("_mamba_block_aligned_split", None)


def bind_fallback_junction(kv_cache_manager: Any, pending: dict[str, int]) -> None:
    """Shadow ``KVCacheManager.get_computed_blocks`` on one instance so that the lookup
    vLLM's scheduler falls back to after a divergent hybrid hit the connector did not
    back (``scheduler.py``: ``hit_diverged and num_external_computed_tokens == 0``)
    stores the policy's junction on the request, not vLLM's: a request id in
    ``pending`` gets that junction once (the entry is popped); any other lookup is
    vLLM's unchanged."""
    original = kv_cache_manager.get_computed_blocks

    def get_computed_blocks(request: Any, *args: Any, **kwargs: Any) -> Any:
        blocks, num_local, boundary = original(request, *args, **kwargs)
        junction = pending.pop(request.request_id, None)
        return blocks, num_local, boundary if junction is None else junction

    kv_cache_manager.get_computed_blocks = get_computed_blocks


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
    """Wrap ``GPUModelRunner.execute_model`` and the state layers' prefill paths
    (process-wide, idempotent).

    The wrappers share one
    :class:`~vllm_admission.plugin.runner.inpass_runner.StepCheckpoints`:
    ``execute_model`` publishes the step's list (:func:`step_checkpoints_of`), and the
    GDN layers capture the states it names: on the CPU platform vLLM's CPU core
    (:func:`_install_cpu_gdn_core`), on a GPU the Triton/FLA path
    (:func:`_install_gdn_chunk_capture`); Mamba2 layers take it through vLLM's own
    prefill-checkpoint export (:func:`_install_mamba2_export`). Without a list, or when
    no prefill of the step has a checkpoint, every wrapper calls vLLM's function
    unchanged.

    Returns:
        The shared ``StepCheckpoints`` (the one installed earlier, if any).
    """
    from vllm.platforms import current_platform
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_admission.plugin.runner.inpass_runner import StepCheckpoints

    channel = getattr(GPUModelRunner.execute_model, "_admission_step", None)
    if channel is None:
        channel = StepCheckpoints()
        original_execute = GPUModelRunner.execute_model

        def execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            channel.plan = step_checkpoints_of(scheduler_output)
            return original_execute(self, scheduler_output, *args, **kwargs)

        execute_model._admission_step = channel  # type: ignore[attr-defined]
        GPUModelRunner.execute_model = execute_model
    if current_platform.is_cpu():
        _install_cpu_gdn_core(channel)
    else:
        _install_gdn_chunk_capture(channel)
    _install_mamba2_export(channel)
    return channel


def _vllm_original(fn: Any) -> Any:
    """vLLM's own function behind ``fn``: the one a wrapper installed here names as its
    ``_admission_original``, else ``fn`` itself (so installing again never wraps a wrapper)."""
    return getattr(fn, "_admission_original", fn)


def _install_cpu_gdn_core(channel: Any) -> None:
    """The CPU GDN half of :func:`install_inpass_runner` (idempotent): vLLM's CPU core
    ``gdn_attention._cpu_gdn_attention_nonspec`` runs
    :func:`~vllm_admission.plugin.runner.inpass_runner.segmented_core` when a prefill of
    the step has checkpoints."""
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention

    from vllm_admission.plugin.runner.inpass_runner import segmented_core

    if getattr(gdn_attention._cpu_gdn_attention_nonspec, "_admission_step", None) is not channel:
        original_core = _vllm_original(gdn_attention._cpu_gdn_attention_nonspec)

        def core(layer: Any, md: Any, mixed_qkv: Any, b: Any, a: Any, core_attn_out: Any) -> None:
            plan = channel.plan
            if not plan or not md.num_prefills or not segmented_core(
                    original_core, plan, layer, md, mixed_qkv, b, a, core_attn_out,
                    channel.copiers):
                original_core(layer, md, mixed_qkv, b, a, core_attn_out)

        core._admission_step = channel  # type: ignore[attr-defined]
        core._admission_original = original_core  # type: ignore[attr-defined]
        gdn_attention._cpu_gdn_attention_nonspec = core


def _install_gdn_chunk_capture(channel: Any) -> None:
    """The GPU GDN half of :func:`install_inpass_runner` (idempotent): the wrappers of
    :class:`~vllm_admission.plugin.runner.gdn_chunk_capture.GPUCapture` around
    ``GDNAttentionMetadataBuilder.build``, ``QwenGatedDeltaNetAttention._forward_core`` and
    the conv and chunk-rule functions of ``qwen_gdn_linear_attn``
    (``model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py``)."""
    from vllm.forward_context import get_forward_context
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as gdn
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder

    from vllm_admission.plugin.runner.gdn_chunk_capture import (
        GPUCapture,
        step_capture,
        with_capture,
    )

    built = GDNAttentionMetadataBuilder.build
    if getattr(built, "_admission_step", None) is channel:
        return
    capture = GPUCapture()

    def metadata_of(layer: Any) -> Any:
        md = get_forward_context().attn_metadata
        return md.get(layer.prefix) if isinstance(md, dict) else None

    for target, name, wrap in (
            (gdn.QwenGatedDeltaNetAttention, "_forward_core",
             lambda fn: capture.forward_core(fn, metadata_of)),
            (gdn, "causal_conv1d_fn", capture.conv_fn),
            (gdn, "fla_chunk_gated_delta_rule",
             lambda fn: capture.chunk_rule(fn, conv_state_dim_first=is_conv_state_dim_first))):
        vllm_fn = _vllm_original(getattr(target, name))
        new = wrap(vllm_fn)
        new._admission_original = vllm_fn  # type: ignore[attr-defined]  # a function attribute
        setattr(target, name, new)
    original_build = _vllm_original(built)

    def build(self: Any, common_prefix_len: int, common_attn_metadata: Any,
              fast_build: bool = False, **kwargs: Any) -> Any:
        md = original_build(self, common_prefix_len, common_attn_metadata, fast_build, **kwargs)
        if channel.plan and md.num_prefills and md.spec_sequence_masks is None:
            width = int(self.kv_cache_spec.shapes[0][0 if not is_conv_state_dim_first() else 1]) + 1
            found = step_capture(channel.plan, md.prefill_state_indices,
                                 md.prefill_query_start_loc.cpu(),
                                 decode_tokens=md.num_decode_tokens, conv_width=width)
            if found is not None:
                md = with_capture(md, found)
        return md

    build._admission_step = channel  # type: ignore[attr-defined]
    build._admission_original = original_build  # type: ignore[attr-defined]
    GDNAttentionMetadataBuilder.build = build


def _install_mamba2_export(channel: Any) -> None:
    """The Mamba2 half of :func:`install_inpass_runner` (idempotent).

    ``Mamba2AttentionMetadataBuilder.build`` is wrapped to put the step's
    checkpoints into vLLM's export fields
    (:func:`~vllm_admission.plugin.runner.inpass_runner.mamba2_step_metadata`; on a GPU
    with the builder's SSD chunk size, a chunk ending at every checkpoint);
    ``mamba_mixer2.store_prefill_checkpoint`` is replaced by
    :func:`~vllm_admission.plugin.runner.mamba2_export.store_checkpoints` (several entries
    per row; vLLM's Triton kernel on a GPU) and, on the CPU platform,
    ``ssd_combined._mamba_chunk_scan_combined_fwd`` (the CPU scan) by
    :func:`~vllm_admission.plugin.runner.mamba2_export.scan_with_chunk_states`, so that
    ``MambaMixer2.conv_ssm_forward`` runs unchanged.
    """
    from functools import partial

    from vllm.model_executor.layers.mamba import mamba_mixer2
    from vllm.model_executor.layers.mamba.ops import ssd_combined
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionMetadataBuilder

    from vllm_admission.plugin.runner.inpass_runner import mamba2_step_metadata
    from vllm_admission.plugin.runner.mamba2_export import scan_with_chunk_states, store_checkpoints

    on_cpu = current_platform.is_cpu()
    if on_cpu and getattr(ssd_combined._mamba_chunk_scan_combined_fwd, "_admission_original",
                          None) is None:
        scan = partial(scan_with_chunk_states, ssd_combined._mamba_chunk_scan_combined_fwd)
        scan._admission_original = scan.args[0]  # type: ignore[attr-defined]
        ssd_combined._mamba_chunk_scan_combined_fwd = scan
    mamba_mixer2.store_prefill_checkpoint = store_checkpoints
    built = Mamba2AttentionMetadataBuilder.build
    if getattr(built, "_admission_step", None) is channel:
        return
    original_build = _vllm_original(built)

    def build(self: Any, common_prefix_len: int, common_attn_metadata: Any, fast_build: bool = False,
              **kwargs: Any) -> Any:
        md = original_build(self, common_prefix_len, common_attn_metadata, fast_build, **kwargs)
        if channel.plan and md.num_prefills:
            computed, _ = self._prefill_cpu_metadata(common_attn_metadata, common_attn_metadata.num_reqs,
                                                     md.num_prefills, md.num_decode_tokens)
            md = mamba2_step_metadata(md, channel.plan, block_size=self.kv_cache_spec.block_size,
                                      computed=computed.tolist(),
                                      block_table=common_attn_metadata.block_table_tensor,
                                      chunk_size=None if on_cpu else self.chunk_size)
        return md

    build._admission_step = channel  # type: ignore[attr-defined]
    build._admission_original = original_build  # type: ignore[attr-defined]
    Mamba2AttentionMetadataBuilder.build = build


def wrap_mamba2_spec(transform: Callable[[Any, Any], Any]) -> None:
    """Wrap ``MambaMixer2.get_kv_cache_spec`` (process-wide, once) so that it returns
    ``transform(spec, vllm_config)``; :func:`vllm_admission.plugin.repairs.cpu_mamba2.install`
    (CPU) and :func:`vllm_admission.plugin.boundary.register.install_gpu_export_off` (CUDA) decide when."""
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2

    if mamba2_spec_wrapped():
        return
    original = MambaMixer2.get_kv_cache_spec

    def get_kv_cache_spec(self: Any, vllm_config: Any) -> Any:
        return transform(original(self, vllm_config), vllm_config)

    get_kv_cache_spec._admission_original = original  # type: ignore[attr-defined]
    MambaMixer2.get_kv_cache_spec = get_kv_cache_spec


def wrap_platform_config_check(wrap: Callable[[Callable[[Any], None]], Callable[[Any], None]]) -> None:
    """Replace ``CpuPlatform.check_and_update_config`` (process-wide, once) by
    ``wrap(original)``; :mod:`vllm_admission.plugin.repairs.cpu_block_size` says why."""
    from vllm.platforms.cpu import CpuPlatform

    if platform_config_check_wrapped():
        return
    original = CpuPlatform.check_and_update_config  # bound to the class

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        wrapped(vllm_config)

    wrapped = wrap(original)
    check_and_update_config._admission_original = original  # type: ignore[attr-defined]
    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)


def platform_config_check_wrapped() -> bool:
    """Whether :func:`wrap_platform_config_check` has run in this process."""
    from vllm.platforms.cpu import CpuPlatform

    return getattr(CpuPlatform.check_and_update_config, "_admission_original", None) is not None


def restore_cache_sizes(cache_config: Any, sizes: dict[str, Any]) -> None:
    """Set ``cache_config``'s fields named in ``sizes`` back to those values (the CPU
    block-size keeper, :mod:`vllm_admission.plugin.repairs.cpu_block_size`)."""
    for name, value in sizes.items():
        if getattr(cache_config, name) != value:
            setattr(cache_config, name, value)


def install_preflight(check: Callable[[Any], None]) -> None:
    """Wrap ``EngineArgs.create_engine_config`` (process-wide, once) so that
    ``check(vllm_config)`` runs on every ``VllmConfig`` it returns, before the
    engine is built and the model loads (``LLM(...)`` and ``vllm serve`` both
    build their config there: ``vllm/engine/arg_utils.py``). ``check`` may raise;
    the config is returned unchanged otherwise.

    Installed by :func:`vllm_admission.plugin.boundary.register.register` only when the
    user asked for the plugin (module docstring there), and by
    :func:`vllm_admission.engine.llm.build_llm` for its own engines.
    """
    from vllm.engine.arg_utils import EngineArgs

    if preflight_installed():
        return
    original = EngineArgs.create_engine_config

    def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        vllm_config = original(self, *args, **kwargs)
        check(vllm_config)
        return vllm_config

    create_engine_config._admission_original = original  # type: ignore[attr-defined]
    EngineArgs.create_engine_config = create_engine_config


def preflight_installed() -> bool:
    """Whether :func:`install_preflight` has wrapped ``EngineArgs.create_engine_config`` here."""
    from vllm.engine.arg_utils import EngineArgs

    return getattr(EngineArgs.create_engine_config, "_admission_original", None) is not None


def install_cpu_spec_decode() -> None:
    """Give vLLM's CPU build the speculative-decoding state kernels it lacks (process-wide,
    once; :mod:`vllm_admission.plugin.repairs.cpu_spec_decode_ops`):
    ``MambaSpecDecodeGPUContext.run_fused_precopy`` / ``run_fused_postprocess`` (Triton
    kernels the CPU build has not; ``_populate_metadata`` is wrapped to keep the state
    tensors and block tables they copy between) and ``mamba_mixer2.causal_conv1d_update``
    with ``num_accepted_tokens`` (the CPU version drops it; without it the call goes to
    vLLM's function unchanged). :func:`vllm_admission.plugin.repairs.cpu_spec_decode.install`
    decides when."""
    from vllm.model_executor.layers.mamba import mamba_mixer2
    from vllm.model_executor.layers.mamba.mamba_utils import (
        get_conv_copy_spec,
        is_conv_state_dim_first,
    )
    from vllm.v1.worker import mamba_utils

    from vllm_admission.plugin.repairs import cpu_spec_decode_ops as ops

    if cpu_spec_decode_installed():
        return
    ctx = mamba_utils.MambaSpecDecodeGPUContext
    populate = ctx._populate_metadata

    def _populate_metadata(self: Any, kv_cache_config: Any, forward_context: Any,
                           copy_funcs: Any, block_tables: Any, aligned: Any) -> None:
        populate(self, kv_cache_config, forward_context, copy_funcs, block_tables, aligned)
        states = []
        for local, group_id in enumerate(self.mamba_group_ids):
            group = kv_cache_config.kv_cache_groups[group_id]
            for name in group.layer_names:
                spec = mamba_utils._get_mamba_spec_for_layer(group, name)
                tensors = forward_context[name].kv_cache
                for i, func in enumerate(copy_funcs[spec.mamba_type]):
                    states.append((tensors[i], func is get_conv_copy_spec, local))
        self._admission_states = states
        self._admission_tables = [ops.full_block_table(t) for t in block_tables]

    # vLLM's parameter names: its runner passes them by keyword.
    def run_fused_precopy(self: Any, num_reqs: int, state_idx_gpu: Any, src_col_gpu: Any,
                          token_bias_gpu: Any, idx_mapping: Any) -> None:
        if num_reqs == 0 or not self.is_initialized:
            return
        ops.precopy(self._admission_states, self._admission_tables, num_reqs, state_idx_gpu,
                    src_col_gpu, token_bias_gpu, idx_mapping,
                    conv_dim_first=is_conv_state_dim_first())

    def run_fused_postprocess(self: Any, num_reqs: int, num_accepted_tokens_gpu: Any,
                              mamba_state_idx_gpu: Any, num_scheduled_tokens_gpu: Any,
                              num_computed_tokens_gpu: Any, num_draft_tokens_gpu: Any) -> None:
        if num_reqs == 0 or not self.is_initialized:
            return
        ops.postprocess(self._admission_states, self._admission_tables, num_reqs,
                        self.block_size, num_accepted_tokens_gpu, mamba_state_idx_gpu,
                        num_scheduled_tokens_gpu, num_computed_tokens_gpu, num_draft_tokens_gpu,
                        self.num_accepted_tokens_out, conv_dim_first=is_conv_state_dim_first())

    conv_update = mamba_mixer2.causal_conv1d_update

    def causal_conv1d_update(x: Any, conv_state: Any, weight: Any, bias: Any = None,
                             activation: Any = None, *args: Any, **kwargs: Any) -> Any:
        accepted = kwargs.get("num_accepted_tokens")
        starts = kwargs.get("query_start_loc")
        if args or accepted is None or starts is None:
            return conv_update(x, conv_state, weight, bias, activation, *args, **kwargs)
        return ops.conv_update_spec(x, conv_state, weight, bias, activation,
                                    state_indices=kwargs["conv_state_indices"],
                                    num_accepted_tokens=accepted, query_start_loc=starts,
                                    null_block_id=kwargs.get("null_block_id", 0))

    for cls_or_module, name, new in ((ctx, "_populate_metadata", _populate_metadata),
                                     (ctx, "run_fused_precopy", run_fused_precopy),
                                     (ctx, "run_fused_postprocess", run_fused_postprocess),
                                     (mamba_mixer2, "causal_conv1d_update",
                                      causal_conv1d_update)):
        # The loop's functions have different signatures: mypy joins them into a union.
        new._admission_original = getattr(cls_or_module, name)  # type: ignore[union-attr]
        setattr(cls_or_module, name, new)


#: The modules whose model runner calls vLLM's block copy by this name (the V1 runner and
#: the newer ``v1/worker/gpu`` one).
_BLOCK_COPY_CALLERS = ("vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner")


def install_block_copy(copy: Any) -> None:
    """Make the model runners call ``copy`` instead of vLLM's
    ``copy_kv_cache_blocks_inplace`` (same signature), process-wide, once;
    :mod:`vllm_admission.plugin.repairs.block_copy` says why."""
    import importlib

    if block_copy_installed():
        return
    for name in _BLOCK_COPY_CALLERS:
        try:
            module: Any = importlib.import_module(name)  # Any: its copy function is replaced below
        except ImportError:  # pragma: no cover - a build without that runner
            continue
        original = getattr(module, "copy_kv_cache_blocks_inplace", None)
        if original is None:  # pragma: no cover
            continue

        def replaced(kv_caches: Any, num_blocks: int, copies: Any, _copy=copy) -> None:
            _copy(kv_caches, num_blocks, copies)
        replaced._admission_original = original  # type: ignore[attr-defined]
        module.copy_kv_cache_blocks_inplace = replaced


def block_copy_installed() -> bool:
    """Whether :func:`install_block_copy` has run in this process."""
    from vllm.v1.worker import gpu_model_runner

    return getattr(gpu_model_runner.copy_kv_cache_blocks_inplace, "_admission_original",
                   None) is not None


def cpu_spec_decode_installed() -> bool:
    """Whether :func:`install_cpu_spec_decode` has run in this process."""
    from vllm.v1.worker import mamba_utils

    return getattr(mamba_utils.MambaSpecDecodeGPUContext.run_fused_precopy,
                   "_admission_original", None) is not None


def mamba2_spec_wrapped() -> bool:
    """Whether :func:`wrap_mamba2_spec` has wrapped ``MambaMixer2.get_kv_cache_spec`` here."""
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2

    return getattr(MambaMixer2.get_kv_cache_spec, "_admission_original", None) is not None


def register_env_vars(names: Iterable[str], getter: Callable[[], Any]) -> None:
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
