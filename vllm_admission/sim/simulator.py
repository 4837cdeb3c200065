"""Trace-replay simulation: one run per (admission, eviction, capacity).

A run of :class:`~vllm_admission.sim.simulation_settings.SimulationSettings` builds, once, vLLM's
block geometry for the model and capacity
(:func:`vllm_admission.core.geometry.block_geometry`) and the cache's
:class:`~vllm_admission.core.layout.CacheLayout` (:func:`cache_layout`), re-blocks the
trace to that block size, and replays it one request at a time through
:class:`~vllm_admission.core.cache.HybridPrefixCache`. With ``flop`` eviction,
alpha is tuned online (:class:`~vllm_admission.core.tuning.AlphaTuner`) unless
fixed. With ``auto`` admission and/or eviction a
:class:`~vllm_admission.core.adaptive.PolicyController` chooses the pair
online.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from vllm_admission.core.adaptive import PolicyController
from vllm_admission.core.bounds import LPBound, PoolBound, lp_bound, pool_bound
from vllm_admission.core.cache import ATTENTION, STATE, HybridPrefixCache, RequestOutcome, check_checkpoint_mode
from vllm_admission.core.cache.host import check_host_admission
from vllm_admission.core.cache.host import host_chunks as host_chunks_of
from vllm_admission.core.cache_inputs import (
    CacheRequest,
    CacheSetup,
    NextUseOracle,
    infinite_capacity_bound,
    replay_requests,
)
from vllm_admission.core.costs import ModelCosts
from vllm_admission.core.counters import CacheCounters, ratio
from vllm_admission.core.errors import UserError
from vllm_admission.core.geometry import (
    CacheGeometry,
    block_geometry,
    geometry_from_blocks,
    hidden_state_block_size,
)
from vllm_admission.core.layout import (
    DEFAULT_CHECKPOINT,
    HIDDEN,
    PER_TOKEN_KINDS,
    CacheLayout,
    HostTierSpec,
    PoolSpec,
    SchedulingSpec,
    SpeculationSpec,
    check_hash_block_size,
)
from vllm_admission.core.run import RunPlan, alpha_tuner, auto_run
from vllm_admission.core.traces import Request, Trace
from vllm_admission.core.tuning import GRIDS
from vllm_admission.sim.simulation_settings import DEFAULT_CHUNK_SIZE, SimulationSettings

__all__ = ["DEFAULT_CHUNK_SIZE", "OUTPUT_MODES", "HostFigures", "PolicyRun", "RunResult",
           "SimulationSettings", "cache_layout", "cache_requests", "cached_prefill_flops",
           "group_kinds", "lp_bound_of", "pool_bound_of", "run_plan", "simulate",
           "stream_cache_requests", "trace_bound"]


@dataclass(frozen=True)
class HostFigures:
    """A run's host tier (:attr:`RunResult.host`): its size and policies, and what moved
    between the tiers. A chunk is one block of one KV cache group; bytes; seconds.

    ``chunks`` host chunks (``bytes`` bytes, one GPU block's bytes each) run by the
    ``policy`` eviction policy, with ``admission`` the per-tier admission policy (``None``:
    the host gets what the GPU keeps). ``stored_chunks`` / ``loaded_chunks`` /
    ``evictions`` count chunks, ``failed_stores`` the store calls refused for want of room;
    ``bytes_stored`` / ``bytes_loaded`` are those chunks in bytes (one chunk's bytes
    each) and ``load_seconds`` the loads at ``bandwidth`` bytes per second.
    """

    chunks: int
    policy: str | None
    admission: str | None
    bytes: int
    stored_chunks: int
    loaded_chunks: int
    evictions: int
    failed_stores: int
    bytes_stored: int
    bytes_loaded: int
    bandwidth: float | None
    load_seconds: float

    @classmethod
    def none(cls) -> HostFigures:
        """The figures of a run without a host tier: no chunks, nothing moved."""
        return cls(chunks=0, policy=None, admission=None, bytes=0, stored_chunks=0,
                   loaded_chunks=0, evictions=0, failed_stores=0, bytes_stored=0,
                   bytes_loaded=0, bandwidth=None, load_seconds=0.0)


@dataclass(kw_only=True)
class RunResult(CacheCounters):
    """One simulated run: the :class:`~vllm_admission.core.counters.CacheCounters` over
    the requests that ran, and the run's settings and derived figures. Tokens, FLOPs,
    bytes, seconds.

    ``token_hit_rate = hit_tokens / prompt_tokens`` over the requests that ran;
    ``request_hit_rate`` is the fraction of those with a non-zero hit;
    ``flops_saved_fraction`` is prefill FLOPs saved over prefill FLOPs without
    any cache, ``prefill_flops_saved`` the FLOPs saved. ``mamba_ssm_cache_dtype``
    is the SSM state dtype the model was built with as requested (``"auto"`` unresolved) and ``ssm_dtype`` what it
    resolved to (:attr:`ModelCosts.ssm_dtype`); both shape ``block_size`` and
    ``num_blocks``. With ``auto``, ``policy_switches`` lists every switch
    (:meth:`Decision.as_dict <vllm_admission.core.adaptive.Decision.as_dict>`:
    request index ``at``, ``from``, ``to``, the window's scores),
    ``policy_decisions`` counts the windows decided and ``final_policy`` is
    the pair serving at the end; ``shadow_rate`` the sample rate of its
    sampled shadows (1: full shadows only; ``None`` without ``auto`` or
    before the rate was chosen) and ``shadow_handover`` the request after which
    they took over from the full shadows (``None``: never); ``shadows_dropped`` maps each
    pair whose shadow was eliminated to the request after which it was
    (:attr:`PolicyController.dropped <vllm_admission.core.adaptive.PolicyController.dropped>`),
    and ``shadows_settled`` is the request after which the shadows stopped, the served
    pair's being the only one left (``None``: they ran to the end;
    :attr:`PolicyController.settled_at <vllm_admission.core.adaptive.PolicyController.settled_at>`).
    ``checkpoint`` is the checkpoint mode
    (:data:`~vllm_admission.core.cache.CHECKPOINT_MODES`). ``prefill_steps`` is the number of prefill
    chunks over the requests that ran (the engine steps that schedule prompt
    tokens when requests run one at a time: the token budget ``chunk_size``
    and every chunk stop the cache model implies, see
    :class:`~vllm_admission.core.cache.RequestOutcome`). With
    ``per_request``, ``per_request_hits`` and ``per_request_prefill_steps``
    hold one entry per trace request (``-1`` for a skipped one).
    ``retention_interval`` is the engine's ``prefix_cache_retention_interval``
    the ``vllm`` admission policy followed (0, N tokens, or ``None``: dense);
    ``prefix_match_unit`` the engine's hash block when finer than the block
    (``None``: whole blocks), ``num_speculative_tokens`` the EAGLE/MTP draft
    tokens per step (0: no speculative decoding).
    ``skipped_requests`` counts the requests that could not fit the cache.
    With a host tier (``host.chunks`` > 0, :class:`HostFigures`): ``host_hit_tokens``
    is the part of ``hit_tokens`` loaded from it.
    """

    trace: str
    model: str
    admission: str
    eviction: str
    capacity_bytes: int | None
    block_size: int
    num_blocks: int
    mamba_ssm_cache_dtype: str
    ssm_dtype: str | None
    skipped_requests: int = 0
    token_hit_rate: float
    request_hit_rate: float
    flops_saved_fraction: float
    alpha: float | None
    alpha_events: list[dict[str, Any]]
    wall_seconds: float
    cpu_seconds: float
    policy_switches: list[dict[str, Any]] = field(default_factory=list)
    policy_decisions: int = 0
    final_policy: str | None = None
    shadow_rate: float | None = None
    shadow_handover: int | None = None
    shadows_dropped: dict[str, int] = field(default_factory=dict)
    shadows_settled: int | None = None
    checkpoint: str = DEFAULT_CHECKPOINT
    retention_interval: int | None = 0
    prefix_match_unit: int | None = None
    num_speculative_tokens: int = 0
    prefill_flops_saved: float = 0.0
    host: HostFigures = field(default_factory=HostFigures.none)
    per_request_hits: list[int] | None = field(default=None, repr=False)
    per_request_prefill_steps: list[int] | None = field(default=None, repr=False)

    def to_record(self) -> dict[str, Any]:
        """The run as one flat JSON object: the fields in order, :attr:`host`'s as
        ``host_<name>`` keys in its place, and the per-request lists only when kept."""
        rec: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if key == "host":
                rec.update({f"host_{name}": v for name, v in value.items()})
            elif value is not None or key not in ("per_request_hits", "per_request_prefill_steps"):
                rec[key] = value
        return rec


def group_kinds(costs: ModelCosts, geometry: CacheGeometry, *,
                hidden: bool = False) -> tuple[str, ...]:
    """The KV cache groups in vLLM's order, as ``"attention"`` / ``"state"``, and with
    ``hidden`` a last ``"hidden"`` group (``extract_hidden_states``).

    vLLM buckets layers by KV cache spec in the order the specs first appear in
    the model's layers, then cuts each bucket into groups of ``group_size``
    layers (``vllm/v1/core/kv_cache_utils.py``,
    ``_get_kv_cache_groups_uniform_page_size``); the hidden-state layer gets a group
    of its own after those (``get_kv_cache_groups``).
    """
    order = []
    for layer in costs.layers:
        kind = ATTENTION if layer.is_attention else STATE if layer.is_recurrent else None
        if kind and kind not in order:
            order.append(kind)
    count = {ATTENTION: geometry.num_attention_groups, STATE: geometry.num_state_groups}
    kinds = tuple(k for kind in order for k in [kind] * count[kind])
    return (*kinds, HIDDEN) if hidden else kinds


#: How output blocks are hashed: "trace" continues the chain through the output
#: when the trace knows its content (a later turn can hit it); "unique" makes
#: every output block unique, as in an engine replay whose outputs are generated.
OUTPUT_MODES = ("trace", "unique")


def cache_requests(trace: Trace, block_size: int, outputs: str = "trace",
                   hash_block_size: int | None = None) -> list[CacheRequest]:
    """The trace's requests reduced to what the cache needs, at ``block_size``;
    with a ``hash_block_size`` below it, each also carries its prompt's keys per hash
    block.

    Raises:
        UserError: unknown ``outputs`` mode.
    """
    _check_outputs(outputs)
    hashes = (trace.sequence_block_hashes(block_size) if outputs == "trace"
              else trace.block_hashes(block_size))
    unit = check_hash_block_size(hash_block_size, block_size)
    if unit < block_size:
        units = trace.block_hashes(unit)
        return [CacheRequest(h, r.prompt_len, r.output_len, k)
                for h, r, k in zip(hashes, trace.requests, units, strict=True)]
    return [CacheRequest(h, r.prompt_len, r.output_len) for h, r in zip(hashes, trace.requests, strict=True)]


def _check_outputs(outputs: str) -> None:
    if outputs not in OUTPUT_MODES:
        raise UserError(f"unknown outputs mode {outputs!r}; valid: {', '.join(OUTPUT_MODES)}")


def stream_cache_requests(requests: Iterable[Request], block_size: int, outputs: str = "trace",
                          hash_block_size: int | None = None) -> Iterator[CacheRequest]:
    """:func:`cache_requests` of trace requests as they come, without holding them: for
    a long trace streamed (:func:`~vllm_admission.core.traces.resample.resample`).

    Raises:
        UserError: unknown ``outputs`` mode (at the first ``next``).
    """
    _check_outputs(outputs)
    unit = check_hash_block_size(hash_block_size, block_size)
    partial = unit < block_size
    for r in requests:
        hashes = r.sequence_block_hashes(block_size) if outputs == "trace" else r.block_hashes(block_size)
        yield CacheRequest(hashes, r.prompt_len, r.output_len,
                           r.block_hashes(unit) if partial else None)


def trace_bound(requests: list[CacheRequest], block_size: int) -> dict[str, Any]:
    """Infinite-capacity bound at ``block_size`` (a state at every block, nothing evicted).

    See :func:`vllm_admission.core.cache_inputs.infinite_capacity_bound`.
    """
    hit, prompt = infinite_capacity_bound(requests, block_size)
    return {"block_size": block_size, "hit_tokens": hit, "prompt_tokens": prompt,
            "token_hit_rate": hit / prompt if prompt else 0.0}


def _bound_args(requests: Sequence[CacheRequest], layout: CacheLayout) -> dict[str, Any]:
    """The arguments :func:`~vllm_admission.core.bounds.pool_bound` and
    :func:`~vllm_admission.core.bounds.lp_bound` take for ``requests`` in ``layout``'s pool
    (its blocks, block size and KV cache groups, and which requests fit it at all)."""
    kinds = layout.pool.group_kinds
    return {"requests": ((r.hashes, r.prompt_len, r.output_len) for r in requests),
            "block_size": layout.pool.block_size, "num_blocks": layout.pool.num_blocks,
            "per_token_groups": sum(k in PER_TOKEN_KINDS for k in kinds),
            "state_groups": sum(k == STATE for k in kinds),
            "fits": CacheSetup(layout, "vllm", "lru").build().fits}


def pool_bound_of(requests: Sequence[CacheRequest], layout: CacheLayout) -> PoolBound:
    """:func:`~vllm_admission.core.bounds.pool_bound` of ``requests`` in ``layout``'s pool
    (its blocks, block size and KV cache groups); :func:`cache_layout` gives the layout of
    a simulation's settings."""
    return pool_bound(**_bound_args(requests, layout))


def lp_bound_of(requests: Sequence[CacheRequest], layout: CacheLayout, *,
                window: int = 1) -> LPBound:
    """:func:`~vllm_admission.core.bounds.lp_bound` of ``requests`` in ``layout``'s pool, as
    :func:`pool_bound_of` (``window``: slots per capacity row)."""
    return lp_bound(**_bound_args(requests, layout), window=window)


def simulate(trace: Trace, costs: ModelCosts, settings: SimulationSettings, *,
             requests: Iterable[CacheRequest] | None = None,
             on_request: Callable[[int], None] | None = None) -> RunResult:
    """Replay ``trace`` through the cache for one policy pair and one pool.

    Args:
        trace: the requests.
        costs: the model's cost model (must be hybrid); its state dtypes
            (``mamba_ssm_cache_dtype``) decide the state page, hence the aligned block
            size and the blocks a capacity holds.
        settings: the run's :class:`~vllm_admission.sim.simulation_settings.SimulationSettings`.
        requests: cache requests at the run's block size (sweeps share them); built from
            ``trace`` when ``None``. A generator is served as it comes (a long trace
            streamed, :func:`stream_cache_requests`; only ``trace.name`` is then read);
            ``belady`` makes a list of it.
        on_request: called with the request index after each request.

    Raises:
        UnknownPolicyError: a policy name is not registered.
        CapacityError: the capacity cannot hold a single block set.
        UserError: the model is not hybrid, neither capacity nor blocks, an unknown
            tuning grid or checkpoint mode, an ``auto_interval`` below 1 with ``auto``,
            a retention interval or ``hash_block_size`` vLLM refuses (or the latter
            below the block with ``inpass``); hidden states beside speculative tokens or
            at another block size than the other groups'; a host tier beside
            speculative decoding or a hash block below the block, of no block, with an
            unknown policy or a bandwidth <= 0; a host admission policy without one;
            ``auto_admissions`` that are invalid or beside a fixed admission policy.
    """
    st = settings
    plan, geo, layout = run_plan(costs, st)
    t0, c0 = time.perf_counter(), time.process_time()
    if requests is None:
        requests = cache_requests(trace, geo.block_size, st.outputs, st.hash_block_size)
    flops = cached_prefill_flops(costs)
    oracle = None
    if plan.eviction_cls.needs_future and not plan.adaptive:
        requests = requests if isinstance(requests, Sequence) else list(requests)
        oracle = NextUseOracle(requests)
    run = PolicyRun(plan, st, layout, flops, next_use=oracle)
    cache, controller, tuner = run.cache, run.controller, run.tuner
    hits: list[int] = []
    steps: list[int] = []
    per_request = st.per_request

    def on_outcome(r: int, req: CacheRequest, out) -> None:
        if per_request:
            hits.append(-1 if out is None else out.hit_tokens)
            steps.append(-1 if out is None else out.prefill_steps)
        if out is not None:
            run.observe(r, req, out)
        if on_request:
            on_request(r)

    totals = replay_requests(cache, requests, prefill_flops=flops, on_outcome=on_outcome)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    names = [f"{k}{g}" for g, k in enumerate(layout.pool.group_kinds)]
    return RunResult(
        trace=trace.name, model=costs.name, admission=st.policy.admission, eviction=st.policy.eviction,
        capacity_bytes=st.capacity_bytes if st.num_blocks is None else None,
        block_size=geo.block_size, num_blocks=geo.num_blocks,
        mamba_ssm_cache_dtype=costs.mamba_ssm_cache_dtype, ssm_dtype=costs.ssm_dtype,
        requests=totals.requests, skipped_requests=totals.skipped_requests,
        prompt_tokens=totals.prompt_tokens, hit_tokens=totals.hit_tokens,
        hit_requests=totals.hit_requests,
        token_hit_rate=ratio(totals.hit_tokens, totals.prompt_tokens),
        request_hit_rate=ratio(totals.hit_requests, totals.requests),
        flops_saved_fraction=ratio(totals.flops_saved, totals.flops_total),
        prefill_flops_saved=totals.flops_saved,
        state_checkpoints=cache.state_checkpoints, junctions=cache.junctions,
        evictions=cache.pool.evictions,
        evictions_by_group=dict(zip(names, cache.pool.evictions_by_group, strict=True)),
        alpha=(tuner.alpha if tuner else st.policy.alpha) if plan.tunable else None,
        alpha_events=[{"at": e.at, "window": e.window, "alpha": e.alpha, "kind": e.kind}
                      for e in tuner.events] if tuner else [],
        wall_seconds=wall, cpu_seconds=cpu,
        policy_switches=[d.as_dict() for d in controller.switches] if controller else [],
        policy_decisions=controller.num_decisions if controller else 0,
        final_policy=str(controller.pair) if controller else None,
        shadow_rate=controller.rate if controller else None,
        shadow_handover=controller.handover_at if controller else None,
        shadows_dropped={str(p): at for p, at in controller.dropped.items()} if controller else {},
        shadows_settled=controller.settled_at if controller else None,
        prefill_steps=totals.prefill_steps, checkpoint=st.policy.checkpoint,
        state_miss_tokens=totals.state_miss_tokens, retention_interval=st.retention_interval,
        prefix_match_unit=layout.pool.hash_block_size if layout.pool.partial_hash_hits else None,
        num_speculative_tokens=layout.speculation.num_speculative_tokens,
        per_request_hits=hits if per_request else None,
        per_request_prefill_steps=steps if per_request else None,
        host_hit_tokens=totals.host_hit_tokens,
        host=_host_figures(cache, layout, st.host_bandwidth))


def run_plan(costs: ModelCosts, settings: SimulationSettings,
             ) -> tuple[RunPlan, CacheGeometry, CacheLayout]:
    """The checks of ``settings`` for ``costs``, the run's :class:`RunPlan` and its pool
    (:func:`cache_layout`): what :func:`simulate` and the fleet simulator start from.

    Raises:
        UnknownPolicyError, CapacityError, UserError: as :func:`simulate` (the checkpoint
            mode first, then the policy names, the tuning grid, the model, the pool).
    """
    pol = settings.policy
    check_checkpoint_mode(pol.checkpoint)
    plan = RunPlan.from_settings(pol.admission, pol.eviction, alpha=pol.alpha,
                                 checkpoint=pol.checkpoint,
                                 auto_admissions=pol.auto.admissions)  # validates names first
    if pol.tune_grid not in GRIDS:
        raise UserError(f"unknown tuning grid {pol.tune_grid!r}; valid: {', '.join(GRIDS)}")
    if not costs.is_hybrid:
        raise UserError(f"model {costs.name!r} has no recurrent layers: nothing to simulate")
    geo, layout = cache_layout(costs, settings)
    if layout.pool.partial_hash_hits:  # auto's candidates include those that differ only here
        plan = RunPlan.from_settings(pol.admission, pol.eviction, alpha=pol.alpha,
                                     checkpoint=pol.checkpoint, sub_block=True,
                                     auto_admissions=pol.auto.admissions)
    return plan, geo, layout


def cached_prefill_flops(costs: ModelCosts) -> Callable[[int, int], float]:
    """``costs.prefill_flops`` behind a bounded cache (a long trace has ever more
    ``(end, start)`` pairs), as one run calls it."""
    return functools.lru_cache(maxsize=1 << 16)(costs.prefill_flops)


class PolicyRun:
    """One cache of a run and what adapts its policies as it serves: ``auto``'s controller
    or a tunable policy's alpha tuner (:class:`RunPlan` decides which). :func:`simulate`
    runs one; the fleet simulator one per replica.

    Args:
        plan: the run's plan (:func:`run_plan`).
        settings: the run's settings.
        layout: the run's pool (:func:`run_plan`).
        flops: ``f(end, start)``, prefill FLOPs (:func:`cached_prefill_flops`).
        next_use: the Bélády oracle of a policy that needs the future (fixed pairs only).
    """

    def __init__(self, plan: RunPlan, settings: SimulationSettings, layout: CacheLayout,
                 flops: Callable[[int, int], float], *, next_use: NextUseOracle | None = None) -> None:
        self.flops = flops
        self.controller: PolicyController | None = None
        self.tuner = None
        if plan.adaptive:
            self.cache, self.controller = auto_run(plan, layout, flops, settings.policy.auto)
            return
        setup = plan.setup(layout, flops)
        self.cache = setup.build(alpha=plan.start_alpha, next_use=next_use)
        if plan.tuned:
            self.tuner = alpha_tuner(setup, flops, grid=GRIDS[settings.policy.tune_grid],
                                     multiplier=settings.policy.tune_multiplier,
                                     snapshot=self.cache.clone, retune_every=settings.retune_every)

    def observe(self, index: int, req: CacheRequest, out: RequestOutcome) -> None:
        """After the cache served ``req`` (number ``index``) with ``out``: the controller sees
        it, or the tuner sees its saving and may set a new alpha."""
        if self.controller is not None:
            self.controller.observe(index, req)
        elif self.tuner is not None:
            saved = self.flops(req.prompt_len, 0) - self.flops(req.prompt_len, out.hit_tokens)
            alpha = self.tuner.observe((index, req), self.cache.pool.evictions > 0, saved)
            if alpha is not None:
                self.cache.eviction.alpha = alpha


def cache_layout(costs: ModelCosts, settings: SimulationSettings) -> tuple[CacheGeometry, CacheLayout]:
    """The pool ``settings`` give ``costs`` (:func:`~vllm_admission.core.geometry.block_geometry`
    of a capacity, or :func:`~vllm_admission.core.geometry.geometry_from_blocks` of an
    engine's blocks) and the :class:`~vllm_admission.core.layout.CacheLayout` a run of them
    builds its caches with.

    Raises:
        CapacityError, UserError: as :func:`simulate` (the pool's and host tier's checks).
    """
    st = settings
    if st.num_blocks is not None:
        geo = geometry_from_blocks(costs, st.num_blocks, st.block_size)
    elif st.capacity_bytes is not None:
        geo = block_geometry(costs, st.capacity_bytes, block_size=st.block_size)
    else:
        raise UserError("give capacity_bytes or num_blocks")
    speculation = SpeculationSpec(num_speculative_tokens=st.num_speculative_tokens)
    hidden = st.hidden_state_bytes_per_token
    if hidden:
        if st.num_speculative_tokens:
            raise UserError("hidden states come from vLLM's extract_hidden_states speculative "
                            "method; it cannot run beside another (num_speculative_tokens)")
        hidden_block = hidden_state_block_size(geo, hidden)
        if hidden_block != geo.block_size:
            raise UserError(
                f"{costs.name}: vLLM gives {hidden} hidden-state bytes per "
                f"token {hidden_block}-token blocks beside the others' {geo.block_size}; KV "
                f"cache groups of different block sizes are not modelled")
        speculation = SpeculationSpec(num_speculative_tokens=1, eagle=False)
    host_chunks = (st.host_chunks if st.host_chunks is not None
                   else host_chunks_of(st.host_bytes, geo.bytes_per_block))
    layout = CacheLayout(
        pool=PoolSpec(num_blocks=geo.num_blocks, block_size=geo.block_size,
                      group_kinds=group_kinds(costs, geo, hidden=bool(hidden)),
                      bytes_per_block=geo.bytes_per_block, hash_block_size=st.hash_block_size,
                      retention_interval=st.retention_interval),
        scheduling=SchedulingSpec(chunk_size=st.chunk_size, checkpoint=st.policy.checkpoint,
                                  prompt_end_export=st.prompt_end_export,
                                  async_scheduling=st.async_scheduling),
        speculation=speculation,
        host=HostTierSpec(chunks=host_chunks, policy=st.host_policy, admission=st.policy.host_admission))
    check_host_admission(st.policy.host_admission, bool(host_chunks))
    if st.host_bytes and not host_chunks:
        raise UserError(f"a host tier of {st.host_bytes} bytes holds no {geo.bytes_per_block}-byte "
                        f"block of {costs.name}")
    if not st.host_bandwidth > 0:
        raise UserError(f"the host-to-device bandwidth must be > 0 bytes/s, got {st.host_bandwidth}")
    return geo, layout


def _host_figures(cache: HybridPrefixCache, layout: CacheLayout, bandwidth: float) -> HostFigures:
    """The host tier's :class:`HostFigures` after a run (:meth:`HostFigures.none` without one)."""
    host = cache.host
    if host is None:
        return HostFigures.none()
    loaded_bytes = host.loaded * host.bytes_per_chunk
    return HostFigures(
        chunks=host.num_chunks, policy=host.policy_name, admission=layout.host.admission,
        bytes=host.num_chunks * layout.pool.bytes_per_block, stored_chunks=host.stored,
        loaded_chunks=host.loaded, evictions=host.evicted, failed_stores=host.failed_stores,
        bytes_stored=host.stored * host.bytes_per_chunk, bytes_loaded=loaded_bytes,
        bandwidth=bandwidth, load_seconds=loaded_bytes / bandwidth)


