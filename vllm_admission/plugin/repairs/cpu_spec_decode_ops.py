"""Torch versions of the three speculative-decoding state kernels vLLM 0.32's CPU build lacks.

With MTP/EAGLE drafts on a hybrid model in ``align`` mode, vLLM's V1 model runner moves
recurrent states between the blocks of a request with two fused Triton kernels
(``vllm/v1/worker/mamba_utils.py``, ``MambaSpecDecodeGPUContext``):

* :func:`precopy` for ``run_fused_precopy`` (``precopy_mamba_align_fused_kernel``):
  before the forward pass, each request's previous running block is copied into the
  block its state now runs in, shifted by the drafts accepted last step;
* :func:`postprocess` for ``run_fused_postprocess`` (``postprocess_mamba_fused_kernel``):
  after sampling, when the accepted tokens carried the sequence across a block
  boundary, the state at that boundary is saved into the boundary's block.

The CPU build has no Triton (``kernel[grid]`` raises "'function' object is not
subscriptable"; ``vllm/platforms/cpu.py`` overrides only a fixed list of kernels). A
third piece is wrong rather than missing: the CPU ``causal_conv1d_update``
(``model_executor/layers/mamba/ops/cpu/causal_conv1d.py``) takes no
``num_accepted_tokens``, so a Mamba2 layer's widened conv state (``width - 1 +
num_speculative_tokens`` rows) is read from the wrong offset under drafts;
:func:`conv_update_spec` is the Triton kernel's speculative path
(``ops/causal_conv1d.py``, ``IS_SPEC_DECODING``).

A state copy moves one block of one request, for every (layer, state) of the Mamba
groups: the conv state shifted by ``bias`` tokens (``[bias:]`` to ``[:width - bias]``
along the token axis), the temporal (SSM) state whole, from the block ``bias`` columns
further on (vLLM's ``_copy_mamba_state_block``). Facts and measurements:
docs/engine-facts.md, section 9. Installed by
:func:`vllm_admission.plugin.repairs.cpu_spec_decode.install` (CPU only).

Upstream: see :mod:`~vllm_admission.plugin.repairs.cpu_spec_decode` (no upstream issue found
as of 2026-11).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["StateRef", "conv_update_spec", "copy_block", "full_block_table", "postprocess",
           "precopy"]

#: One recurrent state tensor of one layer: ``(tensor [blocks, ...], is_conv, group)``,
#: ``group`` indexing the Mamba groups' block tables.
StateRef = tuple[torch.Tensor, bool, int]


def full_block_table(table: torch.Tensor) -> torch.Tensor:
    """Every row of the persistent block table behind ``table`` (vLLM hands the runner
    views of its first rows)."""
    rows = ((table.untyped_storage().nbytes() // table.element_size() - table.storage_offset())
            // table.stride(0))
    return torch.as_strided(table, (rows, table.size(1)), table.stride(), table.storage_offset())


def copy_block(states: Sequence[StateRef], tables: Sequence[torch.Tensor], row: int,
               src_col: int, dst_col: int, bias: int, *, conv_dim_first: bool) -> None:
    """Copy request ``row``'s state from block column ``src_col`` to ``dst_col``,
    advanced by ``bias`` accepted tokens (module docstring)."""
    for state, is_conv, group in states:
        table = tables[group]
        dst = int(table[row, dst_col])
        if is_conv:
            src = int(table[row, src_col])
            if conv_dim_first:   # [blocks, dim, width]
                width = state.size(2)
                state[dst, :, :width - bias] = state[src, :, bias:].clone()
            else:                # [blocks, width, dim]
                width = state.size(1)
                state[dst, :width - bias] = state[src, bias:].clone()
        else:
            src = int(table[row, src_col + bias])
            if src != dst:
                state[dst].copy_(state[src])


def precopy(states: Sequence[StateRef], tables: Sequence[torch.Tensor], num_reqs: int,
            dst_cols: torch.Tensor, src_cols: torch.Tensor, biases: torch.Tensor,
            idx_mapping: torch.Tensor | None, *, conv_dim_first: bool) -> None:
    """``run_fused_precopy``: per request row, copy the state from column ``src_cols[r]``
    (``-1``: a fresh request, nothing to copy) into ``dst_cols[r]``, advanced by
    ``biases[r]`` tokens. ``idx_mapping`` maps batch rows to request rows (``None``:
    the same)."""
    src, dst, bias = src_cols.tolist(), dst_cols.tolist(), biases.tolist()
    rows = idx_mapping[:num_reqs].tolist() if idx_mapping is not None else range(num_reqs)
    for r in rows:
        if r < 0 or src[r] < 0 or src[r] == dst[r]:
            continue
        copy_block(states, tables, r, src[r], dst[r], bias[r], conv_dim_first=conv_dim_first)


def postprocess(states: Sequence[StateRef], tables: Sequence[torch.Tensor], num_reqs: int,
                block_size: int, accepted: torch.Tensor, state_cols: torch.Tensor,
                scheduled: torch.Tensor, computed: torch.Tensor, drafts: torch.Tensor,
                accepted_out: torch.Tensor, *, conv_dim_first: bool) -> None:
    """``run_fused_postprocess``: where a request's accepted tokens reach a block
    boundary, save the state there into that boundary's block; ``accepted_out[r]``
    becomes 1 where the running block is that block (its state is then already the
    boundary's). Token counts are per request row, as vLLM passes them."""
    accepted_out[:num_reqs].copy_(accepted[:num_reqs])
    acc, col = accepted[:num_reqs].tolist(), state_cols[:num_reqs].tolist()
    sched, comp, draft = (t[:num_reqs].tolist() for t in (scheduled, computed, drafts))
    for r in range(num_reqs):
        running = comp[r] + sched[r] - draft[r]          # tokens the running state holds
        boundary = (running + acc[r] - 1) // block_size * block_size
        if boundary < running:
            continue
        bias, dest = boundary - running, boundary // block_size - 1
        if col[r] == dest:
            accepted_out[r] = 1
            if bias == 0:
                continue
        copy_block(states, tables, r, col[r], dest, bias, conv_dim_first=conv_dim_first)


def conv_update_spec(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor | None, activation: Any, *, state_indices: torch.Tensor,
                     num_accepted_tokens: torch.Tensor, query_start_loc: torch.Tensor,
                     null_block_id: int = 0) -> torch.Tensor:
    """A causal conv1d decode step over drafts (varlen), as vLLM's Triton kernel does it
    with ``num_accepted_tokens``: each sequence's window starts ``accepted - 1`` rows
    into its conv state, and the state keeps the last ``width - 2 + seqlen`` inputs.

    Shapes: ``x`` ``[tokens, dim]``; ``conv_state`` ``[blocks, dim, state_len]``;
    ``weight`` ``[dim, width]``. Returns ``[tokens, dim]``.
    """
    if isinstance(activation, bool):
        activation = "silu" if activation else None
    width = weight.shape[1]
    out = torch.empty_like(x)
    starts = query_start_loc.tolist()
    index = state_indices if state_indices.dim() == 1 else state_indices[:, 0]
    index, acc = index.tolist(), num_accepted_tokens.tolist()
    kernel = weight.unsqueeze(1)
    for s, block in enumerate(index):
        lo, hi = starts[s], starts[s + 1]
        if lo == hi or block == null_block_id:
            continue
        state = conv_state[block]                          # [dim, state_len]
        offset = acc[s] - 1
        xs = x[lo:hi].t().to(conv_state.dtype)             # [dim, seqlen]
        window = torch.cat([state[:, offset:offset + width - 1], xs], dim=-1)
        y = F.conv1d(window.to(weight.dtype).unsqueeze(0), kernel, bias,
                     groups=weight.shape[0])[0, :, -xs.shape[1]:]
        if activation in ("silu", "swish"):
            y = F.silu(y)
        out[lo:hi] = y.t().to(out.dtype)
        kept = torch.cat([state[:, offset + 1:offset + width - 1], xs], dim=-1).clone()
        state[:, :kept.shape[1]] = kept
    return out
