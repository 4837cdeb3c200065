"""In-pass recurrent-state checkpoints (``VLLM_ADMISSION_CHECKPOINT=inpass``).

In vLLM 0.32's align mode a Gated DeltaNet / Mamba state is written only where
a forward pass ends, so the scheduler ends a prefill chunk at every position
whose state is kept. In ``inpass`` mode the chunk runs on, and the states at
those positions are written during the same forward pass:

* **scheduler** (:func:`inpass_split`, :class:`InpassAllocation`,
  :func:`step_checkpoints`): the chunk ends only at the token budget (floored to
  a block, as vLLM does) and the prompt end. The positions where split mode
  would have ended it become checkpoints: each gets a real state block in every
  state group (in place of the null block align mode leaves there), cached by
  the stock ``cache_blocks`` path exactly as in split mode, and the step's list
  ``{running state block: ((offset in chunk, checkpoint block), ...)}`` rides on
  the step's ``SchedulerOutput``
  (:func:`vllm_admission.plugin.boundary.hooks.attach_step_checkpoints`).
* **runner** (:mod:`vllm_admission.plugin.runner.inpass_runner`, installed by
  :func:`vllm_admission.plugin.boundary.hooks.install_inpass_runner`):
  ``GPUModelRunner.execute_model`` (CPUModelRunner inherits it) is wrapped to
  publish that list for the step, and
  ``vllm.model_executor.layers.mamba.ops.cpu.gdn_attention._cpu_gdn_attention_nonspec``
  (the CPU GDN recurrent core, non-speculative) is wrapped so that, when a
  prefill sequence has checkpoints, the prefills go through
  :func:`~vllm_admission.plugin.runner.gdn_capture.gdn_prefill_with_capture`:
  the recurrent core (causal conv1d + chunked delta rule) runs in rounds cut at
  the checkpoint offsets, each later round starting from the state the earlier
  one left in the running slot, and after each round one
  :class:`~vllm_admission.plugin.state_copy.StateRowCopier` call copies the conv
  and SSM state rows into the checkpoint blocks. Decodes, projections,
  attention and MLP run once, as in vLLM.

This module changes no vLLM object: every hook is installed by
:mod:`vllm_admission.plugin.boundary.hooks`.

Mamba2 layers take the same list through vLLM's own prefill-checkpoint export
(:mod:`~vllm_admission.plugin.runner.mamba2_export`).

Under a multi-process executor (``vllm serve`` on the CPU build, tensor parallelism) the
runner lives in a worker process: the general plugin installs the same hooks there
(:func:`vllm_admission.plugin.boundary.register.install_inpass_runner_if_asked`), and the
list travels on the ``SchedulerOutput`` vLLM sends the workers each step.

On a CUDA GPU, the GDN layers' states are read from the Triton/FLA chunk kernel's own
per-chunk states (:mod:`~vllm_admission.plugin.runner.gdn_chunk_capture`). An H200 run of
``benchmarks/gpu/engine_check.py`` checked that path against split mode
(``benchmarks/results/gpu/engine-h200-all.json``): every cached state bit-identical, the
same hits and greedy tokens, fewer prefill passes.

Limits: CPU and CUDA platforms, Gated DeltaNet and Mamba2 layers, align mode, no
speculative decoding; on a GPU vLLM's V1 model runner, a block size that is a multiple of
64 and the Triton GDN prefill backend.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vllm_admission.core.cache import chunk_end

__all__ = ["CAPTURED_STATE_LAYERS", "InpassAllocation", "inpass_problems",
           "inpass_requested", "inpass_split",
           "split_stops", "state_layer_problems", "step_checkpoints"]


# ------------------------------------------------------------------ scheduler side
def split_stops(split: Callable[..., int], request: Any, start: int, end: int) -> list[int]:
    """The positions strictly inside ``[start, end)`` where split mode would end
    a chunk, found by calling ``split`` (a ``_mamba_block_aligned_split``-shaped
    function) from each stop in turn. Ascending token positions."""
    stops = []
    p = start
    base = request.num_computed_tokens
    while p < end:
        n = split(request, end - p, p - base, 0)
        if n <= 0:
            break
        p += n
        if p < end:
            stops.append(p)
    return stops


def inpass_split(scheduler: Any, split: Callable[..., int], plan: dict[str, tuple[int, list[int]]],
                 request: Any, num_new_tokens: int, num_new_local_computed_tokens: int = 0,
                 num_external_computed_tokens: int = 0, max_captures: int | None = None) -> int:
    """The in-pass replacement of ``Scheduler._mamba_block_aligned_split``.

    Ends the chunk where vLLM's align mode must (the token budget floored to a
    block before the prompt end, a block boundary when the chunk starts
    mid-block) but not at the positions ``split`` would stop at; those that are
    block-aligned are recorded in ``plan[request_id] = (start, positions)``.
    A stop that is not block-aligned still ends the chunk, and so does the stop
    after the first ``max_captures`` (``None``: no limit): each capture holds a
    state block per group for the step, and the pool must hold them
    (:func:`vllm_admission.core.geometry.inpass_capture_limit`, which the
    simulator applies too).

    Returns:
        The number of tokens to schedule (``<= num_new_tokens``).
    """
    rid = request.request_id
    plan.pop(rid, None)
    start = request.num_computed_tokens + num_new_local_computed_tokens + num_external_computed_tokens
    prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
    if num_new_tokens <= 0 or start >= prefill_end:
        return num_new_tokens
    B = scheduler.cache_config.block_size
    limit = scheduler.max_num_scheduled_tokens
    threshold = scheduler.scheduler_config.long_prefill_token_threshold
    if threshold > 0:
        limit = min(limit, threshold)
    end = chunk_end(start, start + num_new_tokens, prefill_end, B, limit)
    if end <= start:
        return max(end - start, 0)
    positions: list[int] = []
    for s in split_stops(split, request, start, end):
        if s % B or (max_captures is not None and len(positions) >= max_captures):
            end = s
            break
        positions.append(s)
    if positions:
        plan[rid] = (start, positions)
    return end - start


def _checkpoint_indices(manager: Any, plan: dict, request_id: str, num_tokens: int) -> list[int]:
    entry = plan.get(request_id)
    if entry is None:
        return []
    B = manager.block_size
    return [c // B - 1 for c in entry[1] if c < num_tokens]


class InpassAllocation:
    """A state-group manager's allocation with a real block at every planned checkpoint.

    :func:`vllm_admission.plugin.boundary.hooks.bind_inpass_managers` shadows the
    manager's ``get_num_blocks_to_allocate`` and ``allocate_new_blocks``
    (``MambaManager``, ``vllm/v1/core/single_type_kv_cache_manager.py``) with
    this object's methods, which take vLLM's arguments: the checkpoint blocks
    are counted before allocation and placed where align mode would put a null
    block.

    Args:
        manager: a Mamba/GDN group's manager (vLLM's ``MambaManager`` or the
            plugin's subclass: the shadows survive a re-typing).
        plan: the scheduler's ``{request id: (chunk start, checkpoint positions)}``.
    """

    def __init__(self, manager: Any, plan: dict[str, tuple[int, list[int]]]) -> None:
        self.manager = manager
        self.plan = plan

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int, new_computed_blocks: Any,
                                   total_computed_tokens: int, num_local_computed_tokens: int,
                                   num_tokens_main_model: int, apply_admission_cap: bool = False,
                                   prefill_end: int = 0) -> int:
        """vLLM's count plus the checkpoint blocks not yet held (null or beyond the table)."""
        manager = self.manager
        n = type(manager).get_num_blocks_to_allocate(
            manager, request_id, num_tokens, new_computed_blocks, total_computed_tokens,
            num_local_computed_tokens, num_tokens_main_model,
            apply_admission_cap=apply_admission_cap, prefill_end=prefill_end)
        held = len(manager.req_to_blocks.get(request_id, ())) + len(new_computed_blocks)
        blocks = manager.req_to_blocks.get(request_id, [])
        extra = sum(1 for i in _checkpoint_indices(manager, self.plan, request_id,
                                                   num_tokens_main_model)
                    if i >= held or (i < len(blocks) and blocks[i].is_null))
        return n + extra

    def allocate_new_blocks(self, request_id: str, num_tokens: int,
                            num_tokens_main_model: int) -> list:
        """vLLM's allocation, then a pool block in place of each null block at a checkpoint."""
        manager = self.manager
        blocks = manager.req_to_blocks[request_id]
        prev = len(blocks)
        new = type(manager).allocate_new_blocks(manager, request_id, num_tokens, num_tokens_main_model)
        wanted = [i for i in _checkpoint_indices(manager, self.plan, request_id, num_tokens_main_model)
                  if prev <= i < len(blocks) and blocks[i].is_null]
        if not wanted or [b.block_id for b in new] != [b.block_id for b in blocks[prev:]]:
            return new
        for i, block in zip(wanted, manager.block_pool.get_new_blocks(len(wanted)), strict=True):
            blocks[i] = block
        return blocks[prev:]


def step_checkpoints(managers: Sequence[Any], requests: dict[str, Any],
                     num_scheduled_tokens: dict[str, int],
                     plan: dict[str, tuple[int, list[int]]]) -> dict[int, tuple[tuple[int, int], ...]]:
    """The step's checkpoint list for the runner, taken (and cleared) from ``plan``.

    Call after allocation and before ``num_computed_tokens`` advances.

    Returns:
        ``{running state block id: ((offset, checkpoint block id), ...)}`` over
        every state group: ``offset`` is the number of tokens of the chunk whose
        state goes to the checkpoint block (ascending). Block ids are unique
        across groups (one pool), so the runner needs no group id.
    """
    out: dict[int, tuple[tuple[int, int], ...]] = {}
    for rid, (start, positions) in list(plan.items()):
        n = num_scheduled_tokens.get(rid)
        request = requests.get(rid)
        if not n or request is None or request.num_computed_tokens != start:
            continue
        end = start + n
        for manager in managers:
            blocks = manager.req_to_blocks.get(rid, [])
            B = manager.block_size
            run_idx = (end - 1) // B
            if run_idx >= len(blocks) or blocks[run_idx].is_null:
                continue
            pairs = tuple((c - start, blocks[c // B - 1].block_id) for c in positions
                          if c < end and not blocks[c // B - 1].is_null)
            if pairs:
                out[blocks[run_idx].block_id] = pairs
    plan.clear()
    return out


#: The state-layer kinds whose prefill the in-pass runner captures (vLLM's
#: ``MambaAttentionBackendEnum`` member names, ``v1/attention/backends/registry.py``):
#: Gated DeltaNet, run in segments (:mod:`~vllm_admission.plugin.runner.gdn_capture`), and
#: Mamba2, through vLLM's export (:mod:`~vllm_admission.plugin.runner.mamba2_export`).
CAPTURED_STATE_LAYERS = ("GDN_ATTN", "MAMBA2")


def state_layer_problems(specs: Any) -> list[str]:
    """Why ``inpass`` cannot capture these state layers (empty: it can).

    ``specs``: the engine's KV cache specs (``kv_cache_config.kv_cache_groups[i].kv_cache_spec``);
    every ``MambaSpec`` among them must be of a kind in :data:`CAPTURED_STATE_LAYERS`
    (``mamba_type``). The model config's ``layer_types`` cannot tell: transformers lists
    Nemotron-H's Mamba2 layers as ``linear_attention``, as it lists Gated DeltaNet layers.
    """
    kinds = sorted({getattr(s.mamba_type, "name", str(s.mamba_type)) for s in specs
                    if hasattr(s, "mamba_type")} - set(CAPTURED_STATE_LAYERS))
    if not kinds:
        return []
    return [f"state layers of kind {', '.join(kinds)} (the in-pass runner captures "
            f"{' and '.join(CAPTURED_STATE_LAYERS)} layers only)"]


def _gpu_problems(vllm_config: Any) -> list[str]:
    """Why ``inpass`` cannot run on this CUDA engine (empty: it can)."""
    from vllm_admission.plugin.runner.gdn_chunk_capture import gpu_block_size_problem

    problems = []
    if getattr(vllm_config, "use_v2_model_runner", False):
        problems.append("vLLM's V2 model runner (in-pass wraps the V1 GPUModelRunner: "
                        "VLLM_USE_V2_MODEL_RUNNER=0)")
    hf = getattr(vllm_config.model_config, "hf_text_config", None)
    if getattr(hf, "linear_key_head_dim", None) is not None:      # Gated DeltaNet layers
        from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import (
            _resolve_gdn_prefill_backend,
        )

        backend = _resolve_gdn_prefill_backend(vllm_config)[1]
        if backend != "triton":
            problems.append(f"the GDN prefill backend {backend!r} (in-pass reads the Triton/FLA "
                            "kernel's chunk states: --additional-config "
                            "'{\"gdn_prefill_backend\": \"triton\"}')")
        block = gpu_block_size_problem(int(vllm_config.cache_config.block_size))
        if block is not None:
            problems.append(block)
    return problems


def inpass_requested(vllm_config: Any) -> bool:
    """Whether the engine's scheduler is the plugin's with ``VLLM_ADMISSION_CHECKPOINT=inpass``:
    its settings object when the class was built with them
    (:meth:`AdmissionScheduler.configured
    <vllm_admission.plugin.scheduler.AdmissionScheduler.configured>`), else the environment
    when the class is named. Read where the scheduler does not exist yet (the KV cache specs
    are computed before it is built)."""
    from vllm_admission.core.settings import SettingsError, setting_from_env

    cls = getattr(vllm_config.scheduler_config, "scheduler_cls", None)
    settings = getattr(cls, "admission_settings", None)
    if settings is not None:
        return settings.checkpoint == "inpass"
    if isinstance(cls, str) and cls.startswith("vllm_admission"):
        try:
            return bool(setting_from_env("checkpoint") == "inpass")
        except SettingsError:
            return False   # the scheduler refuses the value, in one line
    return False


def inpass_problems(vllm_config: Any) -> list[str]:
    """Why ``inpass`` cannot run with this engine (empty: it can); the scheduler
    adds the problems of its KV cache groups (:func:`state_layer_problems`, partial
    hashes, Mamba checkpoint blocks)."""
    from vllm.platforms import current_platform

    problems = []
    if current_platform.is_cuda():
        problems += _gpu_problems(vllm_config)
    elif not current_platform.is_cpu():
        problems.append(f"platform {current_platform.device_type!r} (in-pass runs on the CPU "
                        "and CUDA platforms)")
    if vllm_config.cache_config.mamba_cache_mode != "align":
        problems.append(f"mamba_cache_mode={vllm_config.cache_config.mamba_cache_mode!r} (needs 'align')")
    if vllm_config.speculative_config is not None:
        problems.append("speculative decoding")
    if current_platform.is_cpu():
        try:
            from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention
            from vllm.v1.worker.gpu_model_runner import GPUModelRunner
        except ImportError as exc:  # pragma: no cover - other vLLM builds
            problems.append(f"vLLM lacks the CPU GDN op ({exc})")
        else:
            if not hasattr(gdn_attention, "_cpu_gdn_attention_nonspec") or not hasattr(
                    GPUModelRunner, "execute_model"):
                problems.append("this vLLM lacks _cpu_gdn_attention_nonspec or "
                                "GPUModelRunner.execute_model")
    return problems
