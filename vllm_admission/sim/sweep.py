"""Sweeps: every (admission, eviction, capacity) run, a table, results.json, a plot."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from vllm_admission.core.costs import ModelCosts, load_model
from vllm_admission.core.eviction import EVICTION_POLICIES
from vllm_admission.core.geometry import block_geometry
from vllm_admission.core.traces import Trace, load_trace
from vllm_admission.sim.simulator import cache_requests, simulate, trace_bound

__all__ = ["SweepSpec", "format_table", "plot_hit_rates", "run_sweep", "write_results"]


@dataclass(frozen=True)
class SweepSpec:
    """What to sweep. ``trace`` and ``model`` are as given on the command line.

    ``mamba_ssm_cache_dtype`` is vLLM's flag of that name (``"auto"``,
    ``"float32"``, ``"bfloat16"``, ``"float16"``): the SSM state dtype of the
    model every run uses, ``"auto"`` resolved as vLLM does on a GPU (see
    :meth:`ModelCosts.from_config`).
    """

    trace: str
    model: str
    capacities: tuple[int, ...]
    admissions: tuple[str, ...]
    evictions: tuple[str, ...]
    chunk_size: int
    alpha: float | None = None
    outputs: str = "trace"
    tune_grid: str = "coarse"
    max_requests: int | None = None
    seed: int = 0
    mamba_ssm_cache_dtype: str = "auto"

    def load_costs(self) -> ModelCosts:
        """The cost model of ``model`` with this spec's SSM state dtype.

        Raises:
            ModelConfigError: unknown model, unreadable or invalid config, or
                an unknown dtype name.
        """
        return load_model(self.model, mamba_ssm_cache_dtype=self.mamba_ssm_cache_dtype)

    def runs(self) -> list[tuple[str, str, int]]:
        return list(itertools.product(self.admissions, self.evictions, self.capacities))


# Worker state, loaded once per process.
_STATE: dict[str, Any] = {}


def _load(spec: SweepSpec) -> tuple[Trace, ModelCosts]:
    key = (spec.trace, spec.model, spec.max_requests, spec.seed, spec.mamba_ssm_cache_dtype)
    if _STATE.get("key") != key:
        _STATE.clear()
        _STATE["key"] = key
        _STATE["trace"] = load_trace(spec.trace, max_requests=spec.max_requests, seed=spec.seed)
        _STATE["costs"] = spec.load_costs()
        _STATE["requests"] = {}
    return _STATE["trace"], _STATE["costs"]


def _requests(spec: SweepSpec, block_size: int):
    trace, _ = _load(spec)
    cached = _STATE["requests"]
    if block_size not in cached:
        cached[block_size] = cache_requests(trace, block_size, spec.outputs)
    return cached[block_size]


def _run_one(spec: SweepSpec, admission: str, eviction: str, capacity: int) -> dict[str, Any]:
    trace, costs = _load(spec)
    geo = block_geometry(costs, capacity)
    result = simulate(trace, costs, admission=admission, eviction=eviction,
                      capacity_bytes=capacity, chunk_size=spec.chunk_size, alpha=spec.alpha,
                      outputs=spec.outputs, tune_grid=spec.tune_grid,
                      requests=_requests(spec, geo.block_size))
    return result.to_record()


def run_sweep(spec: SweepSpec, *, jobs: int = 1, progress: bool = True) -> dict[str, Any]:
    """Run every run of ``spec``; return the ``results.json`` document.

    Trace and model are loaded (and validated) in this process first, so bad
    input fails before any worker starts.

    Returns:
        ``{"trace": ..., "model": ..., "mamba_ssm_cache_dtype": ...,
        "ssm_dtype": ..., "bound": {...}, "runs": [...]}`` with runs in
        (admission, eviction, capacity) order; ``mamba_ssm_cache_dtype`` is
        the requested SSM state dtype and ``ssm_dtype`` the resolved one (every
        run record repeats both).
    """
    trace, costs = _load(spec)
    for cap in spec.capacities:
        block_geometry(costs, cap)  # raises CapacityError early
    runs = spec.runs()
    results: dict[tuple[str, str, int], dict[str, Any]] = {}
    bar = tqdm(total=len(runs), desc="simulating", unit="run", disable=not progress)
    if jobs <= 1:
        for run in runs:
            results[run] = _run_one(spec, *run)
            bar.update()
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(_run_one, spec, *run): run for run in runs}
            for fut in as_completed(futures):
                results[futures[fut]] = fut.result()
                bar.update()
    bar.close()
    block_sizes = sorted({r["block_size"] for r in results.values()})
    return {
        "trace": trace.name,
        "trace_summary": trace.summary(),
        "model": costs.name,
        "model_source": spec.model,
        "mamba_ssm_cache_dtype": spec.mamba_ssm_cache_dtype,
        "ssm_dtype": costs.ssm_dtype,
        "chunk_size": spec.chunk_size,
        "outputs": spec.outputs,
        "bound": [trace_bound(_requests(spec, b), b) for b in block_sizes],
        "runs": [results[r] for r in runs],
    }


def format_table(doc: dict[str, Any]) -> str:
    """A plain-text table of the runs, one line each, under a line naming model and SSM state dtype."""
    title = f"{doc['model']}"
    if doc.get("ssm_dtype") is not None:
        title += (f": SSM state {doc['ssm_dtype']} "
                  f"(--mamba-ssm-cache-dtype {doc.get('mamba_ssm_cache_dtype', 'auto')})")
    head = f"{'admission':<9} {'eviction':<8} {'capacity':>10} {'blocks':>7} {'hit rate':>8} " \
           f"{'req hit':>7} {'FLOPs saved':>11} {'ckpts':>7} {'evictions':>9} {'alpha':>5} {'sec':>6}"
    lines = [title, head, "-" * len(head)]
    for r in doc["runs"]:
        alpha = "" if r["alpha"] is None else f"{r['alpha']:.1f}"
        lines.append(
            f"{r['admission']:<9} {r['eviction']:<8} {_fmt_bytes(r['capacity_bytes']):>10} "
            f"{r['num_blocks']:>7} {r['token_hit_rate']:>8.2%} {r['request_hit_rate']:>7.1%} "
            f"{r['flops_saved_fraction']:>11.2%} {r['state_checkpoints']:>7} {r['evictions']:>9} "
            f"{alpha:>5} {r['wall_seconds']:>6.2f}")
    for b in doc["bound"]:
        lines.append(f"infinite-capacity bound (block size {b['block_size']}): "
                     f"{b['token_hit_rate']:.2%} token hit rate")
    skipped = {r["skipped_requests"] for r in doc["runs"]}
    if skipped != {0}:
        lines.append(f"requests skipped because they never fit the pool: {sorted(skipped)}")
    return "\n".join(lines)


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            v = n / size
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.1f}{unit}"
    return f"{n}B"


def plot_hit_rates(doc: dict[str, Any], path: str | os.PathLike) -> Path:
    """Token hit rate against capacity, one line per policy pair, plus the bound."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    pairs: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for r in doc["runs"]:
        pairs.setdefault((r["admission"], r["eviction"]), []).append(
            (r["capacity_bytes"], r["token_hit_rate"]))
    admissions = list(dict.fromkeys(adm for adm, _ in pairs))
    colours = {a: f"C{i}" for i, a in enumerate(admissions)}
    # One line style per eviction policy, in registry order.
    looks = [("-", "o"), ("--", "s"), ("-.", "D"), (":", "^"), ((0, (1, 1)), "v")]
    styles = {name: looks[i % len(looks)] for i, name in enumerate(EVICTION_POLICIES)}
    for (adm, ev), pts in pairs.items():
        pts.sort()
        line, marker = styles.get(ev, ("-.", "x"))
        ax.plot([p[0] / (1 << 30) for p in pts], [100 * p[1] for p in pts], color=colours[adm],
                linestyle=line, marker=marker, markersize=4, label=f"{adm} + {ev}")
    for b in doc["bound"]:
        ax.axhline(100 * b["token_hit_rate"], color="black", linestyle="--", linewidth=1,
                   label=f"infinite-capacity bound (B={b['block_size']})")
    ax.set_xscale("log", base=2)
    caps = sorted({r["capacity_bytes"] / (1 << 30) for r in doc["runs"]})
    ax.set_xticks(caps)
    ax.set_xticklabels([f"{c:g}" for c in caps])
    ax.minorticks_off()
    ax.set_xlabel("KV cache capacity (GiB)")
    ax.set_ylabel("token hit rate (%)")
    state = f", SSM state {doc['ssm_dtype']}" if doc.get("ssm_dtype") else ""
    ax.set_title(f"{doc['model']} on {doc['trace']}{state}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def write_results(doc: dict[str, Any], out_dir: str | os.PathLike) -> tuple[Path, Path]:
    """Write ``results.json`` and ``hit_rate.png`` under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    res = out / "results.json"
    res.write_text(json.dumps(doc, indent=2) + "\n")
    png = plot_hit_rates(doc, out / "hit_rate.png")
    return res, png


def parse_list(text: str, what: str, valid: Sequence[str]) -> tuple[str, ...]:
    """Split a comma list and check every name; one clear error line otherwise."""
    from vllm_admission.core.admission import UnknownPolicyError

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise UnknownPolicyError(f"no {what} given; valid: {', '.join(valid)}")
    for n in names:
        if n not in valid:
            raise UnknownPolicyError(f"unknown {what} {n!r}; valid: {', '.join(valid)}")
    return names
