"""Replay trace requests through a real vLLM ``LLM`` with prefix caching on.

This is the engine-side twin of the simulator: it sends the same requests to
vLLM 0.32 and reads back how many prompt tokens each one found in the prefix
cache (``RequestOutput.num_cached_tokens``).

Engine construction (:func:`build_llm`) bakes in what vLLM's CPU backend needs
on this project's machines (bf16, eager mode, no tokenizer, a bounded KV
cache) and, by default, runs the engine core *in the calling process*
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``). That makes engine start faster, avoids
the spawn-only ``if __name__ == "__main__":`` requirement, and lets callers
read the live scheduler and block pool through :func:`inprocess_scheduler`.
Pass ``env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}`` to get vLLM's default
separate engine-core process instead (then :func:`inprocess_scheduler` raises).

Only :class:`EngineSettings`, :class:`ReplayResult` and the pure helpers are
usable without vLLM installed; everything that touches the engine imports vLLM
lazily.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import vllm

__all__ = [
    "DEFAULT_ENV",
    "SEQUENTIAL_MODE",
    "TIMED_MODE",
    "EngineSettings",
    "ReplayResult",
    "Req",
    "blocks_needed",
    "build_llm",
    "build_llm_fitting",
    "shutdown_llm",
    "cached_block_positions",
    "engine_geometry",
    "inprocess_scheduler",
    "plugin_settings",
    "prefix_cache_counters",
    "replay",
]

#: Environment variables :func:`build_llm` sets when (and only when) unset.
DEFAULT_ENV: dict[str, str] = {
    # GiB of host memory for the KV cache on the CPU backend; the default asks
    # for more than a 24 GiB, 2-core machine's NUMA node has free.
    "VLLM_CPU_KVCACHE_SPACE": "1",
    # Engine core in this process: inspectable scheduler, no spawn.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}

SEQUENTIAL_MODE = "sequential: one request at a time, in trace order"
TIMED_MODE = "timed: each request submitted at its trace arrival time x time_scale; requests overlap"

_MODES = {"sequential": SEQUENTIAL_MODE, "timed": TIMED_MODE}


class Req(Protocol):
    """What :func:`replay` needs from a request (``vllm_admission.core.traces.Request`` fits)."""

    @property
    def request_id(self) -> str: ...

    @property
    def prompt_len(self) -> int: ...

    @property
    def output_len(self) -> int: ...

    @property
    def arrival_s(self) -> float | None: ...

    def token_ids(self, vocab_size: int) -> list[int]: ...


@dataclass
class EngineSettings:
    """How to build the engine for :func:`build_llm`.

    Attributes:
        model: path (or name) of the model directory, e.g. from
            :func:`vllm_admission.engine.tiny_model.make_tiny_model`.
        num_gpu_blocks: size of the KV block pool in blocks
            (vLLM's ``num_gpu_blocks_override``; the pool includes one null
            block that is never handed out). ``None``: sized from memory.
        max_num_batched_tokens: token budget of one scheduler step
            (``None``: vLLM's default).
        max_model_len: longest prompt + output in tokens (``None``: the
            model's ``max_position_embeddings``). With a small
            ``num_gpu_blocks`` vLLM refuses to start unless one request of
            this length fits in the pool (see ``docs/engine-facts.md``).
        scheduler_cls: qualified name of a scheduler class, e.g.
            ``"vllm_admission.AdmissionScheduler"`` (``None``: stock vLLM).
        env: extra environment variables (e.g. policy selection) set in
            ``os.environ`` before the engine starts; they override both the
            caller's environment and :data:`DEFAULT_ENV`. A value of ``None``
            removes the variable from ``os.environ`` instead.
        seed: engine seed.
        gpu_memory_utilization: fraction of memory vLLM may plan with (on the
            CPU backend it also bounds host memory); 0.5 works on this project's
            machines.
        mamba_ssm_cache_dtype: vLLM's ``mamba_ssm_cache_dtype`` (``"auto"``,
            ``"float32"``, ``"bfloat16"``, ``"float16"``); ``None``: vLLM's
            default ``"auto"``, which vLLM's CPU platform turns into float32 on
            CPUs with AVX-512 BF16 (``vllm/platforms/cpu.py``
            ``check_and_update_config``), doubling the GDN state page and so
            the block size of the tiny model (``docs/engine-facts.md``). Pin it
            to get the same geometry on every CPU.
        block_size: tokens per KV block (vLLM's ``block_size``); ``None``: the
            platform's choice. vLLM still raises it when the recurrent-state
            page does not fit (``platforms/interface.py``
            ``_align_hybrid_block_size``).
    """

    model: str
    num_gpu_blocks: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    scheduler_cls: str | None = None
    env: dict[str, str | None] = field(default_factory=dict)
    seed: int = 0
    gpu_memory_utilization: float = 0.5
    mamba_ssm_cache_dtype: str | None = None
    block_size: int | None = None


@dataclass
class ReplayResult:
    """Outcome of :func:`replay`.

    Attributes:
        requests: one dict per input request, in input order, with
            ``request_id``, ``prompt_tokens`` (int), ``output_len`` (tokens
            asked for), ``cached_tokens`` (prompt tokens served from the
            prefix cache, ``RequestOutput.num_cached_tokens``; ``None`` when
            skipped), ``output_tokens`` (generated token ids; ``[]`` when
            skipped), ``prefill_seconds`` (engine-core time from the request's
            first scheduling to its first token, from vLLM's request metrics;
            ``None`` when skipped or unavailable), ``submitted_s`` (seconds
            after the replay start when it was handed to the engine) and
            ``status`` (``"ok"`` or ``"skipped: <reason>"``).
        prompt_tokens: sum of prompt tokens over the requests that ran.
        hit_tokens: sum of ``cached_tokens`` over the requests that ran.
        token_hit_rate: ``hit_tokens / prompt_tokens`` (0.0 when nothing ran).
        skipped: reason -> number of requests skipped for it.
        wall_seconds: wall-clock seconds spent in the replay loop.
        prefill_seconds: sum of the requests' ``prefill_seconds``.
        mode: how requests were submitted, in words.
        engine_prefix_cache_hits: change of vLLM's ``vllm:prefix_cache_hits``
            counter over the replay, in tokens (``None`` if unavailable).
        engine_prefix_cache_queries: change of ``vllm:prefix_cache_queries``
            over the replay, in tokens (``None`` if unavailable). vLLM counts
            a request's full length (prompt) as queried.
    """

    requests: list[dict[str, Any]]
    prompt_tokens: int
    hit_tokens: int
    token_hit_rate: float
    skipped: dict[str, int]
    wall_seconds: float
    mode: str
    prefill_seconds: float = 0.0
    engine_prefix_cache_hits: int | None = None
    engine_prefix_cache_queries: int | None = None


# ---------------------------------------------------------------- engine build


def _apply_env(settings: EngineSettings) -> None:
    for key, value in DEFAULT_ENV.items():
        os.environ.setdefault(key, value)
    for key, value in settings.env.items():
        if value is None:
            os.environ.pop(str(key), None)
        else:
            os.environ[str(key)] = str(value)


def plugin_settings(model: str, *, admission: str, eviction: str, alpha: float | None = None,
                    num_gpu_blocks: int | None = None, max_model_len: int | None = None,
                    seed: int = 0) -> EngineSettings:
    """Settings for vLLM running the ``AdmissionScheduler`` with one policy pair.

    The pair goes to ``VLLM_ADMISSION_POLICY`` / ``VLLM_ADMISSION_EVICTION``.
    ``alpha`` fixes ``flop``'s alpha (``VLLM_ADMISSION_ALPHA``); ``None``
    leaves it to online tuning and removes a ``VLLM_ADMISSION_ALPHA`` left in
    the environment. Names are not checked here: the scheduler refuses an
    invalid one at engine start.
    """
    env: dict[str, str | None] = {
        "VLLM_ADMISSION_POLICY": admission,
        "VLLM_ADMISSION_EVICTION": eviction,
        "VLLM_ADMISSION_ALPHA": None if alpha is None else repr(float(alpha)),
    }
    return EngineSettings(model=str(model), num_gpu_blocks=num_gpu_blocks,
                          max_model_len=max_model_len,
                          scheduler_cls="vllm_admission.AdmissionScheduler", env=env, seed=seed)


def build_llm(settings: EngineSettings) -> vllm.LLM:
    """Start a vLLM engine with prefix caching for ``settings``.

    Sets each :data:`DEFAULT_ENV` variable only if it is unset, then applies
    ``settings.env`` (these win), then builds ``vllm.LLM`` with
    ``enable_prefix_caching=True``, ``dtype="bfloat16"``,
    ``skip_tokenizer_init=True``, ``enforce_eager=True`` and statistics
    logging on (so :func:`prefix_cache_counters` works). Takes about 6 s of
    engine construction plus ~20 s of first vLLM import on a 2-core CPU
    machine.

    If the engine core runs in a separate process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=1``), the caller's script must build
    the engine under ``if __name__ == "__main__":`` (vLLM spawns workers).

    Args:
        settings: the engine settings.

    Returns:
        The started ``vllm.LLM``. Call ``del llm`` (and ``gc.collect()``) to
        release it before building another in the same process.

    Raises:
        ValueError: from vLLM, e.g. when one request of ``max_model_len``
            tokens does not fit in ``num_gpu_blocks`` (the message gives the
            largest length that fits), or when the model is not found.
        ImportError: if vLLM is not installed.
    """
    _apply_env(settings)
    import vllm
    import vllm.envs as vllm_envs

    # The in-process engine core freezes vllm.envs after its start; a second
    # engine in the same process must see the environment as it is now.
    vllm_envs.disable_envs_cache()

    kwargs: dict[str, Any] = dict(
        model=str(settings.model),
        dtype="bfloat16",
        enable_prefix_caching=True,
        skip_tokenizer_init=True,
        enforce_eager=True,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        disable_log_stats=False,
        seed=settings.seed,
    )
    if settings.num_gpu_blocks is not None:
        kwargs["num_gpu_blocks_override"] = int(settings.num_gpu_blocks)
    if settings.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = int(settings.max_num_batched_tokens)
    if settings.max_model_len is not None:
        kwargs["max_model_len"] = int(settings.max_model_len)
    if settings.scheduler_cls is not None:
        kwargs["scheduler_cls"] = settings.scheduler_cls
    if settings.mamba_ssm_cache_dtype is not None:
        kwargs["mamba_ssm_cache_dtype"] = settings.mamba_ssm_cache_dtype
    if settings.block_size is not None:
        kwargs["block_size"] = int(settings.block_size)
    return vllm.LLM(**kwargs)


_MAX_LEN = re.compile(r"estimated maximum model length is (\d+)")


def build_llm_fitting(settings: EngineSettings) -> tuple[vllm.LLM, str | None]:
    """:func:`build_llm`, lowering ``max_model_len`` to what a small pool holds.

    When ``settings.num_gpu_blocks`` is set, ``settings.max_model_len`` is not,
    and vLLM refuses to start because one request of the model's full length
    does not fit, the engine is built again with the longest length vLLM says
    fits (``settings.max_model_len`` is updated).

    Returns:
        ``(llm, note)``: ``note`` says what was lowered (``None`` if nothing).

    Raises:
        ValueError: as :func:`build_llm`.
    """
    try:
        return build_llm(settings), None
    except ValueError as exc:
        m = _MAX_LEN.search(str(exc))
        if m is None or settings.max_model_len is not None or settings.num_gpu_blocks is None:
            raise
        settings.max_model_len = int(m.group(1))
        note = (f"{settings.num_gpu_blocks} blocks hold at most {settings.max_model_len} tokens "
                f"per request; using max_model_len {settings.max_model_len}")
        return build_llm(settings), note


def shutdown_llm(llm: vllm.LLM) -> None:
    """Stop ``llm``'s engine core now.

    An in-process engine core also tears down process-wide distributed state;
    left to the garbage collector, that can happen under the next engine.
    """
    llm.llm_engine.engine_core.shutdown()


def inprocess_scheduler(llm: vllm.LLM) -> Any:
    """The live ``vllm.v1.core.sched.scheduler.Scheduler`` (or subclass) of ``llm``.

    Path: ``llm.llm_engine.engine_core`` is an ``InprocClient`` when the engine
    core runs in this process; its ``.engine_core`` is the ``EngineCore`` whose
    ``.scheduler`` holds ``kv_cache_manager`` -> ``coordinator`` /
    ``block_pool``.

    Raises:
        RuntimeError: if the engine core runs in another process
            (``VLLM_ENABLE_V1_MULTIPROCESSING=1``).
    """
    client = llm.llm_engine.engine_core
    core = getattr(client, "engine_core", None)
    scheduler = getattr(core, "scheduler", None)
    if scheduler is None:
        raise RuntimeError(
            "the engine core runs in another process; build the engine with "
            "VLLM_ENABLE_V1_MULTIPROCESSING=0 to inspect its scheduler"
        )
    return scheduler


def engine_geometry(llm: vllm.LLM) -> dict[str, Any]:
    """What the simulator must copy from a started engine.

    Returns a dict with:

    * ``block_size`` (tokens per KV block, shared by all groups),
    * ``num_gpu_blocks`` (blocks in the whole pool, null block included),
    * ``max_num_batched_tokens`` (token budget of one step),
    * ``max_model_len`` (tokens),
    * ``mamba_cache_mode`` (``"align"`` with prefix caching on hybrid models),
    * ``mamba_ssm_cache_dtype`` (the setting after the platform's changes:
      ``"float32"`` on CPUs with AVX-512 BF16 when ``"auto"`` was asked for;
      ``"auto"`` means the model's own choice, see ``ssm_state_dtype``),
    * ``ssm_state_dtype``: the dtype of the recurrent (SSM / GDN temporal)
      state as allocated, e.g. ``"bfloat16"`` or ``"float32"`` (``None``
      without Mamba groups or when the engine core runs in another process),
    * ``enable_chunked_prefill``, ``async_scheduling``, ``max_num_seqs``,
    * ``scheduler_cls`` (qualified name or class repr),
    * ``kv_cache_groups``: list of ``{"kind", "num_layers", "block_size",
      "page_size_bytes", "layers"}``; ``kind`` is the core's ``"attention"``
      or ``"state"``, from the group's vLLM manager
      (:func:`vllm_admission.plugin.kv_cache.group_kinds`); ``None`` when
      the engine core runs in another process,
    * ``inprocess`` (bool: whether :func:`inprocess_scheduler` works).

    Raises:
        AttributeError: if ``llm`` is not a vLLM 0.32 ``LLM``.
    """
    vc = llm.llm_engine.vllm_config
    cc = vc.cache_config
    sc = vc.scheduler_config
    geo: dict[str, Any] = {
        "block_size": int(cc.block_size),
        "num_gpu_blocks": int(cc.num_gpu_blocks) if cc.num_gpu_blocks is not None else None,
        "max_num_batched_tokens": int(sc.max_num_batched_tokens),
        "max_model_len": int(vc.model_config.max_model_len),
        "mamba_cache_mode": getattr(cc, "mamba_cache_mode", None),
        "mamba_ssm_cache_dtype": str(cc.mamba_ssm_cache_dtype),
        "enable_chunked_prefill": bool(getattr(sc, "enable_chunked_prefill", True)),
        "async_scheduling": bool(getattr(sc, "async_scheduling", False)),
        "max_num_seqs": int(sc.max_num_seqs),
        "scheduler_cls": str(getattr(sc, "scheduler_cls", None)),
        "kv_cache_groups": None,
        "ssm_state_dtype": None,
        "inprocess": False,
    }
    try:
        scheduler = inprocess_scheduler(llm)
    except RuntimeError:
        return geo
    geo["inprocess"] = True
    from vllm_admission.plugin.kv_cache import group_kinds

    kvc = scheduler.kv_cache_config
    kinds = group_kinds(scheduler.kv_cache_manager.coordinator.single_type_managers)
    geo["num_gpu_blocks"] = int(kvc.num_blocks)
    geo["kv_cache_groups"] = [
        {
            "kind": kind,
            "num_layers": len(g.layer_names),
            "block_size": int(g.kv_cache_spec.block_size),
            "page_size_bytes": int(g.kv_cache_spec.page_size_bytes),
            "layers": list(g.layer_names),
        }
        for g, kind in zip(kvc.kv_cache_groups, kinds)
    ]
    state_dtypes = {str(g.kv_cache_spec.dtypes[-1]).removeprefix("torch.")
                    for g in kvc.kv_cache_groups if hasattr(g.kv_cache_spec, "dtypes")}
    if state_dtypes:
        geo["ssm_state_dtype"] = ",".join(sorted(state_dtypes))
    return geo


def cached_block_positions(llm: vllm.LLM) -> dict[str, list[int]]:
    """Token positions of every block in the prefix cache, per KV cache group.

    Reads ``block_pool.cached_block_hash_to_block`` of the in-process
    scheduler. A block cached for an attention group at position ``n`` holds
    the KV of tokens ``[n - block_size, n)``; a Mamba block at ``n`` holds the
    recurrent state after the first ``n`` tokens. Keys are
    ``"<group index>:<kind>"``; values are sorted, with one entry per cached
    block (a position can repeat when two blocks hold the same prefix).

    Raises:
        RuntimeError: if the engine core runs in another process.
    """
    from vllm.v1.core.kv_cache_utils import get_group_id

    from vllm_admission.plugin.kv_cache import group_kinds
    from vllm_admission.plugin.vllm_hooks import cached_blocks

    scheduler = inprocess_scheduler(llm)
    kinds = group_kinds(scheduler.kv_cache_manager.coordinator.single_type_managers)
    names = [f"{i}:{kind}" for i, kind in enumerate(kinds)]
    out: dict[str, list[int]] = {n: [] for n in names}
    for key, block in cached_blocks(scheduler.kv_cache_manager.block_pool):
        n = block.block_hash_num_tokens
        out[names[get_group_id(key)]].append(int(n) if n is not None else -1)
    for v in out.values():
        v.sort()
    return out


# ---------------------------------------------------------------- accounting


def blocks_needed(prompt_len: int, output_len: int, geometry: dict[str, Any]) -> int:
    """Pool blocks one request holds at its peak on the engine described by ``geometry``
    (:func:`engine_geometry`): :func:`vllm_admission.core.geometry.blocks_needed` with
    the engine's group counts. When the groups are unknown (engine core in another
    process) one attention group and one Mamba group are assumed.

    Raises:
        ValueError: non-positive lengths.
    """
    from vllm_admission.core.geometry import blocks_needed as core_blocks_needed

    groups = geometry.get("kv_cache_groups") or [{"kind": "attention"}, {"kind": "state"}]
    states = sum(g["kind"] == "state" for g in groups)
    return core_blocks_needed(prompt_len, output_len, block_size=int(geometry["block_size"]),
                              num_attention_groups=len(groups) - states, num_state_groups=states,
                              mamba_cache_mode=geometry.get("mamba_cache_mode") or "none")


def _skip_reason(prompt_len: int, output_len: int, geometry: dict[str, Any]) -> str | None:
    total = prompt_len + output_len
    if prompt_len <= 0:
        return "empty prompt"
    if output_len <= 0:
        return "output_len < 1"
    if total > geometry["max_model_len"]:
        return "longer than max_model_len"
    usable = geometry["num_gpu_blocks"] - 1 if geometry.get("num_gpu_blocks") else None
    if usable is not None and blocks_needed(prompt_len, output_len, geometry) > usable:
        return "needs more KV blocks than the pool holds"
    return None


def prefix_cache_counters(llm: vllm.LLM) -> tuple[int | None, int | None]:
    """``(hits, queries)`` of vLLM's ``vllm:prefix_cache_hits`` / ``..._queries`` counters.

    Both are cumulative token counts since the engine started, summed over
    label sets; ``None`` for a counter that is not reported (statistics
    logging off, or another vLLM version).
    """
    hits: int | None = None
    queries: int | None = None
    try:
        metrics = llm.get_metrics()
    except Exception:  # noqa: BLE001 - metrics are optional extras
        return None, None
    for m in metrics:
        value = getattr(m, "value", None)
        if value is None:
            continue
        if m.name == "vllm:prefix_cache_hits":
            hits = (hits or 0) + int(value)
        elif m.name == "vllm:prefix_cache_queries":
            queries = (queries or 0) + int(value)
    return hits, queries


# ---------------------------------------------------------------- replay


def replay(
    llm: vllm.LLM,
    requests: Iterable[Req],
    *,
    vocab_size: int,
    mode: str = "sequential",
    time_scale: float = 1.0,
    after_request: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Send ``requests`` through ``llm`` and record prefix-cache hits per request.

    Every request is sampled greedily (temperature 0) with
    ``max_tokens = output_len``, ``ignore_eos=True`` and no detokenization,
    so it produces exactly ``output_len`` tokens.

    * ``"sequential"``: one request at a time in input order (one
      ``llm.generate`` call each); each finishes before the next is sent.
    * ``"timed"``: request ``i`` is added to the engine
      (``llm.llm_engine.add_request``) once ``arrival_s * time_scale``
      seconds have passed since the start, while the engine steps; requests
      overlap whenever the engine is slower than the trace. Needs every
      request's ``arrival_s``.

    A request that cannot run is skipped before submission and counted in
    ``ReplayResult.skipped`` under its reason: prompt + output longer than
    the engine's ``max_model_len`` (``"longer than max_model_len"``), more
    pool blocks than the pool could ever hand out (see :func:`blocks_needed`;
    ``"needs more KV blocks than the pool holds"``), an empty prompt or
    ``output_len < 1``.

    Args:
        llm: an engine from :func:`build_llm` (any ``vllm.LLM`` with prefix
            caching and ``skip_tokenizer_init=True`` works).
        requests: objects with ``request_id``, ``prompt_len``, ``output_len``,
            ``arrival_s`` (seconds; ``"timed"`` only) and
            ``token_ids(vocab_size)``.
        vocab_size: passed to ``token_ids``; must not exceed the model's
            vocabulary (512 for the tiny model).
        mode: ``"sequential"`` or ``"timed"``.
        time_scale: multiplies arrival times in ``"timed"`` mode (0.1 replays
            ten times faster than the trace); must be >= 0.
        after_request: ``"sequential"`` only: called with the request's index
            after it finished (e.g. to let the plugin's tuner catch up).

    Returns:
        A :class:`ReplayResult`.

    Raises:
        ValueError: for an unknown ``mode``, a non-positive ``vocab_size``, a
            negative ``time_scale``, a request without ``arrival_s`` in
            ``"timed"`` mode, or a request whose ``token_ids`` length differs
            from ``prompt_len``.
    """
    if mode not in _MODES:
        raise ValueError(f"unknown replay mode {mode!r}; known: {sorted(_MODES)}")
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if not time_scale >= 0:
        raise ValueError(f"time_scale must be >= 0, got {time_scale}")
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    geometry = engine_geometry(llm)
    hits0, queries0 = prefix_cache_counters(llm)
    rows: list[dict[str, Any]] = []
    skipped: dict[str, int] = {}
    runnable: list[tuple[int, Any, list[int]]] = []
    for req in requests:
        prompt_len = int(req.prompt_len)
        output_len = int(req.output_len)
        row: dict[str, Any] = {
            "request_id": str(req.request_id),
            "prompt_tokens": prompt_len,
            "output_len": output_len,
            "cached_tokens": None,
            "output_tokens": [],
            "prefill_seconds": None,
            "submitted_s": None,
            "finished_s": None,
        }
        rows.append(row)
        reason = _skip_reason(prompt_len, output_len, geometry)
        if reason is not None:
            row["status"] = f"skipped: {reason}"
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        if mode == "timed" and getattr(req, "arrival_s", None) is None:
            raise ValueError(f"request {req.request_id!r} has no arrival time; timed replay needs one")
        ids = list(req.token_ids(vocab_size))
        if len(ids) != prompt_len:
            raise ValueError(
                f"request {req.request_id!r}: token_ids gave {len(ids)} ids, prompt_len is {prompt_len}"
            )
        runnable.append((len(rows) - 1, req, ids))

    def params(output_len: int) -> SamplingParams:
        return SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True, detokenize=False)

    t0 = time.perf_counter()
    if mode == "sequential":
        for i, (index, req, ids) in enumerate(runnable):
            rows[index]["submitted_s"] = time.perf_counter() - t0
            (out,) = llm.generate([TokensPrompt(prompt_token_ids=ids)], params(req.output_len),
                                  use_tqdm=False)
            _record(rows[index], out)
            rows[index]["finished_s"] = time.perf_counter() - t0
            if after_request is not None:
                after_request(i)
    else:
        _run_timed(llm, runnable, rows, params, TokensPrompt, time_scale, t0)
    wall = time.perf_counter() - t0
    ran = [r for r in rows if r["status"] == "ok"]
    prompt_tokens = sum(r["prompt_tokens"] for r in ran)
    hit_tokens = sum(r["cached_tokens"] for r in ran)
    hits1, queries1 = prefix_cache_counters(llm)
    return ReplayResult(
        requests=rows,
        prompt_tokens=prompt_tokens,
        hit_tokens=hit_tokens,
        token_hit_rate=hit_tokens / prompt_tokens if prompt_tokens else 0.0,
        skipped=skipped,
        wall_seconds=wall,
        mode=_MODES[mode],
        prefill_seconds=sum(r["prefill_seconds"] or 0.0 for r in ran),
        engine_prefix_cache_hits=None if hits0 is None or hits1 is None else hits1 - hits0,
        engine_prefix_cache_queries=None if queries0 is None or queries1 is None else queries1 - queries0,
    )


def _record(row: dict[str, Any], out: Any) -> None:
    """Fill ``row`` from a finished ``RequestOutput``."""
    row["cached_tokens"] = int(out.num_cached_tokens or 0)
    row["output_tokens"] = list(out.outputs[0].token_ids)
    m = getattr(out, "metrics", None)
    first, scheduled = getattr(m, "first_token_ts", 0.0), getattr(m, "scheduled_ts", 0.0)
    row["prefill_seconds"] = float(first - scheduled) if first and scheduled else None
    row["status"] = "ok"


def _run_timed(llm: Any, runnable: list, rows: list, params: Callable, prompt_cls: Any,
               time_scale: float, t0: float) -> None:
    """Add requests at their scaled arrival times while stepping the engine."""
    engine = llm.llm_engine
    start = min((req.arrival_s for _, req, _ in runnable), default=0.0)
    due = [(req.arrival_s - start) * time_scale for _, req, _ in runnable]
    by_id: dict[str, int] = {}
    nxt = 0
    while nxt < len(runnable) or engine.has_unfinished_requests():
        now = time.perf_counter() - t0
        while nxt < len(runnable) and due[nxt] <= now:
            index, req, ids = runnable[nxt]
            rid = f"timed-{index}"
            by_id[rid] = index
            rows[index]["submitted_s"] = now
            # vLLM may suffix the id internally; outputs carry one or the other.
            by_id[engine.add_request(rid, prompt_cls(prompt_token_ids=ids),
                                     params(req.output_len))] = index
            nxt += 1
        if engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    row = rows[by_id[out.request_id]]
                    _record(row, out)
                    row["finished_s"] = time.perf_counter() - t0
        elif nxt < len(runnable):
            time.sleep(max(0.0, min(due[nxt] - now, 0.05)))
