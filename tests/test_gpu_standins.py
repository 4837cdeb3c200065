"""The torch stand-ins for vLLM's compiled ops that the engine tree's GPU run needs
(``vllm_admission_testing/gpu_standins.py``), against vLLM's CPU op on the same inputs
where the CPU build has one (``silu_and_mul``; the CPU router's softmax top-k), against
vLLM's own formulas and test references otherwise, and registered the way vLLM calls them
(its Python wrappers, in a fresh process: registering touches the process's op registry)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vllm_admission_testing import gpu_standins as si

ROOT = Path(__file__).resolve().parents[1]


def _route(logits: torch.Tensor, k: int, renormalize: bool, **kw):
    t = logits.shape[0]
    w = torch.empty(t, k)
    ids = torch.empty(t, k, dtype=torch.int32)
    tei = torch.empty(t, k, dtype=torch.int32)
    si.topk_softmax(w, ids, tei, logits, renormalize, **kw)
    return w, ids, tei


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_topk_softmax_routes_as_vllms_cpu_router(k: int, renormalize: bool) -> None:
    """The same experts per token and the same weights as vLLM's CPU routing
    (``router/cpu_router.py`` ``_softmax_topk``), which leaves the order free."""
    from vllm.model_executor.layers.fused_moe.router.cpu_router import _softmax_topk

    logits = torch.randn(37, 8, generator=torch.Generator().manual_seed(k))
    w, ids, tei = _route(logits, k, renormalize)
    cpu_w, cpu_ids = _softmax_topk(logits, k, renormalize)
    for row in range(logits.shape[0]):
        ours = dict(zip(ids[row].tolist(), w[row].tolist(), strict=True))
        theirs = dict(zip(cpu_ids[row].tolist(), cpu_w[row].tolist(), strict=True))
        assert ours.keys() == theirs.keys(), row
        assert all(abs(ours[e] - theirs[e]) <= 1e-6 for e in ours), row
    assert torch.equal(ids.sort(dim=1).values, cpu_ids.sort(dim=1).values)
    # Descending probability, the kernel's order; token_expert_indices = j * T + t.
    assert (w[:, :-1] >= w[:, 1:]).all()
    t = logits.shape[0]
    assert torch.equal(tei, (torch.arange(k)[None] * t + torch.arange(t)[:, None]).int())


def test_topk_softmax_ties_padding_and_bias() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    w, ids, _ = _route(logits, 2, False)
    assert ids.tolist() == [[1, 2], [0, 1]]                      # ties to the lower id
    _, ids, _ = _route(logits, 2, False, is_padding=torch.tensor([False, True]))
    assert ids.tolist() == [[1, 2], [-1, -1]]
    bias = torch.tensor([0.0, 0.0, 0.0, 5.0])
    w, ids, _ = _route(logits, 2, False, bias=bias)
    assert ids[0].tolist() == [3, 1]                             # chosen by biased score
    assert w[0, 0] == torch.softmax(logits[0], 0)[3]             # weighted unbiased


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_silu_and_mul_equals_vllms_cpu_op(dtype: torch.dtype) -> None:
    import vllm._custom_ops  # noqa: F401 - loads the CPU build's ops

    x = torch.randn(33, 2 * 48, generator=torch.Generator().manual_seed(3)).to(dtype)
    ours, cpu = torch.empty(33, 48, dtype=dtype), torch.empty(33, 48, dtype=dtype)
    si.silu_and_mul(ours, x)
    torch.ops._C.silu_and_mul(cpu, x)
    steps = (ours.float() - cpu.float()).abs() / cpu.float().abs().clamp(min=1e-30)
    assert float(steps.max()) <= 2 * float(torch.finfo(dtype).eps)   # one rounding apart
    assert torch.equal(ours, F.silu(x[:, :48]) * x[:, 48:])          # vLLM's forward_native


def test_relu_squared_is_vllms_native_forward() -> None:
    from vllm.model_executor.layers.activation import ReLUSquaredActivation

    x = torch.randn(17, 40, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    out = torch.empty_like(x)
    si.relu_squared(out, x)
    native = ReLUSquaredActivation.forward_native(None, x)
    assert float((out.float() - native.float()).abs().max()) <= float(
        native.float().abs().max()) * 2 ** -8


def _align(ids: torch.Tensor, experts: int, size: int, **kw):
    numel = ids.numel()
    length = numel + experts * (size - 1)
    if numel < experts:
        length = min(numel * size, length)
    st = torch.empty(length, dtype=torch.int32)
    ex = torch.empty((length + size - 1) // size, dtype=torch.int32)
    n = torch.empty(1, dtype=torch.int32)
    si.moe_align_block_size(ids, experts, size, st, ex, n, **kw)
    return st, ex, int(n)


@pytest.mark.parametrize("tokens,experts,k,size", [(1, 4, 4, 16), (7, 4, 2, 16),
                                                    (33, 6, 4, 64), (300, 64, 8, 16)])
def test_moe_align_lays_every_slot_out_by_expert(tokens, experts, k, size) -> None:
    gen = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)]).int()
    st, ex, n = _align(ids, experts, size)
    flat = ids.flatten().tolist()
    counts = [flat.count(e) for e in range(experts)]
    padded = [-(-c // size) * size for c in counts]
    assert n == sum(padded)
    start = 0
    for e in range(experts):
        segment = st[start:start + padded[e]].tolist()
        assert sorted(segment[:counts[e]]) == [i for i, x in enumerate(flat) if x == e]
        assert segment[counts[e]:] == [len(flat)] * (padded[e] - counts[e])     # padding
        assert ex[start // size:(start + padded[e]) // size].tolist() == [e] * (padded[e] // size)
        start += padded[e]
    assert (st[n:] == len(flat)).all() and (ex[n // size:] == -1).all()


def test_moe_align_leaves_out_invalid_and_unmapped_experts() -> None:
    ids = torch.tensor([[0, -1, 2, 3], [1, 1, 9, 0]], dtype=torch.int32)
    st, ex, n = _align(ids, 4, 16)
    assert n == 64 and ex.tolist() == [0, 1, 2, 3, -1]
    scatter = torch.empty(8, 1, dtype=torch.int32)
    si.moe_align_block_size(ids, 4, 16, st, ex, torch.empty(1, dtype=torch.int32),
                            torch.tensor([0, -1, 1, -1]), scatter)
    assert scatter.flatten().tolist() == [0, -1, 2, -1, -1, -1, -1, 7]


def test_moe_sum_adds_the_k_slots() -> None:
    x = torch.randn(5, 3, 8, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    out = torch.empty(5, 8, dtype=torch.bfloat16)
    si.moe_sum(x, out)
    assert torch.equal(out, x.float().sum(1).to(torch.bfloat16))
    ids = torch.tensor([[0, -1, 2]] * 5)
    si.moe_sum(x, out, ids)
    assert torch.equal(out, (x[:, 0].float() + x[:, 2].float()).to(torch.bfloat16))


_REGISTERED = """
import json, torch
import vllm._custom_ops   # the CPU build's compiled ops first, as a real install has them
from vllm_admission_testing.gpu_standins import install
first = install()
again = install()
from vllm.model_executor.layers.fused_moe.moe_align_block_size import moe_align_block_size
from vllm.model_executor.layers.fused_moe.router.fused_topk_router import fused_topk
from vllm import _custom_ops as ops
logits = torch.randn(6, 4)
w, ids, _ = fused_topk(torch.zeros(6, 8), logits, 2, True)
st, ex, n = moe_align_block_size(ids, 16, 4)
x = torch.randn(6, 2, 8); out = torch.empty(6, 8); ops.moe_sum(x, out)
print(json.dumps({"first": first, "again": again, "ids": ids.tolist(), "n": int(n[0]),
                  "sum": bool(torch.allclose(out, x.sum(1))),
                  "fp8": bool(torch.ops._C.cutlass_scaled_mm_supports_fp8(90))}))
"""


def test_install_registers_what_vllms_wrappers_call() -> None:
    """In a fresh process on this CPU build: the ops missing here are registered once, the
    CPU build's own ``silu_and_mul`` is kept, and vLLM's Python wrappers (``fused_topk``,
    ``moe_align_block_size``, ``moe_sum``) run through the stand-ins."""
    out = subprocess.run([sys.executable, "-c", _REGISTERED], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(got["first"]) == {"_moe_C.topk_softmax", "_moe_C.moe_align_block_size",
                                 "_moe_C.moe_sum", "_C.relu_squared",
                                 "_C.cutlass_scaled_mm_supports_fp8",
                                 "_C.cutlass_scaled_mm_supports_block_fp8"}
    assert got["again"] == []
    assert all(len(set(row)) == 2 and all(0 <= e < 4 for e in row) for row in got["ids"])
    assert got["n"] % 16 == 0 and got["n"] >= 12 and got["sum"] and got["fp8"] is False
