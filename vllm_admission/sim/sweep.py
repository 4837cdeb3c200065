"""Sweeps: every (admission, eviction, capacity) run of one trace and model, as one results document.

The runs execute in this process, in a pool of processes (``executor="process"``, each
worker reads the trace itself), or as Ray tasks (``executor="ray"``: the trace, the
model's costs and the cache requests of each block size put in Ray's object store once,
the tasks taking them by reference). The document is the same either way apart from
each run's ``wall_seconds`` and ``cpu_seconds``.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from vllm_admission.core.adaptive import AUTO, DEFAULT_INTERVAL, DEFAULT_MARGIN, check_stock_margin
from vllm_admission.core.cache import check_checkpoint_mode
from vllm_admission.core.cache.host import (
    H2D_BYTES_PER_SECOND,
    check_host_admission,
    check_host_tier,
    host_chunks,
)
from vllm_admission.core.costs import ModelCosts, load_model
from vllm_admission.core.errors import UserError
from vllm_admission.core.geometry import block_geometry
from vllm_admission.core.layout import DEFAULT_CHECKPOINT, check_hash_block_size, check_retention_interval
from vllm_admission.core.run import RunPlan
from vllm_admission.core.traces import Trace, load_trace
from vllm_admission.core.traces.resample import resample
from vllm_admission.core.tuning import DEFAULT_GRID
from vllm_admission.sim.simulation_settings import SimulationSettings
from vllm_admission.sim.simulator import (
    cache_requests,
    simulate,
    stream_cache_requests,
    trace_bound,
)

__all__ = ["EXECUTORS", "LOCAL_RAY_OBJECT_STORE_BYTES", "RAY_INSTALL_HINT", "RayUnavailableError",
           "SweepSpec", "import_ray", "run_sweep"]

#: Where a sweep's runs execute: a pool of local processes, or Ray tasks.
EXECUTORS = ("process", "ray")

#: How to get Ray, as the missing-Ray error says it.
RAY_INSTALL_HINT = 'pip install "ray>=2.9" (in a checkout: pip install -e ".[ray]")'

#: Object store of a local Ray instance a sweep starts itself: the inputs are a few MB
#: (the whole Mooncake trace pickles to about 3 MB, its cache requests to about 3 MB per
#: block size); Ray spills to disk past this.
LOCAL_RAY_OBJECT_STORE_BYTES = 256 << 20


class RayUnavailableError(ImportError):
    """``executor="ray"`` but Ray cannot be imported (the message says how to install it)."""


@dataclass(frozen=True)
class SweepSpec:
    """What to sweep. ``trace`` and ``model`` are as given on the command line.

    ``mamba_ssm_cache_dtype`` is vLLM's flag of that name (``"auto"``,
    ``"float32"``, ``"bfloat16"``, ``"float16"``): the SSM state dtype of the
    model every run uses, ``"auto"`` resolved as vLLM does on a GPU (see
    :meth:`ModelCosts.from_config`). ``checkpoint`` is the checkpoint mode of
    every run (:data:`~vllm_admission.core.cache.CHECKPOINT_MODES`).
    ``retention_interval`` is vLLM's ``prefix_cache_retention_interval`` of
    every run (what the ``vllm`` admission policy keeps), ``hash_block_size``
    vLLM's tokens per block hash of every run (its ``prefix_match_unit``; ``None``: the
    block size),
    ``num_speculative_tokens`` EAGLE/MTP draft tokens per step (0: none),
    ``hidden_states`` the hidden-state layers vLLM's ``extract_hidden_states`` caches
    (0: none; see :meth:`hidden_state_bytes_per_token`), ``block_size``
    vLLM's ``--block-size`` before the hybrid alignment (``None``: its default; a
    multiple of a coarser hash block keeps the aligned block a multiple of it). ``pairs``
    are (admission, eviction) pairs run at every capacity besides the
    ``admissions`` x ``evictions`` grid (the demo's ``auto`` + ``auto``). ``shadow_rate``
    is ``auto``'s shadow sample rate (``None``: chosen from the trace; 1: full shadows),
    ``auto_margin`` its margin over stock's pair (0: off), ``auto_admissions`` the
    admission policies it chooses among (``None``: the registered candidates; the
    runs whose admission is ``auto`` take them).
    ``resample``: replay that many requests made of the trace repeated with its private
    content renamed (:func:`~vllm_admission.core.traces.resample.resample`), streamed to
    each run (no infinite-capacity bound is computed then). ``host_bytes``: a host tier
    of that many bytes beside every capacity (vLLM's ``OffloadingConnector``; 0: none),
    run by ``host_policy``; ``host_bandwidth`` prices its loads (bytes per second);
    ``host_admission`` sends the states that policy keeps to the host tier only where a
    pair's admission does not keep them (per-tier admission; ``None``: none).
    """

    trace: str
    model: str
    capacities: tuple[int, ...]
    admissions: tuple[str, ...]
    evictions: tuple[str, ...]
    chunk_size: int
    alpha: float | None = None
    outputs: str = "trace"
    tune_grid: str = DEFAULT_GRID
    auto_interval: int = DEFAULT_INTERVAL
    shadow_rate: float | None = None
    auto_margin: float = DEFAULT_MARGIN
    auto_admissions: tuple[str, ...] | None = None
    max_requests: int | None = None
    resample: int | None = None
    seed: int = 0
    mamba_ssm_cache_dtype: str = "auto"
    checkpoint: str = DEFAULT_CHECKPOINT
    pairs: tuple[tuple[str, str], ...] = ()
    retention_interval: int | None = 0
    hash_block_size: int | None = None
    block_size: int | None = None
    num_speculative_tokens: int = 0
    hidden_states: int = 0
    host_bytes: int = 0
    host_policy: str = "lru"
    host_bandwidth: float = H2D_BYTES_PER_SECOND
    host_admission: str | None = None
    async_scheduling: bool = False

    def hidden_state_bytes_per_token(self, costs: ModelCosts) -> int:
        """Bytes per token of the hidden-state group
        (:meth:`ModelCosts.hidden_state_bytes_per_token`); 0 without hidden states."""
        return costs.hidden_state_bytes_per_token(self.hidden_states)

    def geometry(self, costs: ModelCosts, capacity: int) -> Any:
        """The pool a capacity gives with this spec's ``block_size`` (vLLM's
        ``--block-size`` before the hybrid alignment; ``None``: vLLM's default):
        :func:`~vllm_admission.core.geometry.block_geometry`, whose errors it raises."""
        return block_geometry(costs, capacity, block_size=self.block_size)

    def load_costs(self) -> ModelCosts:
        """The cost model of ``model`` with this spec's SSM state dtype (and, with
        speculative tokens, the MTP layers its config declares).

        Raises:
            ModelConfigError: unknown model, unreadable or invalid config, or
                an unknown dtype name.
        """
        return load_model(self.model, mamba_ssm_cache_dtype=self.mamba_ssm_cache_dtype,
                          mtp=self.num_speculative_tokens > 0)

    def settings(self, costs: ModelCosts, admission: str, eviction: str,
                 capacity: int) -> SimulationSettings:
        """The :class:`~vllm_admission.sim.simulation_settings.SimulationSettings` of one run."""
        return SimulationSettings.of(
            admission, eviction, capacity_bytes=capacity,
            block_size=self.block_size, chunk_size=self.chunk_size, checkpoint=self.checkpoint,
            retention_interval=self.retention_interval, hash_block_size=self.hash_block_size,
            num_speculative_tokens=self.num_speculative_tokens,
            hidden_state_bytes_per_token=self.hidden_state_bytes_per_token(costs),
            async_scheduling=self.async_scheduling, host_bytes=self.host_bytes,
            host_policy=self.host_policy, host_bandwidth=self.host_bandwidth,
            host_admission=self.host_admission, alpha=self.alpha, tune_grid=self.tune_grid,
            auto_interval=self.auto_interval, shadow_rate=self.shadow_rate,
            auto_margin=self.auto_margin, auto_admissions=self.auto_admissions_for(admission),
            outputs=self.outputs)

    def auto_admissions_for(self, admission: str) -> tuple[str, ...] | None:
        """``auto_admissions`` for a run with ``admission``: only ``auto`` admission takes them."""
        return self.auto_admissions if admission == AUTO else None

    def runs(self) -> list[tuple[str, str, int]]:
        """``(admission, eviction, capacity)`` of every run: the grid, then the extra pairs."""
        grid = list(itertools.product(self.admissions, self.evictions, self.capacities))
        extra = [(a, e, c) for a, e in dict.fromkeys(self.pairs) for c in self.capacities
                 if (a, e, c) not in grid]
        return grid + extra


# Worker state, loaded once per process.
_STATE: dict[str, Any] = {}


def _load(spec: SweepSpec) -> tuple[Trace, ModelCosts]:
    # Everything the trace, the costs and the cached requests depend on.
    key = (spec.trace, spec.model, spec.max_requests, spec.seed, spec.mamba_ssm_cache_dtype,
           spec.outputs, spec.hash_block_size, spec.num_speculative_tokens)
    if _STATE.get("key") != key:
        _STATE.clear()
        _STATE["key"] = key
        _STATE["trace"] = load_trace(spec.trace, max_requests=spec.max_requests, seed=spec.seed)
        _STATE["costs"] = spec.load_costs()
        _STATE["requests"] = {}
    return _STATE["trace"], _STATE["costs"]


def _requests(spec: SweepSpec, block_size: int):
    trace, _ = _load(spec)
    if spec.resample:
        # A fresh stream for each run: a long trace is never held.
        return stream_cache_requests(resample(trace, spec.resample), block_size, spec.outputs,
                                     spec.hash_block_size)
    cached = _STATE["requests"]
    if block_size not in cached:
        cached[block_size] = cache_requests(trace, block_size, spec.outputs,
                                            spec.hash_block_size)
    return cached[block_size]


def _run_one(spec: SweepSpec, admission: str, eviction: str, capacity: int) -> dict[str, Any]:
    trace, costs = _load(spec)
    geo = spec.geometry(costs, capacity)
    return _run_with(spec, trace, costs, _requests(spec, geo.block_size), admission, eviction,
                     capacity)


def _run_with(spec: SweepSpec, trace: Trace, costs: ModelCosts, requests: list,
              admission: str, eviction: str, capacity: int) -> dict[str, Any]:
    """One run's record, from inputs already in hand (``requests`` at the run's block size)."""
    result = simulate(trace, costs, spec.settings(costs, admission, eviction, capacity),
                      requests=requests)
    return result.to_record()


# Inputs a Ray worker has fetched from the object store, by object id, for the sweep it
# last ran a task of: one deserialisation per worker process and sweep, not per task.
_RAY_INPUTS: dict[str, Any] = {}


def _ray_task(spec: SweepSpec, inputs: list, admission: str, eviction: str,
              capacity: int) -> dict[str, Any]:
    """Body of a sweep's Ray task. ``inputs`` is ``[trace, costs, requests]`` as object
    refs inside a list, so that Ray hands them over unresolved and the worker can keep
    what it already fetched."""
    import ray

    if inputs[0].hex() not in _RAY_INPUTS:  # a new sweep: drop the last one's inputs
        _RAY_INPUTS.clear()
    values = []
    for ref in inputs:
        key = ref.hex()
        if key not in _RAY_INPUTS:
            _RAY_INPUTS[key] = ray.get(ref)
        values.append(_RAY_INPUTS[key])
    trace, costs, requests = values
    return _run_with(spec, trace, costs, requests, admission, eviction, capacity)


def import_ray():
    """The ``ray`` module.

    Raises:
        RayUnavailableError: Ray is not installed (or fails to import); one line with
            :data:`RAY_INSTALL_HINT`.
    """
    try:
        import ray
    except ImportError as exc:
        why = (str(exc).splitlines() or ["not installed"])[0]
        raise RayUnavailableError(f"--executor ray needs Ray, which cannot be imported ({why}): "
                                  f"{RAY_INSTALL_HINT}") from None
    return ray


def _start_ray(ray, address: str | None, jobs: int | None) -> bool:
    """Connect to the cluster at ``address``, or start a local instance with ``jobs``
    CPUs (default: all of this machine's), no dashboard and a small object store.
    Reuses a Ray already initialised in this process. Returns whether this call started
    (so must shut down) the connection."""
    if ray.is_initialized():
        return False
    quiet = {"logging_level": logging.WARNING, "log_to_driver": True}
    if address:
        ray.init(address=address, **quiet)
    else:
        # "local": a new instance even when a cluster started by `ray start` runs here.
        ray.init(address="local", num_cpus=jobs or os.cpu_count() or 1, include_dashboard=False,
                 object_store_memory=LOCAL_RAY_OBJECT_STORE_BYTES, **quiet)
    return True


def _ray_runs(spec: SweepSpec, runs: list[tuple[str, str, int]], trace: Trace, costs: ModelCosts,
              bar: tqdm, *, address: str | None, jobs: int | None) -> dict[tuple[str, str, int], Any]:
    """Every run of ``runs`` as one Ray task (1 CPU each); records by run."""
    ray = import_ray()
    started = _start_ray(ray, address, jobs)
    try:
        # Put once: the trace without its block-hash memo (each run gets its cache
        # requests ready made), the costs, and the cache requests per block size.
        trace_ref = ray.put(dataclasses.replace(trace))
        costs_ref = ray.put(costs)
        sizes = {cap: spec.geometry(costs, cap).block_size for cap in spec.capacities}
        request_refs = {b: ray.put(_requests(spec, b)) for b in sorted(set(sizes.values()))}
        task = ray.remote(num_cpus=1, max_retries=0)(_ray_task)
        order = sorted(runs, key=lambda run: AUTO not in run[:2])  # the long auto runs first
        pending = {task.remote(spec, [trace_ref, costs_ref, request_refs[sizes[run[2]]]], *run): run
                   for run in order}
        results = {}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                results[pending.pop(ref)] = ray.get(ref)
                bar.update()
        return results
    finally:
        if started:
            ray.shutdown()


def run_sweep(spec: SweepSpec, *, jobs: int | None = None, progress: bool = True,
              executor: str = "process", ray_address: str | None = None) -> dict[str, Any]:
    """Run every run of ``spec``; return the ``results.json`` document.

    Trace and model are loaded (and validated) in this process first, so bad
    input fails before any worker starts.

    Args:
        spec: what to run.
        jobs: with ``executor="process"``, worker processes (``None`` or 1: the runs
            one after another in this process). With ``"ray"`` and no
            ``ray_address``, the CPUs of the local Ray instance started for the sweep,
            hence runs at once (``None``: all of this machine's); ignored on a cluster
            (``ray_address`` given), where the cluster's CPUs decide.
        progress: show a progress bar.
        executor: one of :data:`EXECUTORS`. ``"ray"`` puts the trace, the costs and
            the cache requests of each block size in Ray's object store once and runs
            each (admission, eviction, capacity) as a task that takes them by
            reference; a Ray already initialised in this process is used as it is.
        ray_address: with ``"ray"``, the cluster to connect to (``ray.init``'s
            ``address``: ``"auto"``, ``"HOST:6379"``, ``"ray://HOST:10001"``);
            ``None`` starts a local instance and shuts it down afterwards.

    Returns:
        ``{"trace": ..., "model": ..., "mamba_ssm_cache_dtype": ...,
        "ssm_dtype": ..., "checkpoint": ..., "bound": {...}, "runs": [...]}`` with runs in
        (admission, eviction, capacity) order whatever order they finish in;
        ``mamba_ssm_cache_dtype`` is the requested SSM state dtype and ``ssm_dtype``
        the resolved one (every run record repeats both, and the checkpoint mode).
        Only the runs' ``wall_seconds`` and ``cpu_seconds`` depend on the executor.

    Raises:
        UserError: an unknown checkpoint mode or executor, ``jobs`` below 1,
            a retention interval that is not a multiple of the block size, a
            prefix match unit that does not divide it or comes with ``inpass``, an
            ``auto_margin`` that is not a finite number >= 0, or invalid
            ``auto_admissions`` (before any run).
        RayUnavailableError: ``executor="ray"`` without Ray installed.
    """
    check_checkpoint_mode(spec.checkpoint)
    check_stock_margin(spec.auto_margin)
    if executor not in EXECUTORS:
        raise UserError(f"unknown executor {executor!r}; valid: {', '.join(EXECUTORS)}")
    if jobs is not None and jobs < 1:
        raise UserError(f"jobs must be >= 1, got {jobs}")
    runs = spec.runs()
    for admission, eviction, _ in runs:
        # Every cell's names and combination, before any run (auto x belady cannot run).
        RunPlan.from_settings(admission, eviction, alpha=spec.alpha, checkpoint=spec.checkpoint,
                              auto_admissions=spec.auto_admissions_for(admission))
    if executor == "ray":
        if spec.resample:
            raise UserError("a resampled trace is streamed to each run; run it with the "
                            "process executor, not Ray")
        import_ray()  # fail before loading anything
    trace, costs = _load(spec)
    for cap in spec.capacities:
        geo = spec.geometry(costs, cap)  # raises CapacityError early
        check_retention_interval(spec.retention_interval, geo.block_size)
        check_hash_block_size(spec.hash_block_size, geo.block_size)
        if spec.host_bytes and not host_chunks(spec.host_bytes, geo.bytes_per_block):
            raise UserError(f"--host-capacity {spec.host_bytes} bytes holds no block of "
                            f"{costs.name} ({geo.bytes_per_block} bytes)")
    # Hidden states come from a speculative method (extract_hidden_states).
    check_host_tier(spec.host_policy,
                    partial_hash_hits=bool(spec.hash_block_size) and bool(spec.host_bytes),
                    speculative_tokens=(spec.num_speculative_tokens + spec.hidden_states
                                        if spec.host_bytes else 0))
    check_host_admission(spec.host_admission, bool(spec.host_bytes))
    if spec.hash_block_size and spec.checkpoint != "split":
        raise UserError(f"--prefix-match-unit is modelled in 'split' checkpoint mode only, "
                        f"not {spec.checkpoint!r}")
    results: dict[tuple[str, str, int], dict[str, Any]] = {}
    bar = tqdm(total=len(runs), desc="simulating", unit="run", disable=not progress)
    if executor == "ray":
        results = _ray_runs(spec, runs, trace, costs, bar, address=ray_address, jobs=jobs)
    elif (jobs or 1) <= 1:
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
        "retention_interval": spec.retention_interval,
        "prefix_match_unit": spec.hash_block_size,
        "block_size_flag": spec.block_size,
        "num_speculative_tokens": spec.num_speculative_tokens,
        "hidden_states": spec.hidden_states,
        "host_bytes": spec.host_bytes,
        "host_policy": spec.host_policy if spec.host_bytes else None,
        "host_bandwidth": spec.host_bandwidth if spec.host_bytes else None,
        "host_admission": spec.host_admission if spec.host_bytes else None,
        "async_scheduling": spec.async_scheduling,
        "outputs": spec.outputs,
        "resample": spec.resample,
        "bound": [] if spec.resample else [trace_bound(_requests(spec, b), b) for b in block_sizes],
        "runs": [results[r] for r in runs],
    }
