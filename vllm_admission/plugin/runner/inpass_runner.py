"""The runner side of ``inpass`` checkpoints: what the wrapped GDN core and Mamba2 builder run.

:func:`vllm_admission.plugin.boundary.hooks.install_inpass_runner` wraps vLLM's
``GPUModelRunner.execute_model`` and the CPU GDN core
``_cpu_gdn_attention_nonspec``; the wrappers talk through one
:class:`StepCheckpoints` (the explicit channel: ``execute_model`` publishes
the step's checkpoint list, which the scheduler attached to its
``SchedulerOutput``, and every GDN layer of that step reads it) and run
:func:`segmented_core` when a prefill of the step has checkpoints. Nothing
here changes a vLLM object.

For Mamba2 layers the same list reaches vLLM's own prefill-checkpoint export:
the wrapped ``Mamba2AttentionMetadataBuilder.build`` calls
:func:`mamba2_step_metadata`, which puts the step's checkpoints into the
metadata (:mod:`vllm_admission.plugin.runner.mamba2_export`).

Imports torch and vLLM's CPU GDN kernels lazily (on the first checkpoint).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise
from typing import Any

__all__ = ["StateCopiers", "StepCheckpoints", "mamba2_step_metadata", "row_checkpoints", "segmented_core"]


class StepCheckpoints:
    """The checkpoint list of the step being executed, from the runner to the GDN core.

    ``plan`` is ``{running state block id: ((token offset in the chunk, checkpoint
    block id), ...)}`` (``None``: no checkpoint this step), replaced at the start
    of every ``execute_model``. ``copiers`` keeps one row copier per GDN layer.
    """

    __slots__ = ("copiers", "plan")

    def __init__(self) -> None:
        self.plan: Mapping[int, Sequence[tuple[int, int]]] | None = None
        self.copiers = StateCopiers()


class StateCopiers:
    """One :class:`~vllm_admission.plugin.state_copy.StateRowCopier` per GDN layer,
    bound to its conv and SSM state tensors (rebuilt when they change); held
    by a weak reference to the layer, so no attribute is set on vLLM's module."""

    def __init__(self) -> None:
        self._by_layer: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def get(self, layer: Any, conv_state: Any, ssm_state: Any) -> Any:
        """The layer's copier for these two tensors."""
        from vllm_admission.plugin.state_copy import StateRowCopier

        copier = self._by_layer.get(layer)
        if copier is None or copier.tensors[0] is not conv_state or copier.tensors[1] is not ssm_state:
            copier = StateRowCopier([conv_state, ssm_state])
            self._by_layer[layer] = copier
        return copier


def row_checkpoints(plan: Mapping[int, Sequence[tuple[int, int]]], running_blocks: Sequence[int],
                    lengths: Sequence[int]) -> tuple[list[list[int]], list[list[int]]]:
    """Per prefill row (its running state block and its chunk length): the step plan's
    checkpoint offsets strictly inside the chunk, and their checkpoint blocks, in the
    plan's order. Returns ``(offsets, blocks)``, one list each per row."""
    offsets: list[list[int]] = []
    blocks: list[list[int]] = []
    for block, length in zip(running_blocks, lengths, strict=True):
        pairs = [(off, blk) for off, blk in plan.get(block, ()) if 0 < off < length]
        offsets.append([off for off, _ in pairs])
        blocks.append([blk for _, blk in pairs])
    return offsets, blocks


def segmented_core(core: Callable[..., None], plan: Mapping[int, Sequence[tuple[int, int]]], layer: Any,
                   md: Any, mixed_qkv: Any, b: Any, a: Any, core_attn_out: Any,
                   copiers: StateCopiers | None = None) -> bool:
    """Run one GDN layer's recurrent core with each prefill sequence cut at its
    checkpoint offsets; return False (having done nothing) when no prefill
    sequence of this step has one.

    The decodes (vLLM puts them first) go through ``core`` (vLLM's
    ``_cpu_gdn_attention_nonspec``) with the metadata narrowed to them; the
    prefills through
    :func:`~vllm_admission.plugin.runner.gdn_capture.gdn_prefill_with_capture`,
    which runs the same kernels in rounds cut at the offsets and copies the
    conv and SSM rows into the checkpoint blocks after each round.

    Args:
        core: vLLM's original ``_cpu_gdn_attention_nonspec``.
        plan: the step's list, ``{running state block: ((offset in chunk,
            checkpoint block), ...)}``.
        layer, md: the GDN layer and its ``GDNAttentionMetadata``.
        mixed_qkv, b, a: ``[tokens, ...]`` inputs, decodes first.
        core_attn_out: ``[tokens, num_v_heads, head_v_dim]`` output, written in place.
        copiers: the layers' row copiers (a fresh one per call when ``None``).
    """
    from vllm_admission.plugin.runner.gdn_capture import (
        GDNCoreParams,
        gdn_prefill_with_capture,
    )

    nd, ndt = md.num_decodes, md.num_decode_tokens
    npf, npt = md.num_prefills, md.num_prefill_tokens
    slots = md.non_spec_state_indices_tensor[nd:nd + npf].tolist()
    qsl = [q - ndt for q in md.non_spec_query_start_loc[nd:nd + npf + 1].tolist()]
    offsets, rows = row_checkpoints(plan, slots, [b - a for a, b in pairwise(qsl)])
    if not any(offsets):
        return False
    if nd:
        decodes = dataclasses.replace(md, num_prefills=0, num_prefill_tokens=0, num_actual_tokens=ndt)
        core(layer, decodes, mixed_qkv[:ndt], b[:ndt], a[:ndt], core_attn_out[:ndt])
    conv_state, ssm_state = layer.kv_cache[0], layer.kv_cache[1]
    gdn_prefill_with_capture(
        GDNCoreParams.from_layer(layer), mixed_qkv[ndt:ndt + npt], a[ndt:ndt + npt], b[ndt:ndt + npt],
        conv_state=conv_state, ssm_state=ssm_state, query_start_loc=qsl, state_indices=slots,
        has_initial_state=md.has_initial_state[nd:nd + npf], checkpoint_offsets=offsets,
        checkpoint_rows=rows,
        copier=(copiers if copiers is not None else StateCopiers()).get(layer, conv_state, ssm_state),
        out=core_attn_out[ndt:ndt + npt])
    return True


def mamba2_step_metadata(metadata: Any, plan: Mapping[int, Sequence[tuple[int, int]]], *, block_size: int,
                         computed: Sequence[int], block_table: Any, chunk_size: int | None) -> Any:
    """A Mamba2 step's attention metadata with the step's checkpoints in vLLM's export fields.

    Returns ``metadata`` itself when no prefill row of the step has a checkpoint;
    else a copy (``dataclasses.replace``) whose chunk layout ends a chunk on every
    checkpoint (:func:`~vllm_admission.plugin.runner.mamba2_export.checkpoint_chunk_layout`),
    ``checkpoint_chunk_idx`` names the chunk of each checkpoint entry, and
    ``checkpoint_meta`` is vLLM's ``MambaPrefillCheckpointMetadata``
    (``model_executor/layers/mamba/checkpoint.py``) with one entry per checkpoint and
    a ``prefill_rows`` field. ``request_rows`` / ``block_cols`` are kept, so vLLM's
    ``update_block_table`` re-gathers the destinations for every other KV cache
    group of the same spec.

    Args:
        metadata: vLLM's ``Mamba2AttentionMetadata`` for the step (decodes first).
        plan: the step's ``{running state block: ((offset in chunk, checkpoint block), ...)}``.
        block_size: the state group's block size in tokens.
        computed: per prefill row, tokens computed before this step.
        block_table: ``[num_reqs, cols]`` block table of this group.
        chunk_size: the SSD chunk size of the layout (None: one chunk per segment,
            what vLLM's CPU scan needs).

    Raises:
        RuntimeError: a checkpoint block that is not the block table's entry at its
            column (the scheduler's plan and the runner's tables disagree).
    """
    import torch

    from vllm_admission.plugin.runner.mamba2_export import checkpoint_chunk_layout, checkpoint_entries

    nd = metadata.num_decodes
    running = metadata.state_indices_tensor_p.tolist()
    qsl = metadata.query_start_loc_p.tolist()
    lengths = [b - a for a, b in pairwise(qsl)]
    offsets, blocks = row_checkpoints(plan, running, lengths)
    if not any(offsets):
        return metadata
    layout = checkpoint_chunk_layout(chunk_size, computed, lengths, offsets)
    rows, offs, dst, chunks = checkpoint_entries(layout, offsets, blocks)
    cols = [(computed[r] + o) // block_size - 1 for r, o in zip(rows, offs, strict=True)]
    device = metadata.query_start_loc_p.device

    def tensor(values: Sequence[int], dtype: Any) -> Any:
        return torch.tensor(values, dtype=dtype, device=device)

    request_rows = tensor([nd + r for r in rows], torch.int64)
    block_cols = tensor(cols, torch.int64)
    table = block_table[request_rows, block_cols].tolist()
    if table != dst:
        raise RuntimeError(f"inpass: checkpoint blocks {dst} are not the block table's {table} "
                           f"at columns {cols}")
    meta = _multi_checkpoint_metadata()(
        checkpoint_offsets=tensor(offs, torch.int32), state_indices=tensor(dst, torch.int64), offsets=offs,
        request_rows=request_rows, block_cols=block_cols, prefill_rows=rows)
    return dataclasses.replace(
        metadata,
        cu_chunk_seqlen_p=tensor(layout.cu_chunk_seqlen, torch.int32),
        seq_idx_p=tensor(layout.seq_idx, torch.int32),
        last_chunk_indices_p=tensor(layout.last_chunk_indices, torch.int32),
        checkpoint_chunk_idx=tensor(chunks, torch.int64),
        checkpoint_meta=meta)


_MULTI: list[type] = []


def _multi_checkpoint_metadata() -> type:
    """vLLM's ``MambaPrefillCheckpointMetadata`` with ``prefill_rows``: the prefill row of
    each entry, for several entries per row (built on first use: vLLM is imported lazily)."""
    if not _MULTI:
        from vllm.model_executor.layers.mamba.checkpoint import MambaPrefillCheckpointMetadata

        @dataclasses.dataclass
        class MultiCheckpointMetadata(MambaPrefillCheckpointMetadata):
            prefill_rows: list[int] | None = None

        _MULTI.append(MultiCheckpointMetadata)
    return _MULTI[0]
