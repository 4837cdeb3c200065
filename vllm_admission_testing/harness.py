"""Drive vLLM's scheduler without a model: for fast tests and the overhead benchmark.

vLLM's own scheduler tests build a ``VllmConfig`` and a ``KVCacheConfig`` by
hand and answer ``Scheduler.schedule()`` with made-up model-runner outputs.
This module does the same for a hybrid layout (full-attention groups plus
Mamba/GDN state groups, vLLM's align mode):

* :func:`write_config_only_model`: a model directory holding only the tiny
  Qwen3-Next ``config.json`` (no weights: nothing is loaded);
* :func:`make_vllm_config`: the engine configuration vLLM derives for it;
* :func:`make_kv_cache_config`: a pool of ``num_blocks`` blocks shared by the
  given groups;
* :class:`FakeEngine`: adds requests and runs ``schedule()`` /
  ``update_from_output()`` steps, sampling a fixed token, until they finish;
  with async scheduling on it keeps a queue of two batches in flight, as
  vLLM's ``EngineCore.step_with_batch_queue`` does (``vllm/v1/engine/core.py``).

The scheduler sees exactly what it sees in a real engine step, except that no
forward pass runs. Timings of ``schedule()`` and ``update_from_output()`` are
accumulated in :attr:`FakeEngine.seconds` (wall clock) and
:attr:`FakeEngine.cpu_seconds` (process CPU time).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["FakeEngine", "make_kv_cache_config", "make_scheduler", "make_vllm_config",
           "write_config_only_model"]


def write_config_only_model(out_dir: str | Path, *, max_position_embeddings: int = 131072) -> Path:
    """Write the tiny Qwen3-Next ``config.json`` (only) to ``out_dir``; return the path."""
    from transformers import Qwen3NextConfig

    from vllm_admission.engine.tiny_model import tiny_model_config_kwargs

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = Qwen3NextConfig(**tiny_model_config_kwargs(max_position_embeddings))
    config.architectures = ["Qwen3NextForCausalLM"]
    config.to_json_file(str(out / "config.json"))
    return out


def make_vllm_config(model_dir: str | Path, *, block_size: int | None = None,
                     max_num_batched_tokens: int = 4096, max_model_len: int = 131072,
                     enable_prefix_caching: bool = True, max_num_seqs: int = 256,
                     async_scheduling: bool = False) -> Any:
    """The ``VllmConfig`` vLLM builds for ``model_dir`` (bf16, no tokenizer, eager).

    The SSM state dtype is pinned to bf16 (the dtype of :func:`make_kv_cache_config`'s
    state spec), so vLLM's CPU platform does not switch it to float32 on CPUs with
    AVX-512 BF16 (``vllm/platforms/cpu.py``).

    Args:
        async_scheduling: the configuration a GPU engine gets by default
            (``scheduler_config.async_scheduling``, two batches in flight).
            vLLM's CPU platform turns it off while building the configuration
            (``vllm/platforms/cpu.py``), so it is set on the finished object, as
            the GPU platform leaves it; nothing here runs a model.
    """
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=str(model_dir), skip_tokenizer_init=True, dtype="bfloat16",
                      mamba_ssm_cache_dtype="bfloat16",
                      enable_prefix_caching=enable_prefix_caching, enforce_eager=True,
                      max_model_len=max_model_len, max_num_batched_tokens=max_num_batched_tokens,
                      max_num_seqs=max_num_seqs, block_size=block_size)
    config = args.create_engine_config()
    if async_scheduling:
        config.scheduler_config.async_scheduling = True
    return config


def make_kv_cache_config(vllm_config: Any, num_blocks: int, *,
                         kinds: Sequence[str] = ("state", "attention"),
                         layers_per_group: int = 2, page_size: int = 65536,
                         prefill_checkpoint_alignment: int | None = None,
                         state_layer: str = "GDN_ATTN") -> Any:
    """A ``KVCacheConfig`` of ``num_blocks`` blocks for groups of the given kinds.

    ``"state"`` groups get a ``MambaSpec`` (GDN shapes of the tiny model,
    padded to ``page_size``; ``mamba_type`` the ``MambaAttentionBackendEnum``
    member named ``state_layer``, Gated DeltaNet's by default, ``"MAMBA2"`` for
    a Mamba2 layer's), ``"attention"`` groups a ``FullAttentionSpec``
    whose page is ``page_size`` bytes. Retention follows the engine config
    (vLLM's default keeps only reachable Mamba states).

    Args:
        prefill_checkpoint_alignment: ``None`` (default): the state spec vLLM
            builds for a layer that cannot export a state from inside a
            prefill (0.32's and 0.33's CPU GDN, 0.33's Triton GDN). A positive
            number of tokens: the spec of a layer that exports one checkpoint
            per prefill (``num_prefill_checkpoint_blocks=1``,
            ``prefill_checkpoint_alignment`` this value), as vLLM 0.33 builds
            for Qwen GDN layers on the FlashInfer prefill backend
            (``model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py``
            ``get_kv_cache_spec``: the alignment is the prefix-cache grid, the
            Mamba block size when no ``prefix_match_unit`` is set) and 0.32
            already builds for Mamba2 layers (``mamba_mixer2.py``, alignment 1).

    Raises:
        ValueError: an unknown kind, or a non-positive alignment.
        KeyError: ``state_layer`` names no ``MambaAttentionBackendEnum`` member.
    """
    if prefill_checkpoint_alignment is not None and prefill_checkpoint_alignment <= 0:
        raise ValueError(f"prefill_checkpoint_alignment must be a positive number of tokens, "
                         f"got {prefill_checkpoint_alignment}")
    import torch
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        KVCacheTensor,
        MambaSpec,
    )

    cache = vllm_config.cache_config
    block_size = cache.block_size
    groups = []
    layer = 0
    for kind in kinds:
        names = [f"model.layers.{layer + i}.{'linear_attn' if kind == 'state' else 'self_attn'}"
                 for i in range(layers_per_group)]
        layer += layers_per_group
        if kind == "state":
            export = {} if prefill_checkpoint_alignment is None else {
                "num_prefill_checkpoint_blocks": 1,
                "prefill_checkpoint_alignment": prefill_checkpoint_alignment}
            spec = MambaSpec(block_size=block_size, shapes=((3, 512), (4, 64, 64)),
                             dtypes=(torch.bfloat16, torch.bfloat16), page_size_padded=page_size,
                             mamba_cache_mode=cache.mamba_cache_mode,
                             mamba_type=MambaAttentionBackendEnum[state_layer], **export)
        elif kind == "attention":
            head = 64
            heads = max(1, page_size // (2 * block_size * head * 2))
            spec = FullAttentionSpec(block_size=block_size, num_kv_heads=heads, head_size=head,
                                     dtype=torch.bfloat16)
        else:
            raise ValueError(f"kind must be 'state' or 'attention', got {kind!r}")
        groups.append(KVCacheGroupSpec(names, spec))
    tensors = [KVCacheTensor(size=page_size * num_blocks, layers=[g.layer_names[i] for g in groups],
                             layer_stride=0, block_stride=page_size)
               for i in range(layers_per_group)]
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=tensors, kv_cache_groups=groups,
                         prefix_cache_retention_interval=cache.prefix_cache_retention_interval)


def make_scheduler(cls: type, vllm_config: Any, kv_cache_config: Any, *,
                   log_stats: bool = True) -> Any:
    """Build ``cls`` (vLLM's ``Scheduler`` or a subclass) as ``EngineCore`` does."""
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
    from vllm.v1.structured_output import StructuredOutputManager

    vllm_config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
    block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
               structured_output_manager=StructuredOutputManager(vllm_config),
               block_size=block_size, hash_block_size=hash_block_size, log_stats=log_stats)


class FakeEngine:
    """Runs a scheduler with made-up model outputs (every step samples ``token``).

    With ``batch_queue`` 1 each step is ``schedule()`` then ``update_from_output()``
    of that step (``EngineCore.step``). With 2, as ``EngineCore`` runs vLLM's
    async scheduling (``step_with_batch_queue``, ``vllm/v1/engine/core.py``): a
    step schedules the next batch first and, while the queue is not full, returns
    without waiting; otherwise it takes the output of the oldest batch in flight.
    The fake forward pass never finishes early, so the queue is as deep as vLLM
    lets it get.

    Args:
        scheduler: a built scheduler.
        token: the token id every decode step "samples".
        batch_queue: batches in flight; default: 2 when the scheduler's
            configuration has async scheduling on, else 1 (vLLM's
            ``max_concurrent_batches`` for one pipeline stage).
    """

    def __init__(self, scheduler: Any, token: int = 7, batch_queue: int | None = None) -> None:
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        self.scheduler = scheduler
        self.token = token
        cache = scheduler.vllm_config.cache_config
        hash_fn = get_hash_fn_by_name(cache.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self._hasher = get_request_block_hasher(scheduler.hash_block_size, hash_fn)
        #: Wall-clock and process CPU seconds spent in ``schedule()`` + ``update_from_output()``.
        self.seconds = 0.0
        self.cpu_seconds = 0.0
        self.steps = 0
        #: The ``SchedulerOutput`` of the last step.
        self.last_output: Any = None
        #: Finished requests' last ``EngineCoreOutput``, by request id.
        self.outputs: dict[str, Any] = {}
        #: Prompt tokens each request found cached (``num_cached_tokens``).
        self.cached_tokens: dict[str, int] = {}
        #: Steps that scheduled at least one token (forward passes a real engine runs).
        self.forward_passes = 0
        if batch_queue is None:
            batch_queue = 2 if scheduler.scheduler_config.async_scheduling else 1
        if batch_queue < 1:
            raise ValueError(f"batch_queue must be >= 1, got {batch_queue}")
        self.batch_queue = batch_queue
        # (scheduler output, ids of the requests that sample a token in it), newest first.
        self._in_flight: deque[tuple[Any, set[str]]] = deque()
        #: vLLM's own prefix-cache counters summed over the steps (what
        #: ``vllm:prefix_cache_*`` export): ``requests``, ``queries``, ``hits``
        #: for first admissions, ``preempted_requests``, ``preempted_queries``,
        #: ``preempted_hits`` for admissions after a preemption
        #: (``PrefixCacheStats``, ``vllm/v1/metrics/stats.py``); all 0 unless
        #: the scheduler was built with ``log_stats=True``.
        self.prefix_cache: dict[str, int] = dict.fromkeys(
            ("requests", "queries", "hits", "preempted_requests", "preempted_queries",
             "preempted_hits"), 0)
        self._n = 0

    def add(self, prompt: Sequence[int], max_tokens: int, request_id: str | None = None) -> str:
        """Queue a request with greedy-like sampling and ``max_tokens`` outputs."""
        from vllm import SamplingParams
        from vllm.v1.request import Request

        rid = request_id if request_id is not None else f"req-{self._n}"
        self._n += 1
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        req = Request(request_id=rid, prompt_token_ids=list(prompt), sampling_params=params,
                      pooling_params=None, block_hasher=self._hasher)
        self.scheduler.add_request(req)
        return rid

    def step(self) -> list[Any]:
        """One engine step (see the class); returns the requests it finished."""
        from vllm.v1.outputs import ModelRunnerOutput

        sched = self.scheduler
        if sched.has_requests():
            c0 = time.process_time()
            t0 = time.perf_counter()
            out = sched.schedule()
            self.seconds += time.perf_counter() - t0
            self.cpu_seconds += time.process_time() - c0
            # A request samples in this step when the step reaches the end of
            # what it has to compute (vLLM's ``is_prefill_chunk`` is then false).
            sampling = {rid for rid in out.num_scheduled_tokens
                        if not sched.requests[rid].is_prefill_chunk}
            self._in_flight.appendleft((out, sampling))
            self.last_output = out
            self.steps += 1
            executed = out.total_num_scheduled_tokens > 0
            self.forward_passes += executed
            if len(self._in_flight) < self.batch_queue and (executed or sched.has_requests()):
                return []
        elif not self._in_flight:
            return []
        out, sampling = self._in_flight.pop()
        req_ids = list(out.num_scheduled_tokens)
        runner = ModelRunnerOutput(req_ids=req_ids,
                                   req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                   sampled_token_ids=[[self.token] if r in sampling else []
                                                      for r in req_ids])
        c2 = time.process_time()
        t2 = time.perf_counter()
        eco = sched.update_from_output(out, runner)
        self.seconds += time.perf_counter() - t2
        self.cpu_seconds += time.process_time() - c2
        finished = []
        for client_outputs in eco.values():
            stats = client_outputs.scheduler_stats
            if stats is not None and stats.prefix_cache_stats is not None:
                for key in self.prefix_cache:
                    self.prefix_cache[key] += getattr(stats.prefix_cache_stats, key)
            for o in client_outputs.outputs:
                if o.prefill_stats is not None and o.request_id not in self.cached_tokens:
                    self.cached_tokens[o.request_id] = o.prefill_stats.num_cached_tokens
                if o.finished:
                    finished.append(o)
                    self.outputs[o.request_id] = o
        return finished

    def busy(self) -> bool:
        """Whether a request is in the scheduler or a batch is in flight."""
        return bool(self._in_flight) or self.scheduler.has_requests()

    def run(self, max_steps: int = 1_000_000) -> list[Any]:
        """Step until no request is left; returns the finished outputs in order."""
        done: list[Any] = []
        for _ in range(max_steps):
            if not self.busy():
                return done
            done.extend(self.step())
        raise RuntimeError(f"requests still unfinished after {max_steps} steps")

    def abort(self, request_id: str) -> None:
        """Abort a request (as the engine does on a client disconnect)."""
        from vllm.v1.request import RequestStatus

        self.scheduler.finish_requests(request_id, RequestStatus.FINISHED_ABORTED)
