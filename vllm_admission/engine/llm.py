"""Build a real vLLM ``LLM`` for this project's machines and look inside it.

Engine construction (:func:`build_llm`) bakes in what vLLM's CPU backend needs
on this project's machines (bf16, eager mode, no tokenizer, a bounded KV
cache) and, by default, runs the engine core *in the calling process*
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``). That makes engine start faster, avoids
the spawn-only ``if __name__ == "__main__":`` requirement, and lets callers
read the live scheduler and block pool through :func:`inprocess_scheduler`
(:func:`engine_geometry`, :func:`cached_block_positions`). Pass
``env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}`` to get vLLM's default separate
engine-core process instead (then :func:`inprocess_scheduler` raises).

Only :class:`EngineSettings` is usable without vLLM installed; everything that
touches the engine imports vLLM lazily.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_admission.core.errors import UserError
from vllm_admission.core.settings import Settings, env_vars
from vllm_admission.engine.engine_geometry import EngineGeometry, KVCacheGroupInfo
from vllm_admission.plugin.boundary.hooks import inprocess_scheduler, wrap_schedule

if TYPE_CHECKING:  # pragma: no cover
    import vllm

__all__ = [
    "DEFAULT_ENV",
    "EngineSettings",
    "PrefillStepCounter",
    "build_llm",
    "build_llm_fitting",
    "cached_block_positions",
    "engine_geometry",
    "inprocess_scheduler",
    "plugin_settings",
    "prefix_cache_counters",
    "shutdown_llm",
]

#: Environment variables :func:`build_llm` sets when (and only when) unset.
DEFAULT_ENV: dict[str, str] = {
    # GiB of host memory for the KV cache on the CPU backend; the default asks
    # for more than a 24 GiB, 2-core machine's NUMA node has free.
    "VLLM_CPU_KVCACHE_SPACE": "1",
    # Engine core in this process: inspectable scheduler, no spawn.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}

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
        env: extra environment variables; they override both the caller's
            environment and :data:`DEFAULT_ENV`, and a value of ``None``
            removes one. vLLM's own (``VLLM_CPU_KVCACHE_SPACE``,
            ``VLLM_PLUGINS``, ...) are set in ``os.environ`` before the engine
            starts. The plugin's (``VLLM_ADMISSION_*``, e.g. the policy pair)
            are read into a ``Settings`` that the in-process scheduler
            gets as an object; only for an engine core in its own process are
            they set in ``os.environ`` (see :func:`build_llm`).
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
        enable_prefix_caching: vLLM's prefix cache. ``False`` also turns off
            the hybrid models' ``align`` mode (``mamba_cache_mode`` stays
            ``"none"``), so prefill chunks end only at the token budget;
            meant for measuring what caching costs (``AdmissionScheduler``
            then runs as the stock scheduler).
        engine_args: more of vLLM's own engine arguments, by vLLM's names,
            passed to ``vllm.LLM`` as they are (e.g.
            ``{"prefix_cache_retention_interval": None}``); a key that one of
            the fields above also sets is refused.
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
    enable_prefix_caching: bool = True
    engine_args: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- engine build


#: Prefix of the plugin's own variables (:mod:`vllm_admission.plugin.env`).
PLUGIN_PREFIX = "VLLM_ADMISSION_"


def _set_env(items: Iterable[tuple[str, str | None]]) -> None:
    for key, value in items:
        if value is None:
            os.environ.pop(str(key), None)
        else:
            os.environ[str(key)] = str(value)


def _apply_env(settings: EngineSettings) -> dict[str, str]:
    """Put vLLM's own variables of ``settings.env`` (and :data:`DEFAULT_ENV`) into
    ``os.environ``, where vLLM reads them; return the environment the plugin's
    settings are read from: ``os.environ`` with ``settings.env``'s plugin
    variables applied (``None`` removes one), ``os.environ`` itself untouched."""
    for key, default in DEFAULT_ENV.items():
        os.environ.setdefault(key, default)
    _set_env((k, v) for k, v in settings.env.items() if not str(k).startswith(PLUGIN_PREFIX))
    merged = dict(os.environ)
    for key, value in settings.env.items():
        if str(key).startswith(PLUGIN_PREFIX):
            if value is None:
                merged.pop(str(key), None)
            else:
                merged[str(key)] = str(value)
    return merged


def _scheduler_cls(settings: EngineSettings, environ: dict[str, str]) -> Any:
    """What ``scheduler_cls`` vLLM gets, and where the plugin's settings go.

    The plugin's variables are read here, once (an invalid one raises
    ``SettingsError`` before the engine starts). With the engine core in
    this process the ``AdmissionScheduler`` gets them as a ``Settings``
    (:meth:`AdmissionScheduler.configured
    <vllm_admission.plugin.scheduler.AdmissionScheduler.configured>`). An engine
    core in a process of its own reads them from its environment, so they are
    set in ``os.environ`` for it to inherit: the one place where this module
    writes the plugin's settings there.
    """
    name = settings.scheduler_cls
    if name is None or not str(name).startswith("vllm_admission"):
        return name
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from vllm_admission.core.settings import Settings
    from vllm_admission.plugin.scheduler import AdmissionScheduler

    cls = resolve_obj_by_qualname(str(name))
    if not (isinstance(cls, type) and issubclass(cls, AdmissionScheduler)):
        return name
    config = Settings.from_env(environ)
    # Settings the engine's configuration cannot run fail before the model loads.
    from vllm_admission.plugin.boundary.hooks import install_preflight
    from vllm_admission.plugin.boundary.register import check_before_load

    install_preflight(check_before_load)
    if not bool(int(os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1"))):
        return cls.configured(config)
    _set_env((k, v) for k, v in settings.env.items() if str(k).startswith(PLUGIN_PREFIX))
    return name


def plugin_settings(model: str, policy: Settings | None = None, *,
                    num_gpu_blocks: int | None = None, max_model_len: int | None = None,
                    seed: int = 0, **fields: Any) -> EngineSettings:
    """Settings for vLLM running the ``AdmissionScheduler`` with ``policy`` (default: the
    defaults), or with the defaults and ``fields`` (``admission="marconi"``).

    The engine gets them as ``VLLM_ADMISSION_*`` variables
    (:meth:`~vllm_admission.core.settings.Settings.to_env`); each settings variable they
    leave at its default is removed from the environment, so nothing left there from an
    earlier engine applies. Names are not checked here: the scheduler refuses an invalid
    one at engine start (one line).
    """
    policy = dataclasses.replace(policy or Settings(), **fields)
    env: dict[str, str | None] = {name: None for name in env_vars()}
    env.update(policy.to_env())
    return EngineSettings(model=str(model), num_gpu_blocks=num_gpu_blocks,
                          max_model_len=max_model_len,
                          scheduler_cls="vllm_admission.AdmissionScheduler", env=env, seed=seed)


def build_llm(settings: EngineSettings) -> vllm.LLM:
    """Start a vLLM engine with prefix caching for ``settings``.

    Sets each :data:`DEFAULT_ENV` variable only if it is unset, then applies
    ``settings.env`` (these win; the plugin's settings go to the scheduler as an
    ``Settings`` when the engine core runs in this process, and through
    the environment the engine-core process inherits otherwise), then builds
    ``vllm.LLM`` with
    ``enable_prefix_caching`` as in ``settings`` (default on), ``dtype="bfloat16"``,
    ``skip_tokenizer_init=True``, ``enforce_eager=True`` and statistics
    logging on (so :func:`prefix_cache_counters` works). On vLLM's CPU
    platform it first installs
    :func:`vllm_admission.plugin.boundary.register.install_vllm_fixes` (Mamba2 layers
    declare no prefill-checkpoint export, which the CPU kernels cannot write;
    the speculative-decoding state copies; on any platform, block copies of
    whole pages; in this process only, so an engine core in another process
    needs the general plugin loaded and asked). Takes about 6 s of
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
        SettingsError: an invalid ``VLLM_ADMISSION_*`` setting (one
            line; a ``ValueError``), before the engine starts.
        ValueError: from vLLM, e.g. when one request of ``max_model_len``
            tokens does not fit in ``num_gpu_blocks`` (the message gives the
            largest length that fits), or when the model is not found.
        ImportError: if vLLM is not installed.
    """
    environ = _apply_env(settings)
    import vllm
    import vllm.envs as vllm_envs

    from vllm_admission.plugin.boundary.register import install_vllm_fixes

    # Stock engines run with VLLM_PLUGINS="" (no general plugin): a Mamba2 model on
    # vLLM's CPU platform still needs its prefill-checkpoint export off, MTP drafts
    # need the state kernels the CPU build lacks, and a hit inside a block needs its
    # copied block whole.
    install_vllm_fixes()

    # The in-process engine core freezes vllm.envs after its start; a second
    # engine in the same process must see the environment as it is now.
    vllm_envs.disable_envs_cache()

    kwargs: dict[str, Any] = dict(
        model=str(settings.model),
        dtype="bfloat16",
        enable_prefix_caching=bool(settings.enable_prefix_caching),
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
    scheduler_cls = _scheduler_cls(settings, environ)
    if scheduler_cls is not None:
        kwargs["scheduler_cls"] = scheduler_cls
    if settings.mamba_ssm_cache_dtype is not None:
        kwargs["mamba_ssm_cache_dtype"] = settings.mamba_ssm_cache_dtype
    if settings.block_size is not None:
        kwargs["block_size"] = int(settings.block_size)
    clash = sorted(set(kwargs) & set(settings.engine_args))
    if clash:
        raise UserError(f"engine_args repeats {', '.join(clash)}, which EngineSettings sets "
                        f"itself; use its field instead")
    kwargs.update(settings.engine_args)
    return vllm.LLM(**kwargs)


_MAX_LEN = re.compile(r"estimated maximum model length is (\d+)")


def build_llm_fitting(settings: EngineSettings, *,
                      fitted: dict[int, int] | None = None) -> tuple[vllm.LLM, str | None]:
    """:func:`build_llm`, lowering ``max_model_len`` to what a small pool holds.

    When ``settings.num_gpu_blocks`` is set, ``settings.max_model_len`` is not,
    and vLLM refuses to start because one request of the model's full length
    does not fit, the engine is built again with the longest length vLLM says
    fits (``settings.max_model_len`` is updated).

    ``fitted`` (pool size in blocks -> tokens), if given, carries that length from
    one build to the next on the same model: the length fitted for a pool is kept
    there, and a later build on that pool starts at it instead of being refused
    first. The engine is the same either way.

    Returns:
        ``(llm, note)``: ``note`` says what was lowered (``None`` if nothing).

    Raises:
        ValueError: as :func:`build_llm`.
    """
    blocks = settings.num_gpu_blocks
    if settings.max_model_len is None and blocks is not None and fitted is not None and blocks in fitted:
        settings.max_model_len = fitted[blocks]
        return build_llm(settings), _lowered_note(blocks, fitted[blocks])
    try:
        return build_llm(settings), None
    except ValueError as exc:
        m = _MAX_LEN.search(str(exc))
        if m is None or settings.max_model_len is not None or blocks is None:
            raise
        settings.max_model_len = int(m.group(1))
        if fitted is not None:
            fitted[blocks] = settings.max_model_len
        return build_llm(settings), _lowered_note(blocks, settings.max_model_len)


def _lowered_note(blocks: int, max_model_len: int) -> str:
    return (f"{blocks} blocks hold at most {max_model_len} tokens per request; using "
            f"max_model_len {max_model_len}")


def shutdown_llm(llm: vllm.LLM) -> None:
    """Stop ``llm``'s engine core now.

    An in-process engine core also tears down process-wide distributed state;
    left to the garbage collector, that can happen under the next engine.
    """
    llm.llm_engine.engine_core.shutdown()


class PrefillStepCounter:
    """Counts, per request, the engine steps that scheduled prompt tokens for it.

    Observes the live scheduler of an in-process engine core: while the
    counter is open, the scheduler's ``schedule`` is wrapped
    (:func:`vllm_admission.plugin.boundary.hooks.wrap_schedule`: an instance
    attribute shadowing the class method, which ``EngineCore.step`` calls).
    After each ``schedule()`` call, every request in the step's
    ``SchedulerOutput.num_scheduled_tokens`` whose computed tokens *before*
    the step were fewer than its prompt tokens counts one prefill step (vLLM
    advances ``num_computed_tokens`` inside ``schedule()``, in
    ``_update_after_schedule``). The step that finishes the prompt (and
    samples the first token) counts; decode steps do not; a preempted request
    that recomputes its prompt counts those steps again.

    Keys are the engine's request ids (``LLMEngine.add_request`` returns
    them; vLLM appends 8 random characters to the caller's id), in the order
    of each request's first prefill step. Use as a context manager, or call
    :meth:`close`.

    Args:
        target: a ``vllm.LLM`` whose engine core runs in this process, or a
            vLLM 0.32 ``Scheduler`` itself (e.g. one driven without a model
            by :class:`vllm_admission_testing.harness.FakeEngine`).

    Raises:
        RuntimeError: the engine core runs in another process
            (from :func:`inprocess_scheduler`), or the scheduler's
            ``schedule`` is already wrapped by another counter.
    """

    def __init__(self, target: Any) -> None:
        scheduler = inprocess_scheduler(target) if hasattr(target, "llm_engine") else target
        if getattr(scheduler.__dict__.get("schedule"), "_prefill_step_counter", None) is not None:
            raise RuntimeError("this scheduler already has a PrefillStepCounter open")
        #: engine request id -> prefill steps seen so far.
        self.counts: dict[str, int] = {}
        requests, counts = scheduler.requests, self.counts

        def count(out: Any) -> None:
            for rid, n in out.num_scheduled_tokens.items():
                req = requests.get(rid)
                if req is not None and n > 0 and req.num_computed_tokens - n < req.num_prompt_tokens:
                    counts[rid] = counts.get(rid, 0) + 1

        self._scheduler = scheduler
        self._undo = wrap_schedule(scheduler, count)
        scheduler.schedule._prefill_step_counter = self  # type: ignore[attr-defined]

    def take(self, request_id: str) -> int:
        """Prefill steps counted for engine request ``request_id`` (0 if none), forgotten after."""
        return self.counts.pop(request_id, 0)

    def take_all(self) -> dict[str, int]:
        """Every count so far (engine request id -> steps); the counter starts from empty."""
        out = dict(self.counts)
        self.counts.clear()
        return out

    def close(self) -> None:
        """Restore the scheduler's own ``schedule``. Idempotent."""
        if self._scheduler is None:
            return
        self._undo()
        self._scheduler = None

    def __enter__(self) -> PrefillStepCounter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _class_name(cls: Any) -> str:
    """A scheduler class as the user names it: the qualified name given, or the
    class's ``module.name`` (``vllm_admission.AdmissionScheduler`` for a
    :meth:`configured <vllm_admission.plugin.scheduler.AdmissionScheduler.configured>` one)."""
    return f"{cls.__module__}.{cls.__qualname__}" if isinstance(cls, type) else str(cls)


def engine_geometry(llm: vllm.LLM) -> EngineGeometry:
    """What the simulator must copy from a started engine
    (:class:`~vllm_admission.engine.engine_geometry.EngineGeometry`): its ``VllmConfig``'s
    settings and, when the engine core runs in this process (:func:`inprocess_scheduler`),
    its KV cache groups, pool, state dtype, hidden-state group and host tier.

    Raises:
        AttributeError: if ``llm`` is not a vLLM 0.32 ``LLM``.
    """
    vc = llm.llm_engine.vllm_config
    cc = vc.cache_config
    sc = vc.scheduler_config
    spec = vc.speculative_config
    settings = {
        "block_size": int(cc.block_size),
        "num_gpu_blocks": int(cc.num_gpu_blocks) if cc.num_gpu_blocks is not None else None,
        "max_num_batched_tokens": int(sc.max_num_batched_tokens),
        "max_model_len": int(vc.model_config.max_model_len),
        "mamba_cache_mode": getattr(cc, "mamba_cache_mode", None),
        "mamba_ssm_cache_dtype": str(cc.mamba_ssm_cache_dtype),
        "prefix_cache_retention_interval": cc.prefix_cache_retention_interval,
        "prefix_match_unit": getattr(cc, "prefix_match_unit", None),
        "speculative_method": None if spec is None else str(spec.method),
        "num_speculative_tokens": 0 if spec is None else int(spec.num_speculative_tokens or 0),
        "enable_chunked_prefill": bool(getattr(sc, "enable_chunked_prefill", True)),
        "async_scheduling": bool(getattr(sc, "async_scheduling", False)),
        "max_num_seqs": int(sc.max_num_seqs),
        "scheduler_cls": _class_name(sc.scheduler_cls),
    }
    try:
        scheduler = inprocess_scheduler(llm)
    except RuntimeError:
        return EngineGeometry(**settings)
    from vllm_admission.plugin.kv_cache import exports_prompt_end_state, group_kinds
    from vllm_admission.plugin.offload_config import host_tier

    kvc = scheduler.kv_cache_config
    kinds = group_kinds(scheduler.kv_cache_manager.coordinator.single_type_managers)
    pairs = list(zip(kvc.kv_cache_groups, kinds, strict=True))
    state_dtypes = {str(g.kv_cache_spec.dtypes[-1]).removeprefix("torch.")
                    for g in kvc.kv_cache_groups if hasattr(g.kv_cache_spec, "dtypes")}
    host_chunks, host_policy = host_tier(scheduler)
    control = getattr(scheduler, "_admission", None)  # None: stock vLLM's scheduler
    host_admission = control.requests.host_policy if control is not None else None
    return EngineGeometry(
        **{**settings, "num_gpu_blocks": int(kvc.num_blocks)},
        kv_cache_groups=tuple(
            KVCacheGroupInfo(kind=kind, num_layers=len(g.layer_names),
                             block_size=int(g.kv_cache_spec.block_size),
                             page_size_bytes=int(g.kv_cache_spec.page_size_bytes),
                             layers=tuple(g.layer_names))
            for g, kind in pairs),
        ssm_state_dtype=",".join(sorted(state_dtypes)) if state_dtypes else None,
        inprocess=True,
        hidden_state_bytes_per_token=sum(_hidden_bytes_per_token(g.kv_cache_spec)
                                         for g, kind in pairs if kind == "hidden"),
        host_chunks=host_chunks, host_policy=host_policy,
        host_admission=host_admission.name if host_admission is not None else None,
        prompt_end_export=exports_prompt_end_state(kvc, vc.cache_config))


def _hidden_bytes_per_token(spec: Any) -> int:
    """Bytes one token takes in a ``HiddenStateCacheSpec`` group, before its page is
    padded (one head per hidden-state layer, ``head_size`` = ``hidden_size``)."""
    from vllm.utils.torch_utils import get_dtype_size

    return int(spec.num_kv_heads * spec.head_size * get_dtype_size(spec.dtype))


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

    from vllm_admission.plugin.boundary.hooks import cached_blocks
    from vllm_admission.plugin.kv_cache import group_kinds

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
