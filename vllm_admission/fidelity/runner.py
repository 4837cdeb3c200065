"""Both sides on the same requests, for every pool and policy pair (``fidelity.json``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypedDict

from vllm_admission.core.adaptive import stock_pair
from vllm_admission.core.costs import ModelCosts
from vllm_admission.core.traces import Trace, load_trace
from vllm_admission.fidelity.compare import compare_hits
from vllm_admission.fidelity.spec import FidelityError, FidelitySpec
from vllm_admission.fidelity.twin import costs_like_engine, simulate_like_engine

__all__ = ["load_trace_of", "run_fidelity", "run_pair"]


def load_trace_of(spec: FidelitySpec) -> Trace:
    """The trace ``spec`` names, with its filters and output cap applied (what
    :func:`run_fidelity` replays)."""
    trace = load_trace(spec.trace, max_requests=spec.max_requests,
                       max_prompt_tokens=spec.max_prompt_tokens, seed=spec.seed,
                       mooncake_block_tokens=spec.mooncake_block_tokens, **spec.synthetic)
    return trace.with_max_output_len(spec.max_output_len)


def _run_engine(spec: FidelitySpec, trace: Trace, admission: str, eviction: str,
                num_gpu_blocks: int | None,
                on_engine: Callable[[Any], Any] | None = None,
                fitted_lengths: dict[int, int] | None = None) -> dict[str, Any]:
    from vllm_admission.engine.llm import (
        build_llm_fitting,
        engine_geometry,
        inprocess_scheduler,
        plugin_settings,
        shutdown_llm,
    )
    from vllm_admission.engine.llm_replay import replay

    settings = plugin_settings(spec.model, spec.policy_settings(admission, eviction),
                               num_gpu_blocks=num_gpu_blocks, seed=spec.seed)
    settings.mamba_ssm_cache_dtype = spec.mamba_ssm_cache_dtype
    settings.engine_args = dict(spec.engine_args)
    if spec.offload is not None:
        from vllm_admission.plugin.offload_config import offloading_connector_config

        settings.engine_args["kv_transfer_config"] = offloading_connector_config(
            spec.offload, eviction_policy=spec.host_policy)
    # The comparison reads the live scheduler: the engine core must run in this process.
    settings.env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    llm, note = build_llm_fitting(settings, fitted=fitted_lengths)
    try:
        scheduler = inprocess_scheduler(llm)
        vocab = int(llm.llm_engine.vllm_config.model_config.get_vocab_size())
        geometry = dataclasses.replace(engine_geometry(llm), **_engine_dtypes(llm.llm_engine.vllm_config))

        def settle(_: int) -> None:
            ctl = getattr(scheduler, "_admission", None)
            if ctl is not None:
                ctl.drain(timeout=600)

        result = replay(llm, trace.requests, vocab_size=vocab, mode=spec.mode,
                        time_scale=spec.time_scale, after_request=settle)
        stats = scheduler.stats().to_dict()
        extra = None if on_engine is None else on_engine(llm)
    finally:
        shutdown_llm(llm)
        del llm
    return {"geometry": geometry, "result": result, "stats": stats, "note": note,
            "max_model_len": settings.max_model_len, "on_engine": extra}


class _EngineDtypes(TypedDict):
    """:func:`_engine_dtypes`: :class:`~vllm_admission.engine.engine_geometry.EngineGeometry`'s
    dtype fields, by name."""

    dtype: str | None
    kv_cache_dtype: str | None
    mamba_cache_dtype: str | None


def _engine_dtypes(vllm_config: Any) -> _EngineDtypes:
    """The engine's resolved model dtype and its KV / conv-state cache dtype settings.

    ``dtype`` is ``model_config.dtype`` without ``"torch."``; ``kv_cache_dtype``
    and ``mamba_cache_dtype`` are ``cache_config``'s (``"auto"``: the model
    dtype). None where the config lacks the attribute.
    """
    mc, cc = vllm_config.model_config, vllm_config.cache_config
    dtype = getattr(mc, "dtype", None)
    kv_cache_dtype = getattr(cc, "cache_dtype", None)
    mamba_cache_dtype = getattr(cc, "mamba_cache_dtype", None)
    return {"dtype": None if dtype is None else str(dtype).removeprefix("torch."),
            "kv_cache_dtype": None if kv_cache_dtype is None else str(kv_cache_dtype),
            "mamba_cache_dtype": None if mamba_cache_dtype is None else str(mamba_cache_dtype)}


def _subset(trace: Trace, keep: Sequence[int]) -> Trace:
    return Trace(name=trace.name, source=trace.source, requests=[trace.requests[i] for i in keep])


def run_pair(spec: FidelitySpec, trace: Trace, admission: str, eviction: str,
             num_gpu_blocks: int | None,
             on_engine: Callable[[Any], Any] | None = None,
             fitted_lengths: dict[int, int] | None = None) -> dict[str, Any]:
    """One engine replay and its simulator twin; returns the ``fidelity.json`` record.

    The simulator's cost model is built from the model's ``config.json`` with
    the dtypes this engine resolved (:func:`costs_like_engine`). ``on_engine``, if
    given, is called with the live ``vllm.LLM`` after the replay and before the engine
    shuts down; what it returns is the record's ``"on_engine"`` (JSON-serialisable, the
    caller's business).

    ``fitted_lengths`` (pool size in blocks -> tokens), if given, is shared by the pairs of
    one run on one model: the lengths vLLM fitted to small pools, which later pairs start
    at (:func:`~vllm_admission.engine.llm.build_llm_fitting`'s ``fitted``).
    """
    eng = _run_engine(spec, trace, admission, eviction, num_gpu_blocks, on_engine,
                      fitted_lengths)
    geometry, result = eng["geometry"], eng["result"]
    costs = costs_like_engine(Path(spec.model) / "config.json", geometry)
    ran = [i for i, r in enumerate(result.requests) if r["status"] == "ok"]
    sim = simulate_like_engine(_subset(trace, ran), costs, geometry, admission=admission,
                               eviction=eviction, alpha=spec.alpha,
                               auto_interval=spec.auto_interval, checkpoint=spec.checkpoint)
    rows = [result.requests[i] for i in ran]
    host = {"host_chunks": geometry.host_chunks,
            "host_policy": geometry.host_policy,
            "host_admission": geometry.host_admission,
            "simulator_host_hit_tokens": sim.host_hit_tokens,
            "simulator_host_evictions": sim.host.evictions} if geometry.host_chunks else {}
    sim_hits = [None if h < 0 else h for h in sim.per_request_hits]
    sim_steps = [None if n < 0 else n for n in sim.per_request_prefill_steps]
    engine_steps = [r["prefill_steps"] for r in rows]
    prompts = [r["prompt_tokens"] for r in rows]
    engine_hits = [r["cached_tokens"] for r in rows]
    cmp = compare_hits(prompts, engine_hits, sim_hits)
    prompt_total = sum(prompts)
    engine_hit = sum(engine_hits)
    stats = eng["stats"]
    return {
        "admission": admission, "eviction": eviction,
        "num_blocks": geometry.num_gpu_blocks,
        "block_size": geometry.block_size,
        "chunk_size": geometry.max_num_batched_tokens,
        "max_model_len": geometry.max_model_len,
        "mamba_ssm_cache_dtype": geometry.mamba_ssm_cache_dtype,
        "ssm_dtype": costs.ssm_dtype,
        "mode": spec.mode,
        "checkpoint": spec.checkpoint,
        "prefix_cache_retention_interval": geometry.prefix_cache_retention_interval,
        **host,
        **{k: cmp[k] for k in ("requests", "requests_differing", "abs_diff_tokens",
                                "abs_diff_fraction", "first_difference")},
        "prefill_steps_differing": sum(e != s for e, s in zip(engine_steps, sim_steps, strict=True)),
        "prompt_tokens": prompt_total,
        "mean_concurrency": _mean_concurrency(rows),
        "skipped": dict(result.skipped),
        "engine": {
            "hit_tokens": engine_hit,
            "token_hit_rate": engine_hit / prompt_total if prompt_total else 0.0,
            "prefill_tokens_computed": prompt_total - engine_hit,
            "prefill_seconds": result.prefill_seconds,
            "prefill_steps": result.prefill_steps,
            "wall_seconds": result.wall_seconds,
            "evictions": stats.get("evictions"),
            "junctions": stats.get("junctions"),
            "state_checkpoints": stats.get("state_checkpoints"),
            "alpha": stats.get("alpha"),
            "tuning": stats.get("tuning"),
            "policy_switches": stats.get("policy_switches", []),
        },
        "simulator": {
            "hit_tokens": sim.hit_tokens,
            "token_hit_rate": sim.token_hit_rate,
            "prefill_tokens_computed": sim.prompt_tokens - sim.hit_tokens,
            "prefill_steps": sim.prefill_steps,
            "evictions": sim.evictions,
            "junctions": sim.junctions,
            "state_checkpoints": sim.state_checkpoints,
            "alpha": sim.alpha,
            "tuning": sim.alpha_events,
            "policy_switches": sim.policy_switches,
        },
        "per_request": {
            "request_id": [r["request_id"] for r in rows],
            "prompt_tokens": prompts,
            "engine": engine_hits,
            "simulator": sim_hits,
            "prefill_seconds": [r["prefill_seconds"] for r in rows],
            "engine_prefill_steps": engine_steps,
            "simulator_prefill_steps": sim_steps,
            "submitted_s": [r["submitted_s"] for r in rows],
            "finished_s": [r["finished_s"] for r in rows],
        },
        **({} if on_engine is None else {"on_engine": eng["on_engine"]}),
    }


def _mean_concurrency(rows: Sequence[dict[str, Any]]) -> float | None:
    """Requests in the engine on average over the replay: sum of (finish - submit) / span."""
    spans = [(r["submitted_s"], r["finished_s"]) for r in rows
             if r.get("submitted_s") is not None and r.get("finished_s") is not None]
    if not spans:
        return None
    total = max(f for _, f in spans) - min(s for s, _ in spans)
    return sum(f - s for s, f in spans) / total if total > 0 else None


def _add_stock_ratios(records: list[dict[str, Any]]) -> None:
    """``prefill_seconds_vs_stock`` / ``prefill_tokens_vs_stock`` against the stock pair
    (:func:`~vllm_admission.core.adaptive.stock_pair`: vllm+lru) at the same pool."""
    pair = stock_pair()
    stock = {r["num_blocks"]: r for r in records
             if (r["admission"], r["eviction"]) == (pair.admission, pair.eviction)}
    for r in records:
        base = stock.get(r["num_blocks"])
        eng = r["engine"]
        if base is None:
            eng["prefill_seconds_vs_stock"] = eng["prefill_tokens_vs_stock"] = None
            continue
        b = base["engine"]
        eng["prefill_seconds_vs_stock"] = (eng["prefill_seconds"] / b["prefill_seconds"]
                                           if b["prefill_seconds"] else None)
        eng["prefill_tokens_vs_stock"] = (eng["prefill_tokens_computed"] / b["prefill_tokens_computed"]
                                          if b["prefill_tokens_computed"] else None)


def run_fidelity(spec: FidelitySpec, *,
                 on_record: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run every (pool, admission, eviction) of ``spec``; return the ``fidelity.json`` document.

    The document has ``settings`` (the spec, the trace's name, request count
    and skips, and the engine's ``mamba_ssm_cache_dtype`` setting and the SSM
    state dtype ``ssm_dtype`` both sides used; a list if engines differed)
    and ``records``: one per policy pair and pool, in run order, each with
    ``admission``, ``eviction``, ``num_blocks``, ``block_size``,
    ``mamba_ssm_cache_dtype``, ``ssm_dtype``, ``requests``,
    ``requests_differing``, ``abs_diff_fraction`` (tokens over prompt tokens),
    ``prefill_steps_differing`` (requests whose prefill step counts differ),
    the engine's and the simulator's totals (``prefill_steps`` included: the
    engine's counted from its live scheduler, the simulator's its predicted
    prefill chunks) and the per-request lists (``engine`` / ``simulator``
    hits, ``engine_prefill_steps`` / ``simulator_prefill_steps``).
    ``engine.prefill_seconds_vs_stock`` is the pair's prefill wall time over
    that of ``vllm`` + ``lru`` at the same pool in the same run (``None`` if
    that pair is not in the run).

    Raises:
        UnknownPolicyError, TraceError, ModelConfigError, ValueError: bad input.
        FidelityError: the simulator cannot mirror the engine's layout.
    """
    spec.check()
    trace = load_trace_of(spec)
    costs = ModelCosts.from_config(Path(spec.model) / "config.json")
    if not costs.is_hybrid:
        raise FidelityError(f"model {costs.name} has no recurrent layers: nothing to compare")
    records = []
    fitted_lengths: dict[int, int] = {}
    for blocks in spec.num_gpu_blocks:
        for admission, eviction in spec.policy_pairs():
            rec = run_pair(spec, trace, admission, eviction, blocks,
                           fitted_lengths=fitted_lengths)
            records.append(rec)
            if on_record is not None:
                on_record(rec)
    _add_stock_ratios(records)
    settings = dataclasses.asdict(spec)
    settings.update(trace_name=trace.name, trace_requests=len(trace.requests),
                    trace_skipped=dict(trace.skipped),
                    mamba_ssm_cache_dtype=_one_or_all(r["mamba_ssm_cache_dtype"] for r in records),
                    ssm_dtype=_one_or_all(r["ssm_dtype"] for r in records))
    return {"settings": settings, "records": records}


def _one_or_all(values) -> Any:
    """The value all records share, else the distinct values in first-seen order (None if none)."""
    distinct = list(dict.fromkeys(values))
    if not distinct:
        return None
    return distinct[0] if len(distinct) == 1 else distinct
