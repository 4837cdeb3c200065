"""Sweeps: every (admission, eviction, capacity) run of one trace and model, as one results document."""

from __future__ import annotations

import itertools
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from vllm_admission.core.adaptive import AUTO, DEFAULT_INTERVAL
from vllm_admission.core.cache import check_checkpoint_mode
from vllm_admission.core.costs import ModelCosts, load_model
from vllm_admission.core.geometry import block_geometry
from vllm_admission.core.traces import Trace, load_trace
from vllm_admission.sim.simulator import cache_requests, simulate, trace_bound

__all__ = ["SweepSpec", "run_sweep"]


@dataclass(frozen=True)
class SweepSpec:
    """What to sweep. ``trace`` and ``model`` are as given on the command line.

    ``mamba_ssm_cache_dtype`` is vLLM's flag of that name (``"auto"``,
    ``"float32"``, ``"bfloat16"``, ``"float16"``): the SSM state dtype of the
    model every run uses, ``"auto"`` resolved as vLLM does on a GPU (see
    :meth:`ModelCosts.from_config`). ``checkpoint`` is the checkpoint mode of
    every run (:data:`~vllm_admission.core.cache.CHECKPOINT_MODES`). ``pairs``
    are (admission, eviction) pairs run at every capacity besides the
    ``admissions`` x ``evictions`` grid (the demo's ``auto`` + ``auto``).
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
    auto_interval: int = DEFAULT_INTERVAL
    max_requests: int | None = None
    seed: int = 0
    mamba_ssm_cache_dtype: str = "auto"
    checkpoint: str = "split"
    pairs: tuple[tuple[str, str], ...] = ()

    def load_costs(self) -> ModelCosts:
        """The cost model of ``model`` with this spec's SSM state dtype.

        Raises:
            ModelConfigError: unknown model, unreadable or invalid config, or
                an unknown dtype name.
        """
        return load_model(self.model, mamba_ssm_cache_dtype=self.mamba_ssm_cache_dtype)

    def runs(self) -> list[tuple[str, str, int]]:
        """``(admission, eviction, capacity)`` of every run: the grid, then the extra pairs."""
        grid = list(itertools.product(self.admissions, self.evictions, self.capacities))
        extra = [(a, e, c) for a, e in dict.fromkeys(self.pairs) for c in self.capacities
                 if (a, e, c) not in grid]
        return grid + extra


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
                      auto_interval=spec.auto_interval, checkpoint=spec.checkpoint,
                      requests=_requests(spec, geo.block_size))
    return result.to_record()


def run_sweep(spec: SweepSpec, *, jobs: int = 1, progress: bool = True) -> dict[str, Any]:
    """Run every run of ``spec``; return the ``results.json`` document.

    Trace and model are loaded (and validated) in this process first, so bad
    input fails before any worker starts.

    Returns:
        ``{"trace": ..., "model": ..., "mamba_ssm_cache_dtype": ...,
        "ssm_dtype": ..., "checkpoint": ..., "bound": {...}, "runs": [...]}`` with runs in
        (admission, eviction, capacity) order; ``mamba_ssm_cache_dtype`` is
        the requested SSM state dtype and ``ssm_dtype`` the resolved one (every
        run record repeats both, and the checkpoint mode).

    Raises:
        ValueError: an unknown checkpoint mode (before any run).
    """
    check_checkpoint_mode(spec.checkpoint)
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
            # An auto run costs several fixed runs: start those first.
            order = sorted(runs, key=lambda run: AUTO not in run[:2])
            futures = {pool.submit(_run_one, spec, *run): run for run in order}
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
        "checkpoint": spec.checkpoint,
        "outputs": spec.outputs,
        "bound": [trace_bound(_requests(spec, b), b) for b in block_sizes],
        "runs": [results[r] for r in runs],
    }
