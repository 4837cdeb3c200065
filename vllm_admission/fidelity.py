"""Simulator fidelity: the same requests through a real vLLM engine and the simulator.

For every (pool size, admission, eviction) this module

1. starts vLLM with the :class:`~vllm_admission.AdmissionScheduler` and the
   policy pair (``VLLM_ADMISSION_*``), replays the requests
   (:func:`vllm_admission.engine.replay.replay`) and reads each request's
   ``num_cached_tokens``;
2. runs the simulator on exactly the requests the engine ran, configured from
   the engine itself: its block size, its number of blocks, its
   ``max_num_batched_tokens`` as the chunk size, its KV cache group order and
   bytes per block (checked against the simulator's own geometry; a mismatch
   is an error, not a silent fallback), its resolved dtypes (model, KV cache,
   conv state and, above all, ``mamba_ssm_cache_dtype`` after vLLM's CPU
   platform has reset it to float32 on CPUs with AVX-512 BF16; the SSM state
   dtype decides the state page and so the block size), the model's FLOP
   costs, output blocks hashed as unique (the engine generates them), and
   alpha tuned once, as the plugin does (no re-tuning);
3. compares the two request by request.

In ``"sequential"`` mode (the default) a request finishes before the next is
sent, and the plugin's alpha tuner is given time to digest it (its thread is
drained) so the decision lands before the next request, as in the simulator.
In ``"timed"`` mode requests are submitted at their scaled trace arrival
times and overlap; the simulator still serves them one at a time in arrival
order, so the difference measures how far concurrency moves the engine from
the sequential prediction.

The outcome is ``fidelity.json`` (:func:`run_fidelity`) and
``fidelity.png`` (:func:`plot_fidelity`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_admission.core.admission import UnknownPolicyError, get_admission
from vllm_admission.core.costs import ModelCosts
from vllm_admission.core.eviction import ENGINE_EVICTION_POLICIES, eviction_class
from vllm_admission.core.geometry import geometry_from_blocks
from vllm_admission.core.traces import MOONCAKE_BLOCK_TOKENS, Trace, load_trace

__all__ = ["EXACT_ADMISSIONS", "FidelityError", "FidelitySpec", "compare_hits", "costs_like_engine",
           "format_fidelity", "meets_bar", "plot_fidelity", "run_fidelity", "simulate_like_engine",
           "write_fidelity"]

MODES = ("sequential", "timed")


class FidelityError(ValueError):
    """The simulator cannot be configured like the engine (e.g. a group layout it does not model)."""


@dataclass
class FidelitySpec:
    """What :func:`run_fidelity` runs.

    Attributes:
        model: model directory (its ``config.json`` gives the FLOP costs).
        trace: a trace file or ``"synthetic"``.
        admissions, evictions: policy names; every pair runs.
        pairs: run exactly these ``(admission, eviction)`` pairs instead of
            the cross product (``None``: the cross product).
        num_gpu_blocks: pool sizes in blocks (``None``: sized from memory,
            8,192 blocks with the default 1 GiB on CPU); every pair runs at each.
        max_requests: keep the first K requests of the trace.
        max_prompt_tokens: drop longer prompts (counted as skipped).
        max_output_len: cap every request's output tokens (``None``: as in
            the trace); recorded in the output.
        mooncake_block_tokens: tokens per Mooncake hash id (512: the trace's own).
        synthetic: keyword parameters of the synthetic workload.
        mode: ``"sequential"`` or ``"timed"``.
        time_scale: ``"timed"`` mode: multiplies trace arrival times.
        alpha: fix ``flop``'s alpha in both (``None``: tuned online in both).
        seed: synthetic workload and engine seed.
    """

    model: str
    trace: str = "synthetic"
    admissions: tuple[str, ...] = ("vllm",)
    evictions: tuple[str, ...] = ("lru",)
    pairs: tuple[tuple[str, str], ...] | None = None
    num_gpu_blocks: tuple[int | None, ...] = (None,)
    max_requests: int | None = None
    max_prompt_tokens: int | None = None
    max_output_len: int | None = None
    mooncake_block_tokens: int = MOONCAKE_BLOCK_TOKENS
    synthetic: dict[str, Any] = field(default_factory=dict)
    mode: str = "sequential"
    time_scale: float = 1.0
    alpha: float | None = None
    seed: int = 0

    def policy_pairs(self) -> list[tuple[str, str]]:
        """The ``(admission, eviction)`` pairs to run, in order."""
        if self.pairs is not None:
            return [tuple(p) for p in self.pairs]
        return [(a, e) for a in self.admissions for e in self.evictions]

    def check(self) -> None:
        """Validate names and numbers before any engine starts.

        Raises:
            UnknownPolicyError: an unknown policy, or an eviction the engine cannot run.
            ValueError: a bad number, mode or model directory.
        """
        if not self.policy_pairs():
            raise UnknownPolicyError("give at least one admission and one eviction policy")
        for a, _ in self.policy_pairs():
            get_admission(a)
        for _, e in self.policy_pairs():
            if e not in ENGINE_EVICTION_POLICIES:
                raise UnknownPolicyError(f"eviction policy {e!r} cannot run in an engine; "
                                         f"valid: {', '.join(ENGINE_EVICTION_POLICIES)}")
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; valid: {', '.join(MODES)}")
        if not self.time_scale >= 0:
            raise ValueError(f"time scale must be >= 0, got {self.time_scale}")
        if self.alpha is not None and not self.alpha >= 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")
        for n in self.num_gpu_blocks:
            if n is not None and n < 2:
                raise ValueError(f"a pool needs at least 2 blocks (one is vLLM's null block), got {n}")
        if self.max_output_len is not None and self.max_output_len < 1:
            raise ValueError(f"max output length must be >= 1, got {self.max_output_len}")
        if not (Path(self.model) / "config.json").is_file():
            raise ValueError(f"model {self.model}: no config.json there "
                             f"(make one with 'vllm-admission make-tiny-model DIR')")


# ---------------------------------------------------------------- comparison


def compare_hits(prompt_tokens: Sequence[int], engine: Sequence[int | None],
                 simulator: Sequence[int | None]) -> dict[str, Any]:
    """Per-request agreement of two hit lists (tokens).

    ``None`` marks a request one side did not run; it counts as differing
    (its whole prompt as the absolute difference) unless both skipped it.

    Returns:
        ``requests`` (compared: run by at least one side), ``requests_differing``,
        ``abs_diff_tokens`` (sum of ``|engine - simulator|``), ``prompt_tokens``
        (of the compared requests), ``abs_diff_fraction``
        (``abs_diff_tokens / prompt_tokens``; 0.0 without prompts) and
        ``first_difference`` (index of the first differing request or ``None``).

    Raises:
        ValueError: the three lists differ in length.
    """
    if not len(prompt_tokens) == len(engine) == len(simulator):
        raise ValueError(f"lists differ in length: {len(prompt_tokens)} prompts, "
                         f"{len(engine)} engine, {len(simulator)} simulator")
    requests = differing = diff = prompts = 0
    first = None
    for i, (p, e, s) in enumerate(zip(prompt_tokens, engine, simulator)):
        if e is None and s is None:
            continue
        requests += 1
        prompts += p
        d = p if e is None or s is None else abs(e - s)
        if d or (e is None) != (s is None):
            differing += 1
            diff += d
            if first is None:
                first = i
    return {"requests": requests, "requests_differing": differing, "abs_diff_tokens": diff,
            "prompt_tokens": prompts, "abs_diff_fraction": diff / prompts if prompts else 0.0,
            "first_difference": first}


#: Admission policies whose sequential replay with ``lru`` must match request by request.
EXACT_ADMISSIONS = ("none", "last", "vllm", "dense")
#: Largest ``abs_diff_fraction`` allowed for ``marconi`` and for ``flop`` eviction.
TOLERANCE = 0.01


def meets_bar(record: dict[str, Any]) -> bool:
    """Whether a sequential record meets the fidelity bar.

    Exact (no differing request) for an eviction policy in vLLM's own order
    (``vllm_order``: ``lru``) with an admission of :data:`EXACT_ADMISSIONS`;
    otherwise ``abs_diff_fraction <= 1 %``. Timed
    records have no bar (their drift is reported, not judged): always True.
    """
    if record.get("mode", "sequential") != "sequential":
        return True
    if eviction_class(record["eviction"]).vllm_order and record["admission"] in EXACT_ADMISSIONS:
        return record["requests_differing"] == 0
    return record["abs_diff_fraction"] <= TOLERANCE


# ---------------------------------------------------------------- simulator side

#: Engine dtype settings (keys of the engine geometry dict), each passed to
#: ``ModelCosts.from_config`` as the keyword of the same name.
_DTYPE_KEYS = ("dtype", "kv_cache_dtype", "mamba_cache_dtype", "mamba_ssm_cache_dtype")


def costs_like_engine(config: str | os.PathLike | dict[str, Any],
                      geometry: dict[str, Any]) -> ModelCosts:
    """The cost model of ``config`` with the dtypes the engine resolved.

    Args:
        config: the model's ``config.json`` (path) or its parsed dict.
        geometry: :func:`vllm_admission.engine.replay.engine_geometry` of the
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
    costs = ModelCosts.from_config(config, **kwargs)
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
                         tune_multiplier: int = 5, tune_grid: str = "coarse") -> Any:
    """Run the simulator with the engine's geometry; returns its ``RunResult``.

    ``geometry`` is :func:`vllm_admission.engine.replay.engine_geometry` of the
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
    sim_kinds = group_kinds(costs, geo)
    engine_bpb = max(g["page_size_bytes"] * g["num_layers"] for g in groups)
    if sim_kinds != engine_kinds or geo.bytes_per_block != engine_bpb:
        raise FidelityError(
            f"the simulator's layout for {costs.name} (groups {sim_kinds}, {geo.bytes_per_block} "
            f"bytes per block) differs from the engine's (groups {engine_kinds}, {engine_bpb} "
            f"bytes per block)")
    return simulate(trace, costs, admission=admission, eviction=eviction, num_blocks=nb,
                    block_size=bs, chunk_size=int(geometry["max_num_batched_tokens"]),
                    alpha=alpha, outputs="unique", retune_every=0, per_request=True,
                    tune_multiplier=tune_multiplier, tune_grid=tune_grid)


# ---------------------------------------------------------------- engine side


def _load(spec: FidelitySpec) -> Trace:
    trace = load_trace(spec.trace, max_requests=spec.max_requests,
                       max_prompt_tokens=spec.max_prompt_tokens, seed=spec.seed,
                       mooncake_block_tokens=spec.mooncake_block_tokens, **spec.synthetic)
    if spec.max_output_len is not None:
        cap = spec.max_output_len
        trace = Trace(name=trace.name, source=trace.source, skipped=dict(trace.skipped),
                      requests=[dataclasses.replace(r, output_len=min(r.output_len, cap))
                                for r in trace.requests])
    return trace


def _run_engine(spec: FidelitySpec, trace: Trace, admission: str, eviction: str,
                num_gpu_blocks: int | None) -> dict[str, Any]:
    from vllm_admission.engine.replay import (
        build_llm_fitting,
        engine_geometry,
        inprocess_scheduler,
        plugin_settings,
        replay,
        shutdown_llm,
    )

    settings = plugin_settings(spec.model, admission=admission, eviction=eviction,
                               alpha=spec.alpha, num_gpu_blocks=num_gpu_blocks, seed=spec.seed)
    # The comparison reads the live scheduler: the engine core must run in this process.
    settings.env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    llm, note = build_llm_fitting(settings)
    try:
        scheduler = inprocess_scheduler(llm)
        vocab = int(llm.llm_engine.vllm_config.model_config.get_vocab_size())
        geometry = {**_engine_dtypes(llm.llm_engine.vllm_config), **engine_geometry(llm)}

        def settle(_: int) -> None:
            ctl = getattr(scheduler, "_admission", None)
            if ctl is not None and ctl.tuner is not None:
                ctl.tuner.drain(timeout=600)

        result = replay(llm, trace.requests, vocab_size=vocab, mode=spec.mode,
                        time_scale=spec.time_scale, after_request=settle)
        stats = scheduler.stats().to_dict()
    finally:
        shutdown_llm(llm)
        del llm
    return {"geometry": geometry, "result": result, "stats": stats, "note": note,
            "max_model_len": settings.max_model_len}


def _engine_dtypes(vllm_config: Any) -> dict[str, str | None]:
    """The engine's resolved model dtype and its KV / conv-state cache dtype settings.

    ``dtype`` is ``model_config.dtype`` without ``"torch."``; ``kv_cache_dtype``
    and ``mamba_cache_dtype`` are ``cache_config``'s (``"auto"``: the model
    dtype). None where the config lacks the attribute.
    """
    mc, cc = vllm_config.model_config, vllm_config.cache_config
    dtype = getattr(mc, "dtype", None)
    out = {"dtype": None if dtype is None else str(dtype).removeprefix("torch.")}
    for key, attr in (("kv_cache_dtype", "cache_dtype"), ("mamba_cache_dtype", "mamba_cache_dtype")):
        value = getattr(cc, attr, None)
        out[key] = None if value is None else str(value)
    return out


def _subset(trace: Trace, keep: Sequence[int]) -> Trace:
    return Trace(name=trace.name, source=trace.source, requests=[trace.requests[i] for i in keep])


def run_pair(spec: FidelitySpec, trace: Trace, admission: str, eviction: str,
             num_gpu_blocks: int | None) -> dict[str, Any]:
    """One engine replay and its simulator twin; returns the ``fidelity.json`` record.

    The simulator's cost model is built from the model's ``config.json`` with
    the dtypes this engine resolved (:func:`costs_like_engine`).
    """
    eng = _run_engine(spec, trace, admission, eviction, num_gpu_blocks)
    geometry, result = eng["geometry"], eng["result"]
    costs = costs_like_engine(Path(spec.model) / "config.json", geometry)
    ran = [i for i, r in enumerate(result.requests) if r["status"] == "ok"]
    sim = simulate_like_engine(_subset(trace, ran), costs, geometry, admission=admission,
                               eviction=eviction, alpha=spec.alpha)
    rows = [result.requests[i] for i in ran]
    sim_hits = [None if h < 0 else h for h in sim.per_request_hits]
    prompts = [r["prompt_tokens"] for r in rows]
    engine_hits = [r["cached_tokens"] for r in rows]
    cmp = compare_hits(prompts, engine_hits, sim_hits)
    prompt_total = sum(prompts)
    engine_hit = sum(engine_hits)
    stats = eng["stats"]
    return {
        "admission": admission, "eviction": eviction,
        "num_blocks": int(geometry["num_gpu_blocks"]),
        "block_size": int(geometry["block_size"]),
        "chunk_size": int(geometry["max_num_batched_tokens"]),
        "max_model_len": int(geometry["max_model_len"]),
        "mamba_ssm_cache_dtype": geometry.get("mamba_ssm_cache_dtype"),
        "ssm_dtype": costs.ssm_dtype,
        "mode": spec.mode,
        **{k: cmp[k] for k in ("requests", "requests_differing", "abs_diff_tokens",
                                "abs_diff_fraction", "first_difference")},
        "prompt_tokens": prompt_total,
        "mean_concurrency": _mean_concurrency(rows),
        "skipped": dict(result.skipped),
        "engine": {
            "hit_tokens": engine_hit,
            "token_hit_rate": engine_hit / prompt_total if prompt_total else 0.0,
            "prefill_tokens_computed": prompt_total - engine_hit,
            "prefill_seconds": result.prefill_seconds,
            "wall_seconds": result.wall_seconds,
            "evictions": stats.get("evictions"),
            "junctions": stats.get("junctions"),
            "checkpoints": stats.get("checkpoints"),
            "alpha": stats.get("alpha"),
            "tuning": stats.get("tuning"),
        },
        "simulator": {
            "hit_tokens": sim.hit_tokens,
            "token_hit_rate": sim.token_hit_rate,
            "prefill_tokens_computed": sim.prompt_tokens - sim.hit_tokens,
            "evictions": sim.evictions,
            "junctions": sim.junctions,
            "checkpoints": sim.state_checkpoints,
            "alpha": sim.alpha,
            "tuning": sim.alpha_events,
        },
        "per_request": {
            "request_id": [r["request_id"] for r in rows],
            "prompt_tokens": prompts,
            "engine": engine_hits,
            "simulator": sim_hits,
            "prefill_seconds": [r["prefill_seconds"] for r in rows],
            "submitted_s": [r["submitted_s"] for r in rows],
            "finished_s": [r["finished_s"] for r in rows],
        },
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
    """``prefill_seconds_vs_stock`` / ``prefill_tokens_vs_stock`` against vllm+lru at the same pool."""
    stock = {r["num_blocks"]: r for r in records
             if r["admission"] == "vllm" and r["eviction"] == "lru"}
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
    the engine's and the simulator's totals and the per-request lists.
    ``engine.prefill_seconds_vs_stock`` is the pair's prefill wall time over
    that of ``vllm`` + ``lru`` at the same pool in the same run (``None`` if
    that pair is not in the run).

    Raises:
        UnknownPolicyError, TraceError, ModelConfigError, ValueError: bad input.
        FidelityError: the simulator cannot mirror the engine's layout.
    """
    spec.check()
    trace = _load(spec)
    costs = ModelCosts.from_config(Path(spec.model) / "config.json")
    if not costs.is_hybrid:
        raise FidelityError(f"model {costs.name} has no recurrent layers: nothing to compare")
    records = []
    for blocks in spec.num_gpu_blocks:
        for admission, eviction in spec.policy_pairs():
            rec = run_pair(spec, trace, admission, eviction, blocks)
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


# ---------------------------------------------------------------- output


def plot_fidelity(doc: dict[str, Any], path: str | os.PathLike) -> Path:
    """Scatter per request, simulator (x) against engine (y), one panel per record."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = doc["records"]
    cols = min(4, max(1, len(recs)))
    rows = math.ceil(len(recs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
    for ax, rec in zip(axes.flat, recs):
        pr = rec["per_request"]
        pairs = [(s, e) for s, e in zip(pr["simulator"], pr["engine"]) if s is not None and e is not None]
        xs = [p[0] for p in pairs]
        ys = [p[1] for p in pairs]
        top = max(xs + ys + [1])
        ax.plot([0, top], [0, top], color="0.7", lw=0.8)
        same = [(x, y) for x, y in pairs if x == y]
        diff = [(x, y) for x, y in pairs if x != y]
        if same:
            ax.scatter(*zip(*same), s=8, color="tab:blue", label="equal")
        if diff:
            ax.scatter(*zip(*diff), s=14, color="tab:red", marker="x", label="differ")
        ax.set_title(f"{rec['admission']}+{rec['eviction']}, {rec['num_blocks']} blocks\n"
                     f"{rec['requests_differing']}/{rec['requests']} differ, "
                     f"{100 * rec['abs_diff_fraction']:.2f}% tokens", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("simulator hit tokens", fontsize=7)
        ax.set_ylabel("engine cached tokens", fontsize=7)
    for ax in list(axes.flat)[len(recs):]:
        ax.axis("off")
    st = doc["settings"]
    what = Path(str(st["trace"])).name
    if st["mode"] == "timed":
        what += f", timed replay (time scale {st['time_scale']:g})"
    else:
        what += ", sequential replay"
    if st.get("ssm_dtype") is not None:
        what += f", SSM state {st['ssm_dtype']}"
    fig.suptitle(f"{what}\nengine cached tokens against the simulator's hit, per request",
                 fontsize=9)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def write_fidelity(doc: dict[str, Any], out_dir: str | os.PathLike) -> tuple[Path, Path]:
    """Write ``fidelity.json`` and ``fidelity.png`` under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    js = out / "fidelity.json"
    js.write_text(json.dumps(doc, indent=1) + "\n")
    return js, plot_fidelity(doc, out / "fidelity.png")


def format_fidelity(doc: dict[str, Any]) -> str:
    """A plain-text table of the records, under a line naming the SSM state dtype when known."""
    st = doc.get("settings", {})
    title = []
    if st.get("ssm_dtype") is not None:
        title = [f"SSM state {st['ssm_dtype']} (engine mamba_ssm_cache_dtype "
                 f"{st.get('mamba_ssm_cache_dtype')})"]
    head = (f"{'admission':<9} {'eviction':<8} {'blocks':>6} {'reqs':>5} {'differ':>6} "
            f"{'diff %':>7} {'engine hit':>10} {'sim hit':>8} {'prefill s':>9} {'vs stock':>8}")
    lines = [*title, head, "-" * len(head)]
    for r in doc["records"]:
        e, s = r["engine"], r["simulator"]
        ratio = e.get("prefill_seconds_vs_stock")
        lines.append(
            f"{r['admission']:<9} {r['eviction']:<8} {r['num_blocks']:>6} {r['requests']:>5} "
            f"{r['requests_differing']:>6} {100 * r['abs_diff_fraction']:>7.3f} "
            f"{100 * e['token_hit_rate']:>9.2f}% {100 * s['token_hit_rate']:>7.2f}% "
            f"{e['prefill_seconds']:>9.1f} {'-' if ratio is None else f'{ratio:.3f}':>8}")
    return "\n".join(lines)
