"""The runner-side copy op: recurrent-state rows from one cache block to another.

A hybrid model's recurrent state lives in per-layer cache tensors whose first
dimension is the KV cache block id (vLLM 0.32 ``MambaSpec`` groups: for Gated
DeltaNet one conv-state tensor ``[num_blocks, dim, kernel - 1]`` (or its
transpose) and one SSM-state tensor ``[num_blocks, heads, head_v, head_k]`` per
layer). Keeping a state at a position inside a forward pass (``inpass``
checkpoints, ``docs/checkpoints.md``) means copying the row a request is working
in to the row of the checkpoint block, for every state tensor of the layer or
the model, for every request that reached a checkpoint: :func:`copy_state_rows`
does all of that in one call. Where the state was computed elsewhere (the GPU GDN
path reads it from the chunk kernel's per-chunk states), :func:`write_state_rows`
writes given values into the rows instead.

* CPU: one ``copy_`` per row and tensor (torch's CPU ``index_put`` on these
  strided views measured ~100x slower); other devices without the GPU path:
  one gather and one scatter per tensor. Sources and destinations are
  disjoint, so the order of the row copies cannot matter.
* CUDA: one Triton launch for all tensors and all pairs (one program per
  (pair, tensor) row, byte copy of the row's contiguous memory range). The
  tensors may be strided views into vLLM's shared KV buffer, as long as each
  row occupies one dense memory range (true of vLLM's state views, transposed
  conv layout included). vLLM's own align-mode copy (``v1/worker/mamba_utils.py``
  with its ``batch_memcpy`` kernel) follows the same one-launch idea for
  block-to-block moves between steps.

This module imports torch (and Triton only on first GPU use), never vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import torch

__all__ = ["BACKENDS", "StateRowCopier", "as_int_list", "copy_state_rows", "device_index", "rows_are_dense",
           "write_state_rows"]

#: Valid ``backend`` values of :func:`copy_state_rows`.
BACKENDS = ("auto", "torch", "triton")


def rows_are_dense(tensor: torch.Tensor) -> bool:
    """Whether every ``tensor[i]`` fills one gap-free memory range (any order of
    its inner dimensions), so that a row can be copied as raw bytes."""
    dims = sorted((tensor.stride(d), tensor.size(d)) for d in range(1, tensor.dim())
                  if tensor.size(d) > 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def as_int_list(name: str, rows: Sequence[int] | torch.Tensor) -> list[int]:
    """``rows`` (integers or a 1-D integer tensor) as a list; ``ValueError`` naming
    ``name`` otherwise."""
    if isinstance(rows, torch.Tensor):
        if rows.dim() != 1 or rows.dtype.is_floating_point or rows.dtype == torch.bool:
            raise ValueError(f"{name} must be a 1-D integer tensor, got {rows.dtype} {tuple(rows.shape)}")
        return [int(r) for r in rows.tolist()]
    out = []
    for r in rows:
        if isinstance(r, bool) or not isinstance(r, int):
            raise ValueError(f"{name} must hold integers, got {r!r}")
        out.append(r)
    return out


def _check_tensors(tensors: Sequence[torch.Tensor]) -> int:
    """The number of rows every tensor has (their smallest first dimension)."""
    if not tensors:
        return 0
    device = tensors[0].device
    for t in tensors:
        if t.device != device:
            raise ValueError(f"state tensors on several devices ({device} and {t.device})")
        if t.dim() < 1:
            raise ValueError("a state tensor needs a block dimension (dim 0)")
    return min(t.size(0) for t in tensors)


def _check_rows(src: list[int], dst: list[int], num_rows: int) -> None:
    if len(src) != len(dst):
        raise ValueError(f"src and dst differ in length ({len(src)} against {len(dst)})")
    if len(set(dst)) != len(dst):
        raise ValueError("dst names a row twice: the result would depend on the copy order")
    both = set(src) & set(dst)
    if both:
        raise ValueError(f"rows {sorted(both)[:4]} are both a source and a destination")
    bad = [r for r in (*src, *dst) if not 0 <= r < num_rows]
    if bad:
        raise IndexError(f"row {bad[0]} out of range for state tensors of {num_rows} blocks")


class StateRowCopier:
    """:func:`copy_state_rows` bound to a fixed list of state tensors.

    A model runner's state tensors never move, so their addresses, row strides
    and row sizes are checked and (on CUDA) uploaded once; each :meth:`copy`
    then costs the index upload and one launch. ``backend`` as in
    :func:`copy_state_rows`.

    Raises:
        ValueError: tensors on several devices or without a block dimension, an
            unknown ``backend``, or ``"triton"`` where it cannot run.
    """

    def __init__(self, tensors: Sequence[torch.Tensor], *, backend: str = "auto") -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r} (valid: {', '.join(BACKENDS)})")
        self.tensors = list(tensors)
        self.num_rows = _check_tensors(self.tensors)
        self.device = self.tensors[0].device if self.tensors else torch.device("cpu")
        on_cuda = self.device.type == "cuda"
        dense = all(rows_are_dense(t) for t in self.tensors)
        if backend == "triton" and not (on_cuda and dense):
            raise ValueError("the triton backend needs CUDA tensors whose rows are dense")
        self.backend = "triton" if backend == "triton" or (backend == "auto" and on_cuda and dense) \
            else "torch"
        self._launch = _TritonRowCopy(self.tensors) if self.backend == "triton" and self.tensors else None

    def copy(self, src: Sequence[int] | torch.Tensor, dst: Sequence[int] | torch.Tensor) -> None:
        """Copy row ``src[i]`` to row ``dst[i]`` of every bound tensor (see
        :func:`copy_state_rows` for the rules and errors)."""
        src_rows = as_int_list("src", src)
        dst_rows = as_int_list("dst", dst)
        _check_rows(src_rows, dst_rows, self.num_rows)
        if not src_rows or not self.tensors:
            return
        if self._launch is not None:
            self._launch(src_rows, dst_rows)
            return
        if self.device.type == "cpu":
            # Row by row: torch's CPU index_put on these strided views is two
            # orders of magnitude slower than a plain copy of each row.
            for t in self.tensors:
                for s_row, d_row in zip(src_rows, dst_rows, strict=True):
                    t[d_row].copy_(t[s_row])
            return
        src_t = torch.tensor(src_rows, dtype=torch.long, device=self.device)
        dst_t = torch.tensor(dst_rows, dtype=torch.long, device=self.device)
        for t in self.tensors:
            t[dst_t] = t[src_t]


def copy_state_rows(tensors: Sequence[torch.Tensor], src: Sequence[int] | torch.Tensor,
                    dst: Sequence[int] | torch.Tensor, *, backend: str = "auto") -> None:
    """Copy row ``src[i]`` to row ``dst[i]`` (dim 0) of every tensor, in place.

    Args:
        tensors: state tensors ``[num_blocks, ...]``, all on one device, any
            dtypes and shapes (conv and SSM states of one or many layers).
        src, dst: block ids, equal length ``N``; integers or 1-D integer
            tensors. No row may be both a source and a destination, and no
            destination may repeat, so the result does not depend on order.
        backend: ``"auto"`` (Triton on CUDA when every tensor's rows are
            dense, else torch), ``"torch"`` or ``"triton"`` (CUDA only).

    Raises:
        ValueError: unequal lengths, a repeated destination, a row both read
            and written, tensors on several devices, an unknown ``backend``,
            or ``"triton"`` asked for where it cannot run.
        IndexError: a row id outside a tensor's first dimension.

    A runner that copies every step should build a :class:`StateRowCopier`
    once instead: it uploads the tensors' layout a single time.
    """
    StateRowCopier(tensors, backend=backend).copy(src, dst)


def write_state_rows(tensors: Sequence[torch.Tensor], rows: Sequence[int] | torch.Tensor,
                     values: Sequence[torch.Tensor]) -> None:
    """Write ``values[t][i]`` into row ``rows[i]`` (dim 0) of ``tensors[t]``, in place.

    The other half of the copy op: states computed elsewhere (the GPU GDN path reads
    them from the chunk kernel's per-chunk states,
    :mod:`vllm_admission.plugin.runner.gdn_chunk_capture`) rather than another row.

    Args:
        tensors: state tensors ``[num_blocks, ...]`` on one device (strided views allowed).
        rows: ``N`` distinct block ids, integers or a 1-D integer tensor.
        values: one ``[N, *tensors[t].shape[1:]]`` tensor per state tensor, on the same
            device; cast to the state tensor's dtype.

    CPU: one ``copy_`` per row and tensor (as :class:`StateRowCopier`); other devices:
    one ``index_copy_`` per tensor.

    Raises:
        ValueError: a row named twice, values that do not match their tensor's row
            shape, or tensors on several devices.
        IndexError: a row id outside a tensor's first dimension.
    """
    dst = as_int_list("rows", rows)
    if len(values) != len(tensors):
        raise ValueError(f"{len(values)} value tensors for {len(tensors)} state tensors")
    num_rows = _check_tensors(tensors)
    if len(set(dst)) != len(dst):
        raise ValueError("rows names a row twice: the result would depend on the write order")
    bad = [r for r in dst if not 0 <= r < num_rows]
    if bad:
        raise IndexError(f"row {bad[0]} out of range for state tensors of {num_rows} blocks")
    for t, val in zip(tensors, values, strict=True):
        if tuple(val.shape) != (len(dst), *t.shape[1:]):
            raise ValueError(f"values {tuple(val.shape)} do not fit {len(dst)} rows of {tuple(t.shape)}")
        if val.device != t.device:
            raise ValueError(f"values on {val.device}, state tensor on {t.device}")
    if not dst:
        return
    index = None if tensors[0].device.type == "cpu" else device_index(dst, tensors[0].device)
    for t, val in zip(tensors, values, strict=True):
        val = val.to(t.dtype)
        if index is None:
            for i, row in enumerate(dst):
                t[row].copy_(val[i])
        else:
            t.index_copy_(0, index, val)


def device_index(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """``values`` as an int64 tensor on ``device``, copied from pinned host memory without
    waiting (on CUDA), so building an index adds no host-device sync to the step."""
    host = torch.tensor(values, dtype=torch.int64)
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


# -- the GPU path ------------------------------------------------------------------
#: Words (of the widest size dividing every address and length) per program.
_CHUNK_WORDS = 16384
_BLOCK_WORDS = 1024


@lru_cache(maxsize=1)
def _row_copy_kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def row_copy(bases, row_strides, row_words, src_rows, dst_rows, num_tensors,
                 WORD: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
        # Program (p, c): row src -> dst of tensor p % num_tensors for pair
        # p // num_tensors, words [c * CHUNK, (c + 1) * CHUNK) of it.
        pid = tl.program_id(0)
        chunk = tl.program_id(1)
        pair = pid // num_tensors
        t = pid % num_tensors
        if WORD == 8:
            kind = tl.pointer_type(tl.uint64)
        elif WORD == 4:
            kind = tl.pointer_type(tl.uint32)
        elif WORD == 2:
            kind = tl.pointer_type(tl.uint16)
        else:
            kind = tl.pointer_type(tl.uint8)
        base = tl.load(bases + t)
        stride = tl.load(row_strides + t)
        n = tl.load(row_words + t)
        src = (base + tl.load(src_rows + pair) * stride).to(kind)
        dst = (base + tl.load(dst_rows + pair) * stride).to(kind)
        offs = tl.arange(0, BLOCK)
        start = chunk * CHUNK
        for step in range(0, CHUNK, BLOCK):
            idx = start + step + offs
            mask = idx < n
            tl.store(dst + idx, tl.load(src + idx, mask=mask), mask=mask)

    return row_copy


class _TritonRowCopy:
    """The tensors' layout on the device, and one launch per call."""

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        device = tensors[0].device
        # Strides are >= 0, so element [0, ..., 0] is a dense row's first byte.
        bases = [t.data_ptr() for t in tensors]
        strides = [t.stride(0) * t.element_size() for t in tensors]
        nbytes = [t[0].numel() * t.element_size() for t in tensors]
        self.word = next(w for w in (8, 4, 2, 1)
                         if all(x % w == 0 for x in (*bases, *strides, *nbytes)))
        self.meta = torch.tensor([bases, strides, [n // self.word for n in nbytes]],
                                 dtype=torch.int64, device=device)
        self.chunks = -(-max(nbytes) // self.word // _CHUNK_WORDS)
        self.num_tensors = len(tensors)
        self.device = device

    def __call__(self, src: list[int], dst: list[int]) -> None:
        rows = device_index([*src, *dst], self.device).view(2, len(src))
        meta = self.meta
        _row_copy_kernel()[(len(src) * self.num_tensors, self.chunks)](
            meta[0], meta[1], meta[2], rows[0], rows[1], self.num_tensors,
            WORD=self.word, CHUNK=_CHUNK_WORDS, BLOCK=_BLOCK_WORDS)
