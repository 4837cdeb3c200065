"""The simulator set up like a started engine: its cost model (resolved dtypes) and geometry."""

from __future__ import annotations

import os
from typing import Any

from vllm_admission.core.adaptive import DEFAULT_INTERVAL
from vllm_admission.core.costs import ModelCosts
from vllm_admission.core.errors import UserError
from vllm_admission.core.geometry import geometry_from_blocks
from vllm_admission.core.layout import DEFAULT_CHECKPOINT
from vllm_admission.core.traces import Trace
from vllm_admission.core.tuning import DEFAULT_GRID, DEFAULT_MULTIPLIER
from vllm_admission.engine.engine_geometry import EngineGeometry
from vllm_admission.fidelity.spec import FidelityError

__all__ = ["costs_like_engine", "simulate_like_engine"]


#: Engine dtype settings (fields of :class:`EngineGeometry`), each passed to
#: ``ModelCosts.from_config`` as the keyword of the same name.
_DTYPE_KEYS = ("dtype", "kv_cache_dtype", "mamba_cache_dtype", "mamba_ssm_cache_dtype")


def costs_like_engine(config: str | os.PathLike | dict[str, Any],
                      geometry: EngineGeometry) -> ModelCosts:
    """The cost model of ``config`` with the dtypes the engine resolved.

    Args:
        config: the model's ``config.json`` (path) or its parsed dict.
        geometry: :func:`vllm_admission.engine.llm.engine_geometry` of the
            engine, with ``dtype``, ``kv_cache_dtype`` and ``mamba_cache_dtype`` set
            (``_run_engine`` sets them). Its ``mamba_ssm_cache_dtype`` is vLLM's
            setting after the platform's changes (``"float32"`` on CPUs with AVX-512
            BF16 when ``"auto"`` was asked for, ``vllm/platforms/cpu.py``
            ``check_and_update_config``). A dtype that is ``None`` counts as ``"auto"``.

    Returns:
        :meth:`ModelCosts.from_config` with those dtypes; its ``ssm_dtype``
        (and so its state page and aligned block size) is the engine's.

    Raises:
        FidelityError: the engine reports an allocated ``ssm_state_dtype``
            other than the one these settings resolve to.
        ModelConfigError: unreadable config or unknown dtype name.
    """
    kwargs = {key: str(getattr(geometry, key)) for key in _DTYPE_KEYS
              if getattr(geometry, key) is not None}
    costs = ModelCosts.from_config(config, mtp=geometry.speculative_method == "mtp", **kwargs)
    _check_ssm_dtype(costs, geometry)
    return costs


def _check_ssm_dtype(costs: ModelCosts, geometry: EngineGeometry) -> None:
    engine = geometry.ssm_state_dtype
    if engine is not None and engine != costs.ssm_dtype:
        raise FidelityError(
            f"the engine stores the SSM state of {costs.name} in {engine}, the simulator's cost "
            f"model in {costs.ssm_dtype} (mamba_ssm_cache_dtype {costs.mamba_ssm_cache_dtype!r}); "
            f"build it with costs_like_engine")


def simulate_like_engine(trace: Trace, costs: ModelCosts, geometry: EngineGeometry, *,
                         admission: str, eviction: str, alpha: float | None,
                         tune_multiplier: int = DEFAULT_MULTIPLIER, tune_grid: str = DEFAULT_GRID,
                         auto_interval: int = DEFAULT_INTERVAL,
                         checkpoint: str = DEFAULT_CHECKPOINT) -> Any:
    """Run the simulator with the engine's pool and settings; returns its ``RunResult``.

    ``geometry`` is :func:`vllm_admission.engine.llm.engine_geometry` of the engine (in
    process); the run takes its blocks, block size, token budget, retention interval,
    ``prefix_match_unit``, speculative tokens (the MTP layers' KV is in ``costs``),
    hidden-state group, async scheduling, prompt-end export and host tier (with the plugin's host admission
    policy). ``checkpoint``: the engine's checkpoint mode (``VLLM_ADMISSION_CHECKPOINT``).
    ``costs`` should come from :func:`costs_like_engine`. Output blocks are unique (the
    engine generates them); ``flop`` tunes alpha once, as the plugin does.

    Raises:
        FidelityError: the engine's allocated SSM state dtype (``ssm_state_dtype``, when
            known) is not ``costs.ssm_dtype``, or its KV cache groups or bytes per block
            differ from what the simulator derives for ``costs`` at that block size.
    """
    from vllm_admission.sim.simulation_settings import SimulationSettings
    from vllm_admission.sim.simulator import group_kinds, simulate

    if not geometry.kv_cache_groups:
        raise FidelityError("the engine's KV cache groups are unknown (engine core in another "
                            "process?); run with VLLM_ENABLE_V1_MULTIPROCESSING=0")
    _check_ssm_dtype(costs, geometry)
    engine_kinds = geometry.group_kinds
    bs, nb = geometry.block_size, geometry.num_gpu_blocks
    if nb is None:  # what geometry_from_blocks raises for it
        raise UserError(f"num_blocks must be a positive integer, got {nb!r}")
    geo = geometry_from_blocks(costs, nb, bs)
    hidden = geometry.hidden_state_bytes_per_token
    sim_kinds = group_kinds(costs, geo, hidden=bool(hidden))
    engine_bpb = geometry.bytes_per_block
    if sim_kinds != engine_kinds or geo.bytes_per_block != engine_bpb:
        raise FidelityError(
            f"the simulator's layout for {costs.name} (groups {sim_kinds}, {geo.bytes_per_block} "
            f"bytes per block) differs from the engine's (groups {engine_kinds}, {engine_bpb} "
            f"bytes per block)")
    settings = SimulationSettings.of(
        admission, eviction, num_blocks=nb, block_size=bs,
        chunk_size=geometry.max_num_batched_tokens, checkpoint=checkpoint,
        retention_interval=geometry.prefix_cache_retention_interval,
        hash_block_size=geometry.prefix_match_unit,
        num_speculative_tokens=0 if hidden else geometry.num_speculative_tokens,
        hidden_state_bytes_per_token=hidden, async_scheduling=geometry.async_scheduling,
        prompt_end_export=geometry.prompt_end_export,
        host_chunks=geometry.host_chunks, host_policy=geometry.host_policy or "lru",
        host_admission=geometry.host_admission if geometry.host_chunks else None,
        alpha=alpha, tune_multiplier=tune_multiplier, tune_grid=tune_grid, retune_every=0,
        auto_interval=auto_interval, outputs="unique", per_request=True)
    return simulate(trace, costs, settings)
