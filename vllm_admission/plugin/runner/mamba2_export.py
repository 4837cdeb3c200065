"""Mamba2 in-pass checkpoints through vLLM's own prefill-checkpoint export, several per prefill.

vLLM 0.32 already writes one Mamba2 state from inside a prefill pass
(``model_executor/layers/mamba/checkpoint.py``, ``mamba_mixer2.py``
``conv_ssm_forward``): the metadata builder (``v1/attention/backends/mamba2_attn.py``)
puts an SSD chunk end on the checkpoint offset (``mamba_attn.py``
``_compute_chunk_metadata``), the scan returns the state at every chunk end
(``return_intermediate_states``), and ``store_prefill_checkpoint``
(``ops/ssd_checkpoint.py``) copies that chunk's state, and the last ``width - 1``
pre-conv inputs before the offset, into the checkpoint's block. One checkpoint per
prefill row, at the prompt-end position only.

``inpass`` on Mamba2 uses the same contract with the admission's checkpoints, any number
per row. Three pieces, each the part of the contract vLLM lacks:

* :func:`checkpoint_chunk_layout`: vLLM's chunk rules with a chunk end at every
  checkpoint offset of a row (with one offset per row it is
  ``_compute_chunk_metadata``'s layout, which the tests check). Without a chunk size
  (vLLM's CPU scan takes none) each segment between checkpoints is one chunk.
* :func:`scan_with_chunk_states`: the CPU SSD scan
  (``ops/cpu/mamba_ssm.py`` ``_mamba_chunk_scan_combined_fwd_cpu``) ignores
  ``return_intermediate_states``; this runs it in rounds, the ``k``-th chunk of every
  row in round ``k``, carrying each row's state between rounds in float32 (the scan's
  own precision), and returns the state at every chunk end. The outputs are those of
  one call bit for bit; the states agree to float32 rounding (up to ~1e-6), because
  vLLM's CPU scan itself is not exactly invariant to where a row is cut nor to the
  other rows of a call (measured in ``tests/test_mamba2_export.py``; cuts at multiples
  of 16 tokens, which block-aligned checkpoints are, measured bit-identical). Split
  mode cuts the row at the same places, between passes. (vLLM PR #54505, open as of
  2026-11, would make the CPU scan return these states itself.)
* :func:`store_checkpoints`: ``store_prefill_checkpoint`` in torch (the vLLM one is a
  Triton kernel, and the CPU build has no Triton), taking several checkpoint entries
  per prefill row (:func:`~vllm_admission.plugin.runner.inpass_runner.mamba2_step_metadata`
  builds them as a ``MambaPrefillCheckpointMetadata`` with a ``prefill_rows`` field). On
  a GPU the same entries go to vLLM's own Triton kernel
  (:func:`store_checkpoints_triton`, row starts gathered per entry); that path is checked
  under Triton's interpreter on CPU and on an H200 (``benchmarks/gpu_inpass_bench.py``),
  not wired into a GPU engine.

:func:`vllm_admission.plugin.boundary.hooks.install_inpass_runner` wires them in: the
Mamba2 metadata builder gets the step's checkpoints (from the same
:class:`~vllm_admission.plugin.runner.inpass_runner.StepCheckpoints` as the GDN core),
and vLLM's ``conv_ssm_forward`` then runs unchanged. This module imports torch, never vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import torch

from vllm_admission.plugin.state_copy import as_int_list, device_index, write_state_rows

__all__ = ["ChunkLayout", "checkpoint_chunk_layout", "checkpoint_entries", "scan_with_chunk_states",
           "store_checkpoints", "store_checkpoints_triton"]


@dataclass(frozen=True)
class ChunkLayout:
    """SSD chunks of a prefill batch, in vLLM's ``Mamba2AttentionMetadata`` terms.

    Attributes:
        cu_chunk_seqlen: ``num_chunks + 1`` token offsets of the chunks in the packed
            prefill tokens.
        seq_idx: ``num_chunks`` prefill rows, the row of each chunk.
        last_chunk_indices: per row, its last chunk.
        checkpoint_chunks: per row, the chunk ending on each of its checkpoint offsets
            (in the offsets' order).
    """

    cu_chunk_seqlen: tuple[int, ...]
    seq_idx: tuple[int, ...]
    last_chunk_indices: tuple[int, ...]
    checkpoint_chunks: tuple[tuple[int, ...], ...]


def checkpoint_chunk_layout(chunk_size: int | None, computed: Sequence[int], lengths: Sequence[int],
                            offsets: Sequence[Sequence[int]]) -> ChunkLayout:
    """Chunk the prefill rows with a chunk end on every checkpoint offset.

    Each row is cut at its offsets into segments; a segment is chunked as
    ``_compute_chunk_metadata`` (``v1/attention/backends/mamba_attn.py``) chunks one:
    a first short chunk up to the next multiple of ``chunk_size`` in absolute
    position, then chunks of ``chunk_size``. ``chunk_size=None``: one chunk per segment.

    Args:
        chunk_size: the model's SSD chunk size in tokens, or None.
        computed: per row, the tokens already computed before this step's query.
        lengths: per row, the query length (tokens this step), ``> 0``.
        offsets: per row, strictly increasing checkpoint offsets ``0 < p < length``.

    Raises:
        ValueError: lists of different lengths, an empty row, an offset outside its
            row or offsets out of order, a chunk size below 1.
    """
    if not len(computed) == len(lengths) == len(offsets):
        raise ValueError(f"{len(computed)} computed counts, {len(lengths)} lengths and "
                         f"{len(offsets)} offset lists: one each per prefill row")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    cu = [0]
    seq_idx: list[int] = []
    last: list[int] = []
    ckpt: list[tuple[int, ...]] = []
    for row, (done, length, offs) in enumerate(zip(computed, lengths, offsets, strict=True)):
        offs = as_int_list(f"offsets[{row}]", offs)
        if length <= 0:
            raise ValueError(f"row {row} has no tokens")
        if any(not 0 < p < length for p in offs) or any(b <= a for a, b in pairwise(offs)):
            raise ValueError(f"row {row}: checkpoint offsets {offs} must increase strictly "
                             f"inside (0, {length})")
        ends = []
        for a, b in zip([0, *offs], [*offs, length], strict=True):
            pos = done + a
            while pos < done + b:
                step = done + b - pos
                if chunk_size is not None:
                    step = min(step, chunk_size - pos % chunk_size)
                pos += step
                cu.append(cu[-1] + step)
                seq_idx.append(row)
            ends.append(len(seq_idx) - 1)
        ckpt.append(tuple(ends[:-1]))
        last.append(ends[-1])
    return ChunkLayout(tuple(cu), tuple(seq_idx), tuple(last), tuple(ckpt))


def checkpoint_entries(layout: ChunkLayout, offsets: Sequence[Sequence[int]],
                       blocks: Sequence[Sequence[int]]) -> tuple[list[int], list[int], list[int], list[int]]:
    """Flatten per-row checkpoints into store entries ``(prefill row, offset, block, chunk)``.

    Returns four equal-length lists: the prefill row, the offset in its query, the
    destination block id and the chunk ending on it, row by row in offset order.
    """
    rows, offs, dst, chunks = [], [], [], []
    for row, (o, b, c) in enumerate(zip(offsets, blocks, layout.checkpoint_chunks, strict=True)):
        if not len(o) == len(b) == len(c):
            raise ValueError(f"row {row}: {len(o)} offsets, {len(b)} blocks, {len(c)} chunks")
        rows += [row] * len(o)
        offs += list(o)
        dst += list(b)
        chunks += list(c)
    return rows, offs, dst, chunks


def scan_with_chunk_states(scan: Callable[..., torch.Tensor], x: torch.Tensor, dt: torch.Tensor,
                           A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk_size: int,
                           out: torch.Tensor, *, cu_seqlens: torch.Tensor, cu_chunk_seqlens: torch.Tensor,
                           seq_idx: torch.Tensor, initial_states: torch.Tensor | None = None,
                           return_intermediate_states: bool = False, state_dtype: torch.dtype | None = None,
                           z: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
    """vLLM's CPU SSD scan, returning the state at every chunk end when asked.

    Without ``return_intermediate_states`` this is ``scan(...)`` itself.

    Args:
        scan: ``_mamba_chunk_scan_combined_fwd_cpu`` (its signature: ``x [T, H, P]``,
            ``dt [T, H]``, ``A [H]``, ``B``/``C [T, G, N]``, ``out [T, H, P]`` contiguous,
            ``cu_seqlens [R + 1]``, ``initial_states [R, H, P, N]``; returns ``[R, H, P, N]``).
        cu_chunk_seqlens, seq_idx: the chunks (:class:`ChunkLayout`), as tensors.
        kwargs: passed to ``scan`` unchanged (``D``, ``dt_bias``, ``dt_softplus``,
            ``dt_limit``, ``last_chunk_indices`` ...).

    Returns:
        ``[num_chunks, H, P, N]`` in ``state_dtype`` (default ``x.dtype``): the state at
        the end of every chunk, with ``out`` filled as one call fills it. The state a
        row carries between rounds stays float32, as inside one scan.

    Raises:
        ValueError: chunks that do not tile the rows in order.
    """
    if not return_intermediate_states:
        return scan(x, dt, A, B, C, chunk_size, out, z=z, cu_seqlens=cu_seqlens,
                    cu_chunk_seqlens=cu_chunk_seqlens, seq_idx=seq_idx, initial_states=initial_states,
                    state_dtype=state_dtype, **kwargs)
    kwargs.pop("last_chunk_indices", None)
    qsl = as_int_list("cu_seqlens", cu_seqlens)
    cu = as_int_list("cu_chunk_seqlens", cu_chunk_seqlens)
    rows_of = as_int_list("seq_idx", seq_idx)
    num_rows, num_chunks = len(qsl) - 1, len(rows_of)
    per_row: list[list[int]] = [[] for _ in range(num_rows)]
    for c, row in enumerate(rows_of):
        per_row[row].append(c)
    for row, chunks in enumerate(per_row):
        bounds = [cu[c] for c in chunks] + [cu[chunks[-1] + 1]] if chunks else [qsl[row], qsl[row]]
        if bounds[0] != qsl[row] or bounds[-1] != qsl[row + 1] or (chunks and chunks != list(
                range(chunks[0], chunks[-1] + 1))):
            raise ValueError(f"the chunks of row {row} do not tile its tokens "
                             f"{qsl[row]}:{qsl[row + 1]} in order")
    H, P = x.shape[1], x.shape[2]
    N = B.shape[2]
    carry = torch.zeros(num_rows, H, P, N, dtype=torch.float32, device=x.device)
    if initial_states is not None:
        carry.copy_(initial_states)
    states = torch.empty(num_chunks, H, P, N, dtype=torch.float32, device=x.device)
    for k in range(max((len(c) for c in per_row), default=0)):
        ids = [row for row in range(num_rows) if k < len(per_row[row])]
        chunks = [per_row[row][k] for row in ids]
        whole = len(ids) == num_rows and all(cu[c] == qsl[r] and cu[c + 1] == qsl[r + 1]
                                             for r, c in zip(ids, chunks, strict=True))
        idx = None if whole else torch.cat([torch.arange(cu[c], cu[c + 1]) for c in chunks])

        def take(t: torch.Tensor | None, idx: torch.Tensor | None = idx) -> torch.Tensor | None:
            return t if t is None or idx is None else t.index_select(0, idx).contiguous()

        lengths = torch.tensor([0, *(cu[c + 1] - cu[c] for c in chunks)], dtype=torch.int32)
        out_r = out if idx is None else torch.empty(int(lengths.sum()), H, P, dtype=out.dtype)
        rows_t = torch.tensor(ids, dtype=torch.long)
        final = scan(take(x), take(dt), A, take(B), take(C), chunk_size, out_r, z=take(z),
                     cu_seqlens=torch.cumsum(lengths, 0, dtype=torch.int32), initial_states=carry[rows_t],
                     state_dtype=torch.float32, **kwargs)
        carry[rows_t] = final
        states[torch.tensor(chunks, dtype=torch.long)] = final
        if idx is not None:
            out.index_copy_(0, idx, out_r)
    return states.to(state_dtype if state_dtype is not None else x.dtype)


def store_checkpoints(checkpoint: Any, chunk_idx: torch.Tensor, x: torch.Tensor, conv_state: torch.Tensor,
                      chunk_states: torch.Tensor, ssm_state: torch.Tensor, query_start_loc: torch.Tensor,
                      *, state_len: int) -> None:
    """``store_prefill_checkpoint`` (``ops/ssd_checkpoint.py``) in torch, several entries per row.

    Entry ``e`` (``checkpoint.checkpoint_offsets[e] > 0``) writes block
    ``checkpoint.state_indices[e]``: its conv row gets the pre-conv inputs of tokens
    ``[q + o - state_len, q + o)`` (oldest first, as vLLM's kernel writes them), its SSM
    row ``chunk_states[chunk_idx[e]]``, where ``o`` is the entry's offset and ``q`` the
    start of its prefill row: ``query_start_loc[checkpoint.prefill_rows[e]]`` when the
    metadata has ``prefill_rows``, else ``query_start_loc[e]`` (vLLM's one entry per row).

    Args:
        x: ``[dim, T]`` pre-conv inputs of the prefill tokens.
        conv_state: ``[blocks, dim, >= state_len]`` (vLLM's dim-first view).
        chunk_states: ``[num_chunks, H, P, N]`` from the scan.
        ssm_state: ``[blocks, H, P, N]``.

    Tensors off the CPU go to :func:`store_checkpoints_triton`.

    Raises:
        ValueError: an offset below ``state_len`` (its conv window would reach into an
            earlier step; the scheduler plans checkpoints at least one block into a chunk
            that starts on a block boundary, so this means a broken plan).
    """
    if x.device.type != "cpu":
        store_checkpoints_triton(checkpoint, chunk_idx, x, conv_state, chunk_states, ssm_state,
                                 query_start_loc, state_len=state_len)
        return
    offsets = as_int_list("checkpoint_offsets", checkpoint.checkpoint_offsets)
    rows = getattr(checkpoint, "prefill_rows", None)
    rows = list(range(len(offsets))) if rows is None else as_int_list("prefill_rows", rows)
    qsl = as_int_list("query_start_loc", query_start_loc)
    live = [e for e, o in enumerate(offsets) if o > 0]
    if not live:
        return
    _check_offsets(offsets, state_len)
    dst = as_int_list("state_indices", checkpoint.state_indices)
    src = as_int_list("chunk_idx", chunk_idx)
    ends = [qsl[rows[e]] + offsets[e] for e in live]
    conv_vals = torch.stack([x[:, t - state_len:t] for t in ends])
    ssm_vals = chunk_states.index_select(0, torch.tensor([src[e] for e in live], dtype=torch.long,
                                                         device=chunk_states.device))
    write_state_rows([conv_state[:, :, :state_len], ssm_state], [dst[e] for e in live],
                     [conv_vals, ssm_vals])


def store_checkpoints_triton(checkpoint: Any, chunk_idx: torch.Tensor, x: torch.Tensor,
                             conv_state: torch.Tensor, chunk_states: torch.Tensor, ssm_state: torch.Tensor,
                             query_start_loc: torch.Tensor, *, state_len: int) -> None:
    """The writes of :func:`store_checkpoints` by vLLM's own Triton kernel
    (``ops/ssd_checkpoint.py`` ``store_prefill_checkpoint``).

    vLLM's kernel runs one program per entry and reads ``query_start_loc[entry]``; with
    several entries per row it is given the row starts gathered per entry
    (``query_start_loc[prefill_rows]``), so it writes every entry as it writes vLLM's one.
    Arguments as :func:`store_checkpoints`; the offsets are checked from the metadata's
    host copy (``offsets``) when it has one, so no device sync is added.

    Raises:
        ValueError: an offset below ``state_len`` (as :func:`store_checkpoints`).
    """
    from vllm.model_executor.layers.mamba.ops.ssd_checkpoint import store_prefill_checkpoint

    host = getattr(checkpoint, "offsets", None)
    if host is not None:
        _check_offsets(host, state_len)

    rows = getattr(checkpoint, "prefill_rows", None)
    starts = query_start_loc if rows is None else query_start_loc.index_select(
        0, device_index(as_int_list("prefill_rows", rows), query_start_loc.device))
    store_prefill_checkpoint(checkpoint, chunk_idx, x, conv_state, chunk_states, ssm_state, starts,
                             state_len=state_len)


def _check_offsets(offsets: Sequence[int], state_len: int) -> None:
    bad = [o for o in offsets if 0 < o < state_len]
    if bad:
        raise ValueError(f"checkpoint offset {bad[0]} is less than the conv window ({state_len} tokens): "
                         "its conv state would need inputs from before this step")
