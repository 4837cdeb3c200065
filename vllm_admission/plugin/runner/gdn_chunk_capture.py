"""Gated DeltaNet checkpoints on the GPU path, read from the chunk kernel's own states.

On CUDA, vLLM 0.32 runs a GDN layer's prefill (``QwenGatedDeltaNetAttention._forward_core``
in ``model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py``, Triton/FLA backend) as the
Triton causal conv1d (``ops/causal_conv1d.py`` ``causal_conv1d_fn``) followed by the chunked
delta rule (``third_party/flash_linear_attention/ops/chunk.py``
``chunk_gated_delta_rule_fwd``). On its way, the delta rule's state pass
(``chunk_delta_h.py`` ``chunk_gated_delta_rule_fwd_h``) stores the recurrent state at the
start of every 64-token chunk of every sequence, ``h``, because the output stage
(``chunk_o.py`` ``chunk_fwd_o``) needs it. The state at a checkpoint offset that is a
multiple of 64 is therefore already in memory; this module reads it from there instead of
ending the forward pass at the checkpoint (split mode) or running the kernels in segments
(the CPU path, :mod:`~vllm_admission.plugin.runner.gdn_capture`).

Facts this relies on (vLLM 0.32, ``chunk_delta_h.py``; ``FLA_CHUNK_SIZE = 64`` in ``utils.py``):

* ``h`` has shape ``[1, NT, H, V, K]`` for a varlen batch (``cu_seqlens`` given), with
  ``NT = sum_i ceil(L_i / 64)``. Sequence ``i``'s chunks start at
  ``chunk_offsets[i] = sum_{j<i} ceil(L_j / 64)``, and ``h[0, chunk_offsets[i] + c]`` is the
  state *before* its chunk ``c``, i.e. after its first ``64 c`` tokens (``c = 0`` is the
  initial state). The state after chunk ``c`` is entry ``c + 1``; the state after the last
  chunk is not in ``h`` at all: it is ``final_state[i]`` (float32 ``[N, H, V, K]``, only
  with ``output_final_state=True``), which vLLM writes to the sequence's running row.
* ``h`` is allocated in the dtype of ``k`` (bfloat16 for the Qwen models): each entry is the
  kernel's float32 running state rounded to that dtype. With a bfloat16 SSM cache (Qwen3-Next's
  default) that is exactly what split mode would store (``final_state.to(ssm_state.dtype)``);
  with a float32 SSM cache (Qwen3.5's config asks for it) a checkpoint read from ``h`` has
  bfloat16 precision where split mode keeps float32 (relative error up to 2**-8 per
  element: half a bf16 step).
* The conv state at offset ``p`` is the last ``width - 1`` conv *inputs* before ``p``
  (``causal_conv1d_fn`` keeps ``x`` itself, cast to the cache dtype); they are gathered from
  the layer's ``mixed_qkv`` before the conv.

So an offset is readable iff it is a multiple of 64 from the start of the sequence's chunk.
Checkpoint offsets are multiples of the block size ``B`` (chunk start and checkpoint are both
block-aligned), so every checkpoint is readable iff ``B`` is a multiple of 64:
:func:`gpu_block_size_problem` says so in one line. vLLM's hybrid alignment
(``platforms/interface.py`` ``_align_hybrid_block_size``) gives Qwen3-Next 544 tokens and
Qwen3.5 1,056 (both 32 mod 64) unless ``--block-size`` is a multiple of 64 (64 gives 576
and 1,088).

Checked and timed on an H200 against vLLM 0.32's own Triton kernels
(``benchmarks/gpu_inpass_bench.py``; ``docs/benchmarks.md``, "In-pass capture on a GPU"):
``o`` and ``final_state`` bit-identical to vLLM's, every checkpoint state bit-identical to the
state split mode stores.

Wiring into vLLM's GPU engine (:func:`vllm_admission.plugin.boundary.hooks.install_inpass_runner`
on a CUDA platform) takes three wrappers, which talk through one :class:`GPUCapture`:

* ``GDNAttentionMetadataBuilder.build`` (once per step and KV cache group): the step's
  checkpoint list (:class:`~vllm_admission.plugin.runner.inpass_runner.StepCheckpoints`) is
  mapped to the prefill rows of the metadata (:func:`step_capture`, one device-to-host copy
  of the rows' state indices per build) and rides on the metadata
  (:func:`with_capture`);
* ``QwenGatedDeltaNetAttention._forward_core`` (each GDN layer): when its metadata carries
  a capture, the layer call is the current one while vLLM's own code runs;
* the two module-level names ``_forward_core`` calls its kernels by
  (``qwen_gdn_linear_attn.causal_conv1d_fn``, ``qwen_gdn_linear_attn.fla_chunk_gated_delta_rule``):
  during a current call the first keeps its input (the conv input, ``[dim, T]``), the second
  runs :func:`chunk_gated_delta_rule_with_states` and :func:`write_chunk_checkpoints` and
  returns what vLLM's function returns.

Outside a call with checkpoints every wrapper calls vLLM's function unchanged. vLLM is
imported on first use, not at module import.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, NamedTuple

import torch

from vllm_admission.plugin.state_copy import as_int_list, device_index, write_state_rows

__all__ = ["CHUNK_SIZE", "ChunkCapturePlan", "ChunkRuleResult", "GPUCapture", "StepCapture",
           "chunk_gated_delta_rule_with_states", "gpu_block_size_problem", "plan_chunk_captures",
           "step_capture", "with_capture", "write_chunk_checkpoints"]

#: The FLA chunk size (vLLM 0.32 ``third_party/flash_linear_attention/ops/utils.py``
#: ``FLA_CHUNK_SIZE``); ``tests/test_gdn_chunk_capture.py`` checks it against vLLM.
CHUNK_SIZE = 64


def gpu_block_size_problem(block_size: int, chunk_size: int = CHUNK_SIZE) -> str | None:
    """Why in-pass GDN checkpoints cannot be read from the chunk states with this block
    size (None: they can). Offsets are multiples of ``block_size`` tokens; they fall on
    ``chunk_size``-token chunk boundaries only when ``block_size`` is a multiple of it."""
    if block_size % chunk_size == 0:
        return None
    return (f"block size {block_size} is not a multiple of the GDN chunk size {chunk_size}, so "
            f"checkpoint states are not chunk states (start vLLM with --block-size "
            f"{chunk_size} or another multiple of {chunk_size})")


@dataclass(frozen=True)
class ChunkCapturePlan:
    """Where each checkpoint's state is and where it goes.

    ``h_index[j]`` indexes dim 1 of the chunk kernel's ``h``; ``token_end[j]`` is the
    checkpoint's position in the packed prefill tokens (its conv state is the
    ``width - 1`` tokens before it); ``rows[j]`` is the checkpoint's block row.
    """

    h_index: tuple[int, ...]
    token_end: tuple[int, ...]
    rows: tuple[int, ...]


def plan_chunk_captures(query_start_loc: Sequence[int] | torch.Tensor,
                        checkpoint_offsets: Sequence[Sequence[int]],
                        checkpoint_rows: Sequence[Sequence[int]], *,
                        chunk_size: int = CHUNK_SIZE, conv_width: int = 4) -> ChunkCapturePlan:
    """Map per-sequence checkpoint offsets to entries of ``h`` and conv-input tokens.

    Args:
        query_start_loc: ``N + 1`` non-decreasing offsets of the ``N`` prefill sequences
            in the packed tokens, exactly the ``cu_seqlens`` the chunk kernel gets
            (``GDNAttentionMetadata.prefill_query_start_loc``, a host copy).
        checkpoint_offsets: per sequence, strictly increasing offsets ``p`` (tokens of its
            chunk before the state to keep), ``0 < p < L_i``, multiples of ``chunk_size``.
        checkpoint_rows: per sequence, one destination block row per offset; all distinct.
        chunk_size: the kernel's chunk size (64).
        conv_width: the conv kernel width (4 in the Qwen models); ``p >= conv_width - 1``.

    Returns:
        The :class:`ChunkCapturePlan`, checkpoints in sequence order.

    Raises:
        ValueError: lengths that disagree, a decreasing ``query_start_loc``, an offset
            outside ``(0, L_i)``, not increasing, not a multiple of ``chunk_size`` or
            shorter than the conv history, or a row named twice.
    """
    qsl = as_int_list("query_start_loc", query_start_loc)
    n = len(qsl) - 1
    if n < 0 or len(checkpoint_offsets) != n or len(checkpoint_rows) != n:
        raise ValueError(f"{max(n, 0)} sequences but {len(checkpoint_offsets)} offset lists "
                         f"and {len(checkpoint_rows)} row lists")
    h_index, token_end, rows = [], [], []
    chunks_before = 0
    for i in range(n):
        start, length = qsl[i], qsl[i + 1] - qsl[i]
        if length < 0:
            raise ValueError(f"query_start_loc decreases at sequence {i}")
        offs = as_int_list(f"checkpoint_offsets[{i}]", checkpoint_offsets[i])
        dst = as_int_list(f"checkpoint_rows[{i}]", checkpoint_rows[i])
        if len(dst) != len(offs):
            raise ValueError(f"sequence {i}: {len(offs)} checkpoint offsets but {len(dst)} rows")
        if any(b <= a for a, b in pairwise(offs)):
            raise ValueError(f"sequence {i}: checkpoint offsets {offs} are not strictly increasing")
        for p, row in zip(offs, dst, strict=True):
            if not 0 < p < length:
                raise ValueError(f"sequence {i}: checkpoint offset {p} is not inside its chunk "
                                 f"(need 0 < offset < {length})")
            if p % chunk_size:
                raise ValueError(f"sequence {i}: checkpoint offset {p} is not a multiple of the "
                                 f"GDN chunk size {chunk_size}")
            if p < conv_width - 1:
                raise ValueError(f"sequence {i}: checkpoint offset {p} is shorter than the conv "
                                 f"history ({conv_width - 1} tokens)")
            h_index.append(chunks_before + p // chunk_size)
            token_end.append(start + p)
            rows.append(row)
        chunks_before += -(-length // chunk_size)
    if len(set(rows)) != len(rows):
        raise ValueError("a checkpoint row is named twice")
    return ChunkCapturePlan(tuple(h_index), tuple(token_end), tuple(rows))


def write_chunk_checkpoints(plan: ChunkCapturePlan, h: torch.Tensor, conv_input: torch.Tensor, *,
                            ssm_state: torch.Tensor, conv_state: torch.Tensor,
                            conv_state_dim_first: bool) -> None:
    """Write each planned checkpoint's SSM and conv state into its block row.

    Args:
        plan: from :func:`plan_chunk_captures` (same ``query_start_loc`` as the kernel run
            that produced ``h``).
        h: the chunk kernel's per-chunk states ``[1, NT, H, V, K]``
            (:func:`chunk_gated_delta_rule_with_states`).
        conv_input: ``[T, conv_dim]``, the layer's prefill ``mixed_qkv`` before the conv,
            packed as ``query_start_loc`` says (vLLM's ``mixed_qkv_non_spec`` without its
            decode tokens; the conv's output replaces that name in vLLM's code, so a caller
            keeps the input).
        ssm_state: the layer's SSM cache ``[blocks, H, V, K]`` (any float dtype; values are
            cast, as vLLM casts its final state).
        conv_state: the layer's conv cache as stored: ``[blocks, width - 1, conv_dim]``
            (vLLM's default "SD" layout) or ``[blocks, conv_dim, width - 1]`` with
            ``conv_state_dim_first``.
        conv_state_dim_first: the conv cache layout (vLLM's ``is_conv_state_dim_first()``).

    Costs one host-to-device copy of the indices (pinned, not waited for), one gather per
    tensor and :func:`write_state_rows` (one ``index_copy_`` per tensor on a GPU); no pass
    over the tokens and no host-device sync.

    Raises:
        ValueError: shapes that do not fit together, or the errors of
            :func:`~vllm_admission.plugin.state_copy.write_state_rows`.
    """
    if not plan.rows:
        return
    if h.dim() != 5 or h.size(0) != 1 or tuple(h.shape[2:]) != tuple(ssm_state.shape[1:]):
        raise ValueError(f"h {tuple(h.shape)} does not fit the SSM cache {tuple(ssm_state.shape)} "
                         "(need [1, NT, H, V, K] against [blocks, H, V, K])")
    if max(plan.h_index) >= h.size(1):
        raise ValueError(f"h has {h.size(1)} chunk states, the plan reads entry {max(plan.h_index)}")
    history = conv_state.size(2) if conv_state_dim_first else conv_state.size(1)
    dim = conv_state.size(1) if conv_state_dim_first else conv_state.size(2)
    if conv_input.dim() != 2 or conv_input.size(1) != dim:
        raise ValueError(f"conv_input must be [T, {dim}], got {tuple(conv_input.shape)}")
    # Bounds from the plan's host copy: no device value is read, so no sync.
    if min(plan.token_end) - history < 0 or max(plan.token_end) > conv_input.size(0):
        raise ValueError("a checkpoint's conv history lies outside conv_input")
    device = h.device
    tokens = [e - history + j for e in plan.token_end for j in range(history)]   # [n * (width - 1)]
    index = device_index([*plan.h_index, *tokens], device)                       # one host->device copy
    ssm_values = h[0].index_select(0, index[:len(plan.h_index)])
    conv_values = conv_input.index_select(0, index[len(plan.h_index):]).view(len(plan.rows), history, dim)
    if conv_state_dim_first:
        conv_values = conv_values.transpose(1, 2)
    write_state_rows([ssm_state, conv_state], plan.rows, [ssm_values, conv_values])


# -- the chunked delta rule with its per-chunk states ------------------------------
class ChunkRuleResult(NamedTuple):
    """``o`` ``[1, T, H, V]`` in q's dtype; ``final_state`` ``[N, H, V, K]`` float32 (None
    without ``output_final_state``); ``h`` ``[1, NT, H, V, K]`` in k's dtype."""

    o: torch.Tensor
    final_state: torch.Tensor | None
    h: torch.Tensor


def chunk_gated_delta_rule_with_states(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
    initial_state: torch.Tensor, cu_seqlens: torch.Tensor, output_final_state: bool = True,
    scale: float | None = None, chunk_indices: torch.Tensor | None = None,
    chunk_offsets: torch.Tensor | None = None, use_qk_l2norm_in_kernel: bool = False,
    core_attn_out: torch.Tensor | None = None,
) -> ChunkRuleResult:
    """vLLM's ``chunk_gated_delta_rule`` (Triton/FLA, varlen), also returning ``h``.

    Calls vLLM's stage functions in the order ``chunk.py`` ``chunk_gated_delta_rule_fwd``
    calls them (local cumsum of ``g``, ``A = beta k k^T`` per chunk, ``solve_tril``, the WY
    ``w, u``, the state pass ``chunk_gated_delta_rule_fwd_h``, the output ``chunk_fwd_o``),
    keeping ``h``, which vLLM's wrapper drops unless ``GDN_RECOMPUTE_SUPPRESS_LEVEL >= 3``.
    Same kernels, same launches: ``o`` and ``final_state`` equal vLLM's
    (``tests/test_gdn_chunk_capture.py`` checks bit-identity under Triton's interpreter).

    Args:
        q, k: ``[1, T, Hg, K]``; v: ``[1, T, H, V]`` (bf16/fp16; vLLM refuses float32).
        g: ``[1, T, H]`` log-space gate; beta: ``[1, T, H]``.
        initial_state: ``[N, H, V, K]`` (zeros for a sequence without one, as vLLM sets).
        cu_seqlens: ``[N + 1]`` int32 on q's device.
        Other arguments as vLLM's ``chunk_gated_delta_rule``.

    Raises:
        ValueError: batch dim other than 1, or ``initial_state`` not one per sequence.
        ImportError: vLLM's FLA ops cannot be imported (no usable Triton).
    """
    from vllm.third_party.flash_linear_attention.ops import chunk as fla_chunk
    from vllm.third_party.flash_linear_attention.ops.chunk import (
        chunk_fwd_o,
        chunk_gated_delta_rule_fwd_h,
        chunk_local_cumsum,
        chunk_scaled_dot_kkt_fwd,
        recompute_w_u_fwd,
        solve_tril,
    )
    from vllm.third_party.flash_linear_attention.ops.l2norm import l2norm_fwd

    if q.size(0) != 1:
        raise ValueError(f"varlen input needs batch dim 1, got {q.size(0)}")
    if initial_state.size(0) != cu_seqlens.numel() - 1:
        raise ValueError(f"{initial_state.size(0)} initial states for {cu_seqlens.numel() - 1} sequences")
    chunk = fla_chunk.FLA_CHUNK_SIZE
    if scale is None:
        scale = k.shape[-1] ** -0.5
    if use_qk_l2norm_in_kernel:
        q, k = l2norm_fwd(q), l2norm_fwd(k)
    q, k, v, g, beta = (t.contiguous() for t in (q, k, v, g, beta))
    g = chunk_local_cumsum(g, chunk_size=chunk, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices)
    a = chunk_scaled_dot_kkt_fwd(k=k, beta=beta, g=g, cu_seqlens=cu_seqlens,
                                 chunk_indices=chunk_indices, output_dtype=torch.float32)
    a = solve_tril(A=a, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, output_dtype=k.dtype)
    w, u = recompute_w_u_fwd(k=k, v=v, beta=beta, A=a, g_cumsum=g, cu_seqlens=cu_seqlens,
                             chunk_indices=chunk_indices)
    h, v_new, final_state = chunk_gated_delta_rule_fwd_h(
        k=k, w=w, u=u, g=g, initial_state=initial_state.contiguous(),
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
        chunk_indices=chunk_indices, chunk_offsets=chunk_offsets)
    o = chunk_fwd_o(q=q, k=k, v=v_new, h=h, g=g, scale=scale, cu_seqlens=cu_seqlens,
                    chunk_indices=chunk_indices, core_attn_out=core_attn_out)
    return ChunkRuleResult(o.to(q.dtype), final_state, h)


# -- wiring into vLLM's GPU GDN layer -----------------------------------------------
@dataclass(frozen=True)
class StepCapture:
    """One step's GDN checkpoints for one KV cache group's metadata.

    ``plan`` indexes the prefill tokens as the chunk kernel sees them
    (``prefill_query_start_loc``); the conv kernel sees the non-speculative tokens with the
    decodes first, so the prefill tokens are ``[decode_tokens, decode_tokens +
    prefill_tokens)`` of its input.
    """

    plan: ChunkCapturePlan
    decode_tokens: int
    prefill_tokens: int


def step_capture(checkpoints: Mapping[int, Sequence[tuple[int, int]]],
                 state_indices: Sequence[int] | torch.Tensor,
                 query_start_loc: Sequence[int] | torch.Tensor, *, decode_tokens: int,
                 conv_width: int, chunk_size: int = CHUNK_SIZE) -> StepCapture | None:
    """The checkpoints of a step's prefill rows, or ``None`` when no row has one.

    Args:
        checkpoints: the step's list, ``{running state block: ((offset in chunk,
            checkpoint block), ...)}``.
        state_indices: per prefill row, its running state block
            (``GDNAttentionMetadata.prefill_state_indices``).
        query_start_loc: ``N + 1`` offsets of the prefill rows in the prefill tokens
            (``GDNAttentionMetadata.prefill_query_start_loc``).
        decode_tokens: non-speculative decode tokens before the prefills.
        conv_width: the conv kernel width.

    Raises:
        ValueError: as :func:`plan_chunk_captures` (an offset that is not a multiple of
            ``chunk_size`` means a block size :func:`gpu_block_size_problem` refuses).
    """
    from vllm_admission.plugin.runner.inpass_runner import row_checkpoints

    qsl = as_int_list("query_start_loc", query_start_loc)
    rows = as_int_list("state_indices", state_indices)
    offsets, blocks = row_checkpoints(checkpoints, rows, [b - a for a, b in pairwise(qsl)])
    if not any(offsets):
        return None
    plan = plan_chunk_captures(qsl, offsets, blocks, chunk_size=chunk_size, conv_width=conv_width)
    return StepCapture(plan, int(decode_tokens), qsl[-1] - qsl[0])


_CAPTURE_TYPES: dict[type, type] = {}


def with_capture(metadata: Any, capture: StepCapture) -> Any:
    """A copy of ``metadata`` (vLLM's ``GDNAttentionMetadata``) that carries ``capture`` as
    ``inpass_capture``: an instance of a dataclass subclass made once per metadata class,
    so vLLM's ``isinstance`` checks hold and nothing is set on vLLM's object."""
    cls = type(metadata)
    sub = _CAPTURE_TYPES.get(cls)
    if sub is None:
        sub = dataclasses.make_dataclass(f"{cls.__name__}WithCapture",
                                         [("inpass_capture", Any, None)], bases=(cls,))
        _CAPTURE_TYPES[cls] = sub
    values = {f.name: getattr(metadata, f.name) for f in dataclasses.fields(metadata)}
    return sub(**values, inpass_capture=capture)


class _LayerCall:
    """One GDN layer call with checkpoints: its capture, its layer, the conv input once seen."""

    __slots__ = ("capture", "conv_input", "layer")

    def __init__(self, capture: StepCapture, layer: Any) -> None:
        self.capture, self.layer = capture, layer
        self.conv_input: torch.Tensor | None = None

    def keep_conv_input(self, x: torch.Tensor | None) -> None:
        """Keep ``x`` (the first conv input of the call); ``None`` forgets it."""
        self.conv_input = x


class _Current(threading.local):
    """The current layer call, per thread."""

    call: _LayerCall | None = None

    def set(self, call: _LayerCall | None) -> None:
        self.call = call


class GPUCapture:
    """The wrappers of vLLM's GPU GDN path (module docstring), sharing the current call.

    Each wrapper factory takes vLLM's function and returns the replacement (the
    installer, :mod:`vllm_admission.plugin.boundary.hooks`, puts it in place); the
    current call is per thread.
    """

    def __init__(self) -> None:
        self._current = _Current()

    def _call(self) -> _LayerCall | None:
        return self._current.call

    def forward_core(self, original: Callable[..., Any],
                     metadata_of: Callable[[Any], Any]) -> Callable[..., Any]:
        """``_forward_core(self, mixed_qkv, b, a, core_attn_out)``; ``metadata_of(layer)``
        gives the layer's metadata of the current forward pass (or ``None``)."""

        def forward_core(layer: Any, *args: Any, **kwargs: Any) -> Any:
            capture = getattr(metadata_of(layer), "inpass_capture", None)
            if capture is None:
                return original(layer, *args, **kwargs)
            self._current.set(_LayerCall(capture, layer))
            try:
                return original(layer, *args, **kwargs)
            finally:
                self._current.set(None)

        return forward_core

    def conv_fn(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``causal_conv1d_fn(x, ...)``: keeps ``x`` (``[dim, T]``) of a current call."""

        def causal_conv1d_fn(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            call = self._call()
            if call is not None and call.conv_input is None:
                call.keep_conv_input(x)
            return original(x, *args, **kwargs)

        return causal_conv1d_fn

    def chunk_rule(self, original: Callable[..., Any], *,
                   conv_state_dim_first: Callable[[], bool]) -> Callable[..., Any]:
        """``fla_chunk_gated_delta_rule(q=..., ...)`` (keywords, as ``forward_native``
        calls it): during a current call, the same outputs from
        :func:`chunk_gated_delta_rule_with_states`, and the checkpoints written into the
        layer's cache (``layer.kv_cache``: conv, SSM)."""

        def chunk_gated_delta_rule(**kwargs: Any) -> Any:
            call = self._call()
            if call is None:
                return original(**kwargs)
            if call.conv_input is None:
                raise RuntimeError("inpass: the GDN chunk rule ran before the conv of its layer")
            result = chunk_gated_delta_rule_with_states(
                kwargs.pop("q"), kwargs.pop("k"), kwargs.pop("v"), kwargs.pop("g"),
                kwargs.pop("beta"), **kwargs)
            cap = call.capture
            conv_input = call.conv_input.transpose(0, 1)[
                cap.decode_tokens:cap.decode_tokens + cap.prefill_tokens]
            conv_state, ssm_state = call.layer.kv_cache[0], call.layer.kv_cache[1]
            write_chunk_checkpoints(cap.plan, result.h, conv_input, ssm_state=ssm_state,
                                    conv_state=conv_state,
                                    conv_state_dim_first=conv_state_dim_first())
            call.keep_conv_input(None)
            return result.o, result.final_state

        return chunk_gated_delta_rule
