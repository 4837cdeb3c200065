"""Run vLLM's Triton Mamba2 checkpoint store under Triton's interpreter on CPU (a test subprocess).

``python tests/ssd_store_interpreter.py OUT.pt`` writes several checkpoints per prefill row
twice: through :func:`vllm_admission.plugin.runner.mamba2_export.store_checkpoints_triton`
(vLLM's own kernel, ``ops/ssd_checkpoint.py``, given the row starts gathered per entry) and
through the torch :func:`~vllm_admission.plugin.runner.mamba2_export.store_checkpoints`, on
copies of the same caches, and saves both to ``OUT.pt`` for ``tests/test_mamba2_export.py``.
It must run in a fresh process: ``TRITON_INTERPRET=1`` is read when the kernel is decorated,
and vLLM's CPU build replaces Triton by a placeholder (``vllm/triton_utils/importing.py``),
so its ``triton``/``tl`` are pointed at the real modules first (shim 1 of
``tests/fla_interpreter.py``; the store needs none of the others there). One more shim,
found by running the kernel: the kernel's conv mask ``valid & (cols < DIM * STATE_LEN)``
(an ``int1`` scalar and an ``int1`` block) reaches the interpreter's masked load as an
``int32`` array, which its C++ loader refuses (``ValueError: mask has unsupported dtype``);
the shim passes such masks as ``bool`` (non-zero is true, Triton's ``int1`` meaning). The
kernel source is not changed.
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch


def main(out: str) -> None:
    import triton
    import triton.language as tl
    import triton.language.extra.libdevice as tldevice
    from vllm import triton_utils

    triton_utils.triton, triton_utils.tl, triton_utils.tldevice = triton, tl, tldevice
    triton_utils.HAS_TRITON = True
    _bool_masks()
    from vllm.model_executor.layers.mamba.checkpoint import MambaPrefillCheckpointMetadata

    from vllm_admission.plugin.runner.inpass_runner import _multi_checkpoint_metadata
    from vllm_admission.plugin.runner.mamba2_export import store_checkpoints, store_checkpoints_triton

    gen = torch.Generator().manual_seed(0)
    dim, width1, blocks, H, P, N = 24, 3, 12, 2, 4, 8
    qsl = torch.tensor([0, 40, 70, 100], dtype=torch.int32)
    x = torch.randn(dim, 100, generator=gen).to(torch.bfloat16)          # [dim, T], pre-conv
    chunk_states = torch.randn(7, H, P, N, generator=gen)
    # entries: row 0 at 8, 16, 32; row 2 at 12 (row 1 none); chunks and blocks as a layout gives
    multi = _multi_checkpoint_metadata()(
        checkpoint_offsets=torch.tensor([8, 16, 32, 12], dtype=torch.int32),
        state_indices=torch.tensor([3, 5, 9, 11]), offsets=[8, 16, 32, 12], prefill_rows=[0, 0, 0, 2])
    one = MambaPrefillCheckpointMetadata(checkpoint_offsets=torch.tensor([16, 0, 24], dtype=torch.int32),
                                         state_indices=torch.tensor([2, 0, 7]), offsets=[16, 0, 24])
    cases = {"multi": (multi, torch.tensor([0, 1, 2, 5])), "one": (one, torch.tensor([1, 0, 6]))}
    result = {}
    for name, (meta, chunk_idx) in cases.items():
        for how, store in (("triton", store_checkpoints_triton), ("torch", store_checkpoints)):
            # vLLM's default "SD" conv layout: [blocks, width - 1, dim] stored, read dim-first
            conv = torch.zeros(blocks, width1, dim, dtype=torch.bfloat16)
            ssm = torch.zeros(blocks, H, P, N)
            store(meta, chunk_idx, x, conv.transpose(1, 2), chunk_states, ssm, qsl, state_len=width1)
            result[f"{name}_{how}"] = (conv.clone(), ssm.clone())
    result["x"], result["chunk_states"], result["qsl"] = x, chunk_states, qsl
    torch.save(result, out)


def _bool_masks() -> None:
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    load, store = InterpreterBuilder.create_masked_load, InterpreterBuilder.create_masked_store

    def as_bool(mask):
        return mask if mask.data.dtype == bool else TensorHandle(mask.data != 0, mask.dtype)

    InterpreterBuilder.create_masked_load = lambda self, ptrs, mask, *a: load(self, ptrs, as_bool(mask), *a)
    InterpreterBuilder.create_masked_store = lambda self, ptrs, value, mask, *a: store(
        self, ptrs, value, as_bool(mask), *a)


if __name__ == "__main__":
    main(sys.argv[1])
