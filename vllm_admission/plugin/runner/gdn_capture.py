"""Gated DeltaNet prefill in segments, keeping the state at inner checkpoint offsets.

vLLM 0.32's CPU GDN prefill (``model_executor/layers/mamba/ops/cpu/gdn_attention.py``,
``_cpu_gdn_attention_nonspec``) runs three kernels over a varlen batch: the causal
conv1d (state in ``conv_states`` rows, ``cache_indices``, ``has_initial_state``), the
gating ``fused_gdn_gating_cpu``, and ``chunk_gated_delta_rule_cpu``, which reads and
rewrites the SSM state rows in place. Both state-carrying kernels leave only the state
at the *end* of each sequence. To also keep the state at an offset ``p`` inside a
sequence's chunk, :func:`gdn_prefill_with_capture` cuts every sequence at its offsets
and runs the kernels once per *round*: round ``k`` is the ``k``-th segment of every
sequence that has one, batched as varlen. After a round, the working row of every
sequence whose segment ended at a checkpoint is copied (conv and SSM state) into that
checkpoint's block with one :meth:`StateRowCopier.copy` call; the next round starts
from the working row, so later segments run with an initial state. The gating is
per token, so it runs once over all tokens.

The tokens, the outputs and the end state are those of one un-segmented call (to the
kernels' bf16 rounding: the chunked kernel's blocks fall elsewhere when a segment does
not start on a multiple of its chunk size); the extra cost is the extra kernel calls
and the gathers, not arithmetic.

Only the prefill part is covered (no decode tokens, no speculative decoding, no
``PAD_SLOT_ID`` rows). vLLM is imported on first use, not at module import.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise
from types import SimpleNamespace
from typing import Any

import torch

from vllm_admission.plugin.state_copy import StateRowCopier, as_int_list

__all__ = ["GDNCoreParams", "SegmentRound", "gdn_ops_available", "gdn_prefill_with_capture", "plan_rounds"]


# -- planning (no vLLM) ------------------------------------------------------------
@dataclass(frozen=True)
class SegmentRound:
    """One kernel round: the ``index``-th segment of every sequence that has one.

    ``seq_ids[j]`` (a batch position) runs tokens ``starts[j]:ends[j]`` of the packed
    prefill tokens. After the round, row ``capture_src[j]`` of the state tensors is
    copied to row ``capture_dst[j]``. In round 0 each sequence's own
    ``has_initial_state`` applies; in later rounds every sequence has one.
    """

    index: int
    seq_ids: tuple[int, ...]
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    capture_src: tuple[int, ...]
    capture_dst: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return sum(e - s for s, e in zip(self.starts, self.ends, strict=True))


def plan_rounds(query_start_loc: Sequence[int] | torch.Tensor, state_indices: Sequence[int] | torch.Tensor,
                checkpoint_offsets: Sequence[Sequence[int]],
                checkpoint_rows: Sequence[Sequence[int]]) -> list[SegmentRound]:
    """Cut each sequence at its checkpoint offsets and group the segments into rounds.

    Args:
        query_start_loc: ``N + 1`` non-decreasing token offsets of the ``N`` prefill
            sequences in the packed tokens (sequence ``i`` is
            ``query_start_loc[i]:query_start_loc[i + 1]``, its chunk of ``L_i`` tokens).
        state_indices: ``N`` distinct working rows of the state tensors.
        checkpoint_offsets: per sequence, strictly increasing offsets ``p`` with
            ``0 < p < L_i``, counted from the start of the sequence's chunk (tokens of
            the chunk processed before the state to keep). The caller chooses them
            block-aligned; this function does not know the block size.
        checkpoint_rows: per sequence, one destination row per offset; distinct, and
            none of them a working row.

    Returns:
        ``max_i len(offsets_i) + 1`` rounds (empty segments, i.e. sequences with
        ``L_i = 0``, take part in none).

    Raises:
        ValueError: lengths that disagree, a decreasing ``query_start_loc``, an offset
            outside ``(0, L_i)`` (an offset of ``L_i`` is the end of the chunk, whose
            state the pass writes anyway), offsets not strictly increasing, a repeated
            working or destination row, or a destination that is a working row.
    """
    qsl = as_int_list("query_start_loc", query_start_loc)
    rows = as_int_list("state_indices", state_indices)
    n = len(qsl) - 1
    if n < 0:
        raise ValueError("query_start_loc needs at least one entry")
    if len(rows) != n:
        raise ValueError(f"{len(rows)} state indices for {n} sequences")
    if len(checkpoint_offsets) != n or len(checkpoint_rows) != n:
        raise ValueError(f"checkpoint_offsets ({len(checkpoint_offsets)}) and checkpoint_rows "
                         f"({len(checkpoint_rows)}) need one entry per sequence ({n})")
    if len(set(rows)) != n:
        raise ValueError("two sequences share a working state row")
    bounds: list[list[int]] = []
    dsts: list[list[int]] = []
    for i in range(n):
        start, end = qsl[i], qsl[i + 1]
        if end < start:
            raise ValueError(f"query_start_loc decreases at sequence {i} ({start} -> {end})")
        length = end - start
        offs = as_int_list(f"checkpoint_offsets[{i}]", checkpoint_offsets[i])
        dst = as_int_list(f"checkpoint_rows[{i}]", checkpoint_rows[i])
        if len(dst) != len(offs):
            raise ValueError(f"sequence {i}: {len(offs)} checkpoint offsets but {len(dst)} rows")
        for p in offs:
            if not 0 < p < length:
                raise ValueError(f"sequence {i}: checkpoint offset {p} is not inside its chunk "
                                 f"(need 0 < offset < {length})")
        if any(b <= a for a, b in pairwise(offs)):
            raise ValueError(f"sequence {i}: checkpoint offsets {offs} are not strictly increasing")
        bounds.append([start, *(start + p for p in offs), end])
        dsts.append(dst)
    all_dst = [d for dst in dsts for d in dst]
    if len(set(all_dst)) != len(all_dst):
        raise ValueError("a checkpoint row is named twice")
    clash = set(all_dst) & set(rows)
    if clash:
        raise ValueError(f"checkpoint rows {sorted(clash)[:4]} are working state rows")

    num_rounds = max((len(d) for d in dsts), default=0) + 1
    rounds = []
    for k in range(num_rounds):
        ids, starts, ends, src, dst = [], [], [], [], []
        for i in range(n):
            b = bounds[i]
            if k + 1 < len(b) and b[k + 1] > b[k]:
                ids.append(i)
                starts.append(b[k])
                ends.append(b[k + 1])
                if k < len(dsts[i]):
                    src.append(rows[i])
                    dst.append(dsts[i][k])
        rounds.append(SegmentRound(k, tuple(ids), tuple(starts), tuple(ends), tuple(src), tuple(dst)))
    return rounds


# -- vLLM's kernels ----------------------------------------------------------------
@lru_cache(maxsize=1)
def _vllm_ops() -> SimpleNamespace:
    import vllm._custom_ops as custom_ops
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention
    from vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d import causal_conv1d_fn_cpu

    for name in ("chunk_gated_delta_rule_cpu", "fused_gdn_gating_cpu"):
        if not hasattr(torch.ops._C, name):
            raise ImportError(f"vLLM's CPU op {name} is not built into this install")
    use_cpp_conv = bool(torch.cpu._is_avx512_bf16_supported() or gdn_attention.is_arm_bf16())
    return SimpleNamespace(ops=custom_ops, conv_torch=causal_conv1d_fn_cpu,
                           conv_cpp=gdn_attention._causal_conv1d_fwd_cpu,
                           dim_first=is_conv_state_dim_first, use_cpp_conv=use_cpp_conv)


def gdn_ops_available() -> bool:
    """Whether vLLM's CPU GDN kernels can be imported and called here."""
    try:
        _vllm_ops()
    except Exception:  # noqa: BLE001 - any import failure means "not here"
        return False
    return True


@dataclass(frozen=True)
class GDNCoreParams:
    """A GDN layer's parameters for its recurrent core (one TP shard).

    Attributes:
        A_log: ``[num_v_heads]`` float32.
        dt_bias: ``[num_v_heads]``.
        conv_weight: ``[conv_dim, width]`` or the layer's ``[conv_dim, 1, width]``
            (``conv_dim = 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim``), or
            the C++ conv's packed weight when ``conv_weight_packed``.
        conv_bias: ``[conv_dim]`` or None.
        activation: ``"silu"``, ``"swish"`` or None.
        conv_weight_packed: the weight is packed for vLLM's C++ conv (vLLM packs it at
            load time on CPUs with AVX-512 BF16 or Arm BF16).
    """

    A_log: torch.Tensor
    dt_bias: torch.Tensor
    conv_weight: torch.Tensor
    conv_bias: torch.Tensor | None
    activation: str | None
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_weight_packed: bool = False

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def for_vllm_conv(self) -> GDNCoreParams:
        """These parameters with the conv weight in the form vLLM's CPU path calls the
        conv with: packed (``causal_conv1d_weight_pack`` on the ``[conv_dim, width]``
        weight, as ``model_executor/layers/utils.py`` does at load time) where vLLM uses
        its C++ conv, ``[conv_dim, width]`` otherwise.

        Raises:
            ValueError: a packed weight where vLLM does not use the C++ conv, or a
                weight the C++ conv cannot pack (it takes bf16 weights of width 4 only).
            ImportError: vLLM's CPU GDN kernels are not available.
        """
        v = _vllm_ops()
        w = self.conv_weight
        if self.conv_weight_packed:
            if not v.use_cpp_conv:
                raise ValueError("a packed conv weight needs vLLM's C++ conv, which this CPU does not use")
            return self
        flat = w.view(w.size(0), w.size(-1)) if w.dim() == 3 else w
        if not v.use_cpp_conv:
            return dataclasses.replace(self, conv_weight=flat)
        if flat.size(1) != 4 or flat.dtype != torch.bfloat16:
            raise ValueError(f"vLLM's C++ conv takes bf16 conv weights of width 4, got width "
                             f"{flat.size(1)} in {flat.dtype}")
        packed = v.ops.causal_conv1d_weight_pack(flat.contiguous().clone())
        return dataclasses.replace(self, conv_weight=packed, conv_weight_packed=True)

    @classmethod
    def from_layer(cls, layer: Any) -> GDNCoreParams:
        """Read the parameters of a loaded ``QwenGatedDeltaNetAttention`` (its TP shard).

        The conv weight counts as packed where vLLM's CPU path uses its C++ conv."""
        tp = getattr(layer, "tp_size", 1)
        return cls(A_log=layer.A_log, dt_bias=layer.dt_bias, conv_weight=layer.conv1d.weight,
                   conv_bias=layer.conv1d.bias, activation=layer.activation,
                   num_k_heads=layer.num_k_heads // tp, num_v_heads=layer.num_v_heads // tp,
                   head_k_dim=layer.head_k_dim, head_v_dim=layer.head_v_dim,
                   conv_weight_packed=_vllm_ops().use_cpp_conv)


# -- the segmented run -------------------------------------------------------------
def gdn_prefill_with_capture(
    params: GDNCoreParams,
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    conv_state: torch.Tensor,
    ssm_state: torch.Tensor,
    query_start_loc: torch.Tensor | Sequence[int],
    state_indices: torch.Tensor | Sequence[int],
    has_initial_state: torch.Tensor | Sequence[bool],
    checkpoint_offsets: Sequence[Sequence[int]],
    checkpoint_rows: Sequence[Sequence[int]],
    copier: StateRowCopier | None = None,
    conv_state_dim_first: bool | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run the GDN recurrent core over prefill tokens, keeping states at checkpoints.

    Equivalent to the prefill branch of vLLM's ``_cpu_gdn_attention_nonspec`` (conv,
    gating, chunked delta rule, state rows updated in place), run in the rounds of
    :func:`plan_rounds`; after each round that reaches checkpoints, one
    ``copier.copy(src, dst)`` copies those sequences' working rows (conv and SSM
    state) to their checkpoint rows.

    Args:
        params: the layer's parameters (:meth:`GDNCoreParams.from_layer`).
        mixed_qkv: ``[T, conv_dim]`` bfloat16, the projected q, k, v before the conv.
        a, b: ``[T, num_v_heads]`` bfloat16, the gate inputs.
        conv_state: vLLM's conv-state cache as stored, bfloat16, ``[blocks, width - 1,
            conv_dim]`` (vLLM's default "SD" layout, possibly a transposed view) or
            ``[blocks, conv_dim, width - 1]`` with ``conv_state_dim_first``.
        ssm_state: vLLM's SSM cache ``[blocks, num_v_heads, head_v_dim, head_k_dim]``
            (bfloat16 or float32), read as vLLM's CPU path reads it.
        query_start_loc, state_indices, checkpoint_offsets, checkpoint_rows: as in
            :func:`plan_rounds` (``query_start_loc`` runs from 0 to ``T``).
        has_initial_state: ``[N]`` bool: the working row holds the state before the
            chunk (else conv and SSM start from zeros, and the SSM row is zeroed first,
            as vLLM does).
        copier: a :class:`StateRowCopier` bound to (at least) ``conv_state`` and
            ``ssm_state``; built here when None (a runner should bind one once).
        conv_state_dim_first: the conv cache layout; None asks vLLM
            (``is_conv_state_dim_first``).
        out: ``[T, num_v_heads, head_v_dim]`` bfloat16 to write into; allocated if None.

    Returns:
        ``out``: the core attention output of every token, ``[T, num_v_heads,
        head_v_dim]`` bfloat16. The working rows end with each sequence's state at the
        end of its chunk; checkpoint rows hold the states at their offsets.

    Raises:
        ValueError: the errors of :func:`plan_rounds`, shapes or dtypes that do not
            match ``params``, the errors of :meth:`GDNCoreParams.for_vllm_conv` (an
            unpacked weight is packed here, once per call, where vLLM uses its C++
            conv), or a layout that differs from vLLM's where the C++ conv is used.
        ImportError: vLLM's CPU GDN kernels are not available.
    """
    rounds = plan_rounds(query_start_loc, state_indices, checkpoint_offsets, checkpoint_rows)
    v = _vllm_ops()
    num_tokens = mixed_qkv.size(0)
    qsl = as_int_list("query_start_loc", query_start_loc)
    rows = as_int_list("state_indices", state_indices)
    _check_inputs(params, mixed_qkv, a, b, qsl)
    initial = [bool(x) for x in (has_initial_state.tolist() if isinstance(has_initial_state, torch.Tensor)
                                 else has_initial_state)]
    if len(initial) != len(rows):
        raise ValueError(f"has_initial_state has {len(initial)} entries for {len(rows)} sequences")

    dim_first = v.dim_first() if conv_state_dim_first is None else conv_state_dim_first
    use_cpp = v.use_cpp_conv
    if use_cpp and dim_first != v.dim_first():
        raise ValueError("the C++ conv path follows vLLM's conv-state layout; "
                         "conv_state_dim_first must match it")
    params = params.for_vllm_conv()
    # Both conv paths take the cache as [blocks, dim, width - 1] (a view for "SD").
    conv_view = conv_state if dim_first else conv_state.transpose(1, 2)
    weight = params.conv_weight
    blocks, heads, head_v, head_k = ssm_state.shape
    ssm_view = ssm_state.view(blocks, heads, head_k, head_v)     # what vLLM's CPU path hands the kernel
    if copier is None:
        copier = StateRowCopier([conv_state, ssm_state])
    if out is None:
        out = torch.empty(num_tokens, params.num_v_heads, params.head_v_dim, dtype=mixed_qkv.dtype)

    mixed_qkv = mixed_qkv.contiguous()
    g, beta = v.ops.fused_gdn_gating_cpu(A_log=params.A_log, a=a.contiguous(), b=b.contiguous(),
                                         dt_bias=params.dt_bias)     # [1, T, H] each, per token
    fresh = [rows[i] for i in range(len(rows)) if not initial[i]]
    if fresh:
        ssm_view[torch.tensor(fresh, dtype=torch.long)] = 0

    for rnd in rounds:
        if rnd.seq_ids:
            _run_round(v, params, rnd, rows, initial, mixed_qkv, g, beta, conv_view, weight,
                       ssm_view, out, use_cpp, num_tokens)
        if rnd.capture_src:
            copier.copy(rnd.capture_src, rnd.capture_dst)
    return out


def _check_inputs(params: GDNCoreParams, mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                  qsl: list[int]) -> None:
    if mixed_qkv.dtype != torch.bfloat16:
        raise ValueError(f"vLLM's CPU GDN kernels need bfloat16 mixed_qkv, got {mixed_qkv.dtype}")
    if mixed_qkv.dim() != 2 or mixed_qkv.size(1) != params.conv_dim:
        raise ValueError(f"mixed_qkv must be [T, {params.conv_dim}], got {tuple(mixed_qkv.shape)}")
    num_tokens = mixed_qkv.size(0)
    for name, t in (("a", a), ("b", b)):
        if tuple(t.shape) != (num_tokens, params.num_v_heads):
            raise ValueError(f"{name} must be [{num_tokens}, {params.num_v_heads}], got {tuple(t.shape)}")
    if qsl and (qsl[0] != 0 or qsl[-1] != num_tokens):
        raise ValueError(f"query_start_loc must run from 0 to T = {num_tokens}, got {qsl[0]}..{qsl[-1]}")


def _run_round(v: SimpleNamespace, params: GDNCoreParams, rnd: SegmentRound, rows: list[int],
               initial: list[bool], mixed_qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               conv_view: torch.Tensor, weight: torch.Tensor, ssm_view: torch.Tensor, out: torch.Tensor,
               use_cpp: bool, num_tokens: int) -> None:
    whole = rnd.num_tokens == num_tokens            # every token in this round: no gather
    if whole:
        idx = None
        x, g_r, beta_r = mixed_qkv, g, beta
    else:
        idx = torch.cat([torch.arange(s, e) for s, e in zip(rnd.starts, rnd.ends, strict=True)])
        x = mixed_qkv.index_select(0, idx)
        g_r = g.index_select(1, idx)
        beta_r = beta.index_select(1, idx)
    lengths = torch.tensor([0, *(e - s for s, e in zip(rnd.starts, rnd.ends, strict=True))], dtype=torch.int32)
    cu = torch.cumsum(lengths, 0, dtype=torch.int32)
    slots = torch.tensor([rows[i] for i in rnd.seq_ids], dtype=torch.int32)
    has_init = torch.tensor([initial[i] if rnd.index == 0 else True for i in rnd.seq_ids], dtype=torch.bool)

    if use_cpp:
        conv_out = v.conv_cpp(x=x.transpose(0, 1), weight=weight, bias=params.conv_bias,
                              conv_states=conv_view, query_start_loc=cu, cache_indices=slots,
                              has_initial_state=has_init, silu_activation=params.activation == "silu",
                              is_weight_packed=params.conv_weight_packed)
    else:
        conv_out = v.conv_torch(x=x.transpose(0, 1), weight=weight, bias=params.conv_bias,
                                conv_states=conv_view, query_start_loc=cu, cache_indices=slots,
                                has_initial_state=has_init, activation=params.activation)
    conv_out = conv_out.transpose(0, 1)                 # [T_r, conv_dim]
    t_r = conv_out.size(0)
    kd, vd = params.key_dim, params.value_dim
    hk, dk, hv, dv = params.num_k_heads, params.head_k_dim, params.num_v_heads, params.head_v_dim
    query = conv_out[:, :kd].reshape(1, t_r, hk, dk).contiguous()
    key = conv_out[:, kd:2 * kd].reshape(1, t_r, hk, dk).contiguous()
    value = conv_out[:, 2 * kd:2 * kd + vd].reshape(1, t_r, hv, dv).contiguous()
    o, _ = v.ops.chunk_gated_delta_rule_cpu(
        query=query, key=key, value=value, g=g_r, beta=beta_r, initial_state=ssm_view,
        output_final_state=True, cu_seqlens=cu, head_first=False, use_qk_l2norm_in_kernel=True,
        initial_state_indices=slots)
    if idx is None:
        out.copy_(o.squeeze(0))
    else:
        out.index_copy_(0, idx, o.squeeze(0))
