"""The simulator set up like a started engine: its cost model (resolved dtypes) and geometry."""

from __future__ import annotations

import os
from typing import Any

from vllm_admission.core.adaptive import DEFAULT_INTERVAL
from vllm_admission.core.costs import ModelCosts
from vllm_admission.core.geometry import geometry_from_blocks
from vllm_admission.core.traces import Trace
from vllm_admission.fidelity.spec import FidelityError

__all__ = ["costs_like_engine", "simulate_like_engine"]


#: Engine dtype settings (keys of the engine geometry dict), each passed to
#: ``ModelCosts.from_config`` as the keyword of the same name.
_DTYPE_KEYS = ("dtype", "kv_cache_dtype", "mamba_cache_dtype", "mamba_ssm_cache_dtype")


def costs_like_engine(config: str | os.PathLike | dict[str, Any],
                      geometry: dict[str, Any]) -> ModelCosts:
    """The cost model of ``config`` with the dtypes the engine resolved.

    Args:
        config: the model's ``config.json`` (path) or its parsed dict.
        geometry: :func:`vllm_admission.engine.llm.engine_geometry` of the
            engine, optionally with ``dtype`` (model dtype, e.g.
            ``"bfloat16"``), ``kv_cache_dtype`` and ``mamba_cache_dtype``
            added (``_run_engine`` adds them). Its ``mamba_ssm_cache_dtype``
            is vLLM's setting after the platform's changes (``"float32"`` on
            CPUs with AVX-512 BF16 when ``"auto"`` was asked for,
            ``vllm/platforms/cpu.py`` ``check_and_update_config``). A key that
            is absent or None counts as ``"auto"``.

    Returns:
        :meth:`ModelCosts.from_config` with those dtypes; its ``ssm_dtype``
        (and so its state page and aligned block size) is the engine's.

    Raises:
        FidelityError: the engine reports an allocated ``ssm_state_dtype``
            other than the one these settings resolve to.
        ModelConfigError: unreadable config or unknown dtype name.
    """
    kwargs = {key: str(geometry[key]) for key in _DTYPE_KEYS if geometry.get(key) is not None}
    costs = ModelCosts.from_config(config, mtp=geometry.get("speculative_method") == "mtp",
                                   **kwargs)
    _check_ssm_dtype(costs, geometry)
    return costs


def _check_ssm_dtype(costs: ModelCosts, geometry: dict[str, Any]) -> None:
    engine = geometry.get("ssm_state_dtype")
    if engine is not None and engine != costs.ssm_dtype:
        raise FidelityError(
            f"the engine stores the SSM state of {costs.name} in {engine}, the simulator's cost "
            f"model in {costs.ssm_dtype} (mamba_ssm_cache_dtype {costs.mamba_ssm_cache_dtype!r}); "
            f"build it with costs_like_engine")


def simulate_like_engine(trace: Trace, costs: ModelCosts, geometry: dict[str, Any], *,
                         admission: str, eviction: str, alpha: float | None,
                         tune_multiplier: int = 5, tune_grid: str = "coarse",
                         auto_interval: int = DEFAULT_INTERVAL, checkpoint: str = "split") -> Any:
    """Run the simulator with the engine's geometry; returns its ``RunResult``.

    ``checkpoint``: the engine's checkpoint mode (``VLLM_ADMISSION_CHECKPOINT``).
    The retention interval the ``vllm`` policy follows is the engine's
    (``geometry["prefix_cache_retention_interval"]``), and so are the hash unit
    (``geometry["prefix_match_unit"]``), MTP's draft tokens
    (``geometry["num_speculative_tokens"]``; the MTP layers' KV is in ``costs``,
    :func:`costs_like_engine`) and the hidden-state group of ``extract_hidden_states``
    (``geometry["hidden_state_bytes_per_token"]``), and the host tier of an
    ``OffloadingConnector`` (``geometry["host_chunks"]``, ``["host_policy"]``) with the
    plugin's host admission policy (``geometry["host_admission"]``).

    ``geometry`` is :func:`vllm_admission.engine.llm.engine_geometry` of the
    engine (in-process); ``costs`` should come from :func:`costs_like_engine`
    so that its SSM state dtype is the engine's. Output blocks are unique
    (the engine generates them); ``flop`` tunes alpha once, as the plugin does.

    Raises:
        FidelityError: the engine's allocated SSM state dtype
            (``ssm_state_dtype``, when known) is not ``costs.ssm_dtype``, or
            its KV cache groups or bytes per block differ from what the
            simulator derives for ``costs`` at that block size.
    """
    from vllm_admission.sim.simulator import group_kinds, simulate

    groups = geometry.get("kv_cache_groups")
    if not groups:
        raise FidelityError("the engine's KV cache groups are unknown (engine core in another "
                            "process?); run with VLLM_ENABLE_V1_MULTIPROCESSING=0")
    _check_ssm_dtype(costs, geometry)
    engine_kinds = tuple(g["kind"] for g in groups)
    bs, nb = int(geometry["block_size"]), int(geometry["num_gpu_blocks"])
    geo = geometry_from_blocks(costs, nb, bs)
    hidden = int(geometry.get("hidden_state_bytes_per_token") or 0)
    sim_kinds = group_kinds(costs, geo, hidden=bool(hidden))
    engine_bpb = max(g["page_size_bytes"] * g["num_layers"] for g in groups)
    if sim_kinds != engine_kinds or geo.bytes_per_block != engine_bpb:
        raise FidelityError(
            f"the simulator's layout for {costs.name} (groups {sim_kinds}, {geo.bytes_per_block} "
            f"bytes per block) differs from the engine's (groups {engine_kinds}, {engine_bpb} "
            f"bytes per block)")
    return simulate(trace, costs, admission=admission, eviction=eviction, num_blocks=nb,
                    block_size=bs, chunk_size=int(geometry["max_num_batched_tokens"]),
                    alpha=alpha, outputs="unique", retune_every=0, per_request=True,
                    tune_multiplier=tune_multiplier, tune_grid=tune_grid,
                    auto_interval=auto_interval, checkpoint=checkpoint,
                    retention_interval=geometry.get("prefix_cache_retention_interval", 0),
                    prefix_match_unit=geometry.get("prefix_match_unit"),
                    num_speculative_tokens=0 if hidden else int(
                        geometry.get("num_speculative_tokens") or 0),
                    hidden_state_bytes_per_token=hidden,
                    host_chunks=int(geometry.get("host_chunks") or 0),
                    host_policy=geometry.get("host_policy") or "lru",
                    host_admission=geometry.get("host_admission")
                    if geometry.get("host_chunks") else None,
                    async_scheduling=bool(geometry.get("async_scheduling")))
