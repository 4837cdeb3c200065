"""What of vLLM the plugin relies on, and the checks that the installed vLLM still has it.

:mod:`vllm_admission.plugin.boundary.hooks` makes every change to a vLLM object; this module
lists what those changes (and the plugin's reads and overrides) rely on, and checks it:

* :func:`check_version`, :func:`unsupported_reason`: vLLM 0.32.x and 0.33.x are supported.
  Another version gets one line: the AdmissionScheduler refuses to start when a setting
  asks for anything but vLLM's own behaviour, and otherwise builds vLLM's own scheduler
  class instead of itself (no override of the plugin's is active);
* :data:`PRIVATE_MEMBERS`: each private (or undocumented) member relied on, with the vLLM
  file it comes from and how it is used; :func:`missing_members` checks the installed vLLM
  still has every class member (instance attributes are checked on a live engine by the
  tests);
* :data:`OVERRIDES`: the plugin's method for each vLLM method it overrides or shadows;
  :func:`override_mismatches` checks that each accepts the arguments vLLM passes.

``tests/test_plugin_scheduler.py`` runs both checks against the installed vLLM.
Nothing here changes a vLLM object.
"""

from __future__ import annotations

from typing import Any

from vllm_admission.core.settings import STOCK_SETTINGS, SettingsError

__all__ = [
    "OVERRIDES",
    "PRIVATE_MEMBERS",
    "SUPPORTED_VLLM",
    "UnsupportedVllmError",
    "accepts",
    "check_version",
    "installed_version",
    "missing_members",
    "override_mismatches",
    "supported_text",
    "unsupported_reason",
]

#: The vLLM release lines the plugin supports (``major.minor``).
SUPPORTED_VLLM: tuple[str, ...] = ("0.32", "0.33")

#: ``(file under vllm/, qualified member, how the plugin uses it)`` for every
#: private (or undocumented) member of vLLM the plugin overrides, calls or reads.
PRIVATE_MEMBERS: tuple[tuple[str, str, str], ...] = (
    ("v1/worker/gpu_model_runner.py", "copy_kv_cache_blocks_inplace",
     "replaced (the name the runner calls): block copies of whole shared pages"),
    ("v1/worker/mamba_utils.py", "MambaSpecDecodeGPUContext._populate_metadata",
     "wrapped on the CPU platform: keeps the state tensors and block tables"),
    ("v1/worker/mamba_utils.py", "MambaSpecDecodeGPUContext.run_fused_precopy",
     "replaced on the CPU platform (a Triton kernel there): torch state copy"),
    ("v1/worker/mamba_utils.py", "MambaSpecDecodeGPUContext.run_fused_postprocess",
     "replaced on the CPU platform (a Triton kernel there): torch state copy"),
    ("v1/worker/mamba_utils.py", "_get_mamba_spec_for_layer",
     "read by the CPU state copies' metadata wrap"),
    ("model_executor/layers/mamba/mamba_mixer2.py", "causal_conv1d_update",
     "wrapped on the CPU platform: drafts' num_accepted_tokens honoured"),
    ("engine/arg_utils.py", "EngineArgs.create_engine_config",
     "wrapped where the user asks for the plugin: its settings are checked against the "
     "VllmConfig before the model loads"),
    ("platforms/cpu.py", "CpuPlatform.check_and_update_config",
     "wrapped on the CPU platform: once the KV cache is sized, a re-check keeps the block "
     "size (EngineCoreProc re-runs VllmConfig.__post_init__ after its handshake)"),
    ("v1/engine/core.py", "EngineCoreProc._perform_handshakes",
     "read (the re-check it runs is why the block size needs keeping)"),
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
     "overridden: one free batch per request"),
    ("v1/core/kv_cache_coordinator.py", "HybridKVCacheCoordinator.remove_skipped_blocks",
     "overridden: one free batch for retired state blocks"),
    ("v1/core/kv_cache_coordinator.py", "HybridKVCacheCoordinator.pop_blocks_for_free",
     "overridden: values deferred frees"),
    ("v1/core/single_type_kv_cache_manager.py", "MambaManager.cache_blocks",
     "overridden: caches only the admitted states (replay_boundaries)"),
    ("v1/core/single_type_kv_cache_manager.py", "MambaManager._cache_partial_tail_block",
     "overridden: the state at the prompt's unit end keyed only where the policy keeps it"),
    ("v1/core/single_type_kv_cache_manager.py", "FullAttentionManager._cache_partial_tail_block",
     "overridden: the attention key at the prompt's unit end only where the policy keeps its state"),
    ("v1/core/block_pool.py", "BlockPool.cache_full_blocks",
     "overridden: records the states that got a hash"),
    ("v1/core/block_pool.py", "BlockPool.cache_partial_block",
     "overridden: reports a block's first key given there (the prompt's unit end) to a hash-keyed "
     "eviction policy"),
    ("v1/core/block_pool.py", "BlockPool.move_block_hashes",
     "overridden: reports the first key a block copy takes over to a hash-keyed eviction "
     "policy"),
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
    ("v1/core/kv_cache_manager.py", "KVCacheManager.get_computed_blocks",
     "called by AdmissionScheduler._get_local_prefix_cache_hit when a connector took a "
     "divergent hybrid hit (the local hybrid hit and junction the policy plans from), and "
     "shadowed on the instance under such a connector (hooks.bind_fallback_junction)"),
    ("v1/core/kv_cache_manager.py", "KVCacheManager.get_computed_blocks_for_connector",
     "relied on: vLLM's lookup for a connector with supports_divergent_local_hybrid_hits, "
     "whose fallback calls get_computed_blocks"),
    ("v1/kv_cache_interface.py", "HiddenStateCacheSpec",
     "read by group_kinds: a FullAttentionManager group with this spec is 'hidden'"),
    ("distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py",
     "ExampleHiddenStatesConnector._submit_async_write",
     "overridden by CPUHiddenStatesConnector (CPU copy); it reads the instance attributes "
     "_is_tp_rank_zero, _kv_cache, _block_size, _req_futures, _lock_fds, _executor, "
     "_req_copy_events, use_lock"),
    ("distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py",
     "ExampleHiddenStatesConnector._write_tensors",
     "called by CPUHiddenStatesConnector: the writer thread's file write and lock release"),
    ("distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py",
     "ExampleHiddenStatesConnector._on_write_done",
     "called by CPUHiddenStatesConnector: the write's completion callback"),
    ("distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py",
     "extract_from_kv_cache", "called by CPUHiddenStatesConnector: the states by slot"),
    ("v1/kv_offload/cpu/spec.py", "CPUOffloadingSpec.get_worker",
     "overridden by HostCopyOffloadingSpec (host copies off CUDA/XPU); it reads the instance "
     "attributes _worker, num_chunks, blocks_per_chunk"),
    ("distributed/kv_transfer/kv_connector/v1/offloading_connector.py",
     "OffloadingConnector.connector_scheduler",
     "read by offload_config.host_tier (instance attribute): the connector's scheduler side"),
    ("v1/kv_offload/cpu/manager.py", "CPUOffloadingManager._num_chunks",
     "read by offload_config.host_tier (instance attribute): the host tier's chunks"),
    ("v1/kv_offload/cpu/policies/base.py", "CachePolicy.evict",
     "implemented by host_policy.AdmissionHostPolicy (an out-of-tree host policy, an "
     "experimental vLLM interface), with get, insert, remove, touch, on_store_miss, "
     "on_request_finished, clear, mark_evictable, mark_non_evictable"),
    ("v1/kv_offload/cpu/policies/base.py", "order_request_keys",
     "called by host_policy.AdmissionHostPolicy: a finished request's keys head to tail"),
    ("v1/kv_offload/cpu/policies/base.py", "ChunkStatus.ref_cnt",
     "read by host_policy.AdmissionHostPolicy: a chunk in transfer is pinned"),
)

# Members that are instance attributes (checked on a live object, not the class).
_INSTANCE_ATTRIBUTES = frozenset({
    "HybridKVCacheCoordinator.single_type_managers", "BlockPool.free_block_queue",
    "BlockHashToBlockMap._cache", "environment_variables", "MambaManager.req_to_blocks",
    "LLMEngine.engine_core", "InprocClient.engine_core", "EngineCore.scheduler",
    "OffloadingConnector.connector_scheduler", "CPUOffloadingManager._num_chunks",
})


class UnsupportedVllmError(SettingsError):
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
            f"(valid here: {STOCK_SETTINGS})")
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
    ("FullAttentionManager._cache_partial_tail_block",
     "vllm_admission.plugin.kv_cache:PolicyAttentionManager._cache_partial_tail_block"),
    ("BlockPool.cache_full_blocks", "vllm_admission.plugin.kv_cache:AdmissionBlockPool.cache_full_blocks"),
    ("BlockPool.cache_partial_block",
     "vllm_admission.plugin.kv_cache:AdmissionBlockPool.cache_partial_block"),
    ("BlockPool.move_block_hashes",
     "vllm_admission.plugin.kv_cache:AdmissionBlockPool.move_block_hashes"),
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
    ("ExampleHiddenStatesConnector._submit_async_write",
     "vllm_admission.plugin.repairs.cpu_hidden_states:CPUHiddenStatesConnector."
     "_submit_async_write"),
    ("CPUOffloadingSpec.get_worker",
     "vllm_admission.plugin.repairs.cpu_offload:HostCopyOffloadingSpec.get_worker"),
    *(("CachePolicy." + name, "vllm_admission.plugin.boundary.host_policy:AdmissionHostPolicy."
       + name)
      for name in ("get", "insert", "remove", "touch", "on_store_miss", "on_request_finished",
                   "evict", "clear", "mark_evictable", "mark_non_evictable")),
)


def _hidden_states_connector() -> Any:
    from vllm.distributed.kv_transfer.kv_connector.v1 import example_hidden_states_connector

    return example_hidden_states_connector.ExampleHiddenStatesConnector


def _cpu_offloading_spec() -> Any:
    from vllm.v1.kv_offload.cpu import spec

    return spec.CPUOffloadingSpec


def _cache_policy() -> Any:
    from vllm.v1.kv_offload.cpu.policies import base

    return base.CachePolicy


def accepts(theirs: Any, ours: Any) -> list[str]:
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
              "MambaManager": stkm.MambaManager,
              "FullAttentionManager": stkm.FullAttentionManager,
              "ExampleHiddenStatesConnector": _hidden_states_connector(),
              "CPUOffloadingSpec": _cpu_offloading_spec(), "CachePolicy": _cache_policy()}
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
        out += [f"{qual} vs vLLM's {member}: {p}" for p in accepts(theirs, ours)]
    return out
