"""The runner-side copy op (``plugin/state_copy.py``): CPU always, the Triton path on CUDA."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_admission.plugin.state_copy import StateRowCopier, copy_state_rows, rows_are_dense

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device")


def _reference(tensors, src, dst):
    """Row copies one by one on clones: what the op must produce."""
    out = [t.clone() for t in tensors]
    for s, d in zip(src, dst, strict=True):
        for o, t in zip(out, tensors, strict=True):
            o[d] = t[s]
    return out


def _gdn_like_states(num_blocks: int, device: str = "cpu", dim: int = 48, kernel: int = 4,
                     heads: int = 2, head_v: int = 8, head_k: int = 8):
    """Two layers' conv and SSM states as vLLM lays them out: views into one raw
    per-layer buffer whose block stride is the page (conv bf16 ``[blocks, kernel - 1,
    dim]`` seen transposed, SSM float32 ``[blocks, heads, head_v, head_k]``)."""
    conv_bytes = dim * (kernel - 1) * 2
    ssm_bytes = heads * head_v * head_k * 4
    page = conv_bytes + ssm_bytes + 64          # padding, as vLLM pads pages to a common size
    tensors = []
    for _ in range(2):
        raw = torch.zeros(num_blocks * page, dtype=torch.int8, device=device)
        conv = torch.as_strided(raw.view(torch.bfloat16), (num_blocks, kernel - 1, dim),
                                (page // 2, dim, 1)).transpose(1, 2)
        ssm = torch.as_strided(raw[conv_bytes:].view(torch.float32),
                               (num_blocks, heads, head_v, head_k),
                               (page // 4, head_v * head_k, head_k, 1))
        conv.copy_(torch.randn(conv.shape))
        ssm.copy_(torch.randn(ssm.shape))
        tensors += [conv, ssm]
    return tensors


def _pairs(num_blocks: int):
    rows = st.permutations(list(range(num_blocks)))
    return rows.flatmap(lambda perm: st.integers(0, num_blocks // 2).map(
        lambda n: (perm[:n], perm[n:2 * n])))


@settings(max_examples=40, deadline=None)
@given(pairs=_pairs(10))
def test_cpu_copies_every_row_of_every_tensor(pairs):
    src, dst = pairs
    tensors = _gdn_like_states(10)
    expected = _reference(tensors, src, dst)
    copy_state_rows(tensors, src, dst)
    for got, want in zip(tensors, expected, strict=True):
        assert torch.equal(got, want)


def test_a_bound_copier_serves_step_after_step():
    tensors = _gdn_like_states(8)
    copier = StateRowCopier(tensors)
    for src, dst in (([0, 1], [2, 3]), ([3], [7]), ([], [])):
        expected = _reference(tensors, src, dst)
        copier.copy(src, dst)
        assert all(torch.equal(t, w) for t, w in zip(tensors, expected, strict=True))


def test_rows_not_named_are_untouched_and_tensor_indices_work():
    tensors = _gdn_like_states(6)
    before = [t.clone() for t in tensors]
    copy_state_rows(tensors, torch.tensor([4]), torch.tensor([1]))
    for got, old in zip(tensors, before, strict=True):
        assert torch.equal(got[1], old[4])
        for r in (0, 2, 3, 4, 5):
            assert torch.equal(got[r], old[r])


def test_vllm_like_views_have_dense_rows_and_a_gap_does_not():
    conv, ssm, *_ = _gdn_like_states(3)
    assert rows_are_dense(conv) and rows_are_dense(ssm)
    assert not rows_are_dense(torch.zeros(3, 4, 6)[:, :, ::2])


@pytest.mark.parametrize("src,dst,error", [
    ([1, 2], [3], "differ in length"),
    ([1, 2], [3, 3], "twice"),
    ([1, 2], [2, 3], "both a source and a destination"),
    ([1.5], [2], "integers"),
])
def test_bad_indices_are_refused_before_anything_is_written(src, dst, error):
    tensors = _gdn_like_states(5)
    before = [t.clone() for t in tensors]
    with pytest.raises(ValueError, match=error):
        copy_state_rows(tensors, src, dst)
    assert all(torch.equal(t, b) for t, b in zip(tensors, before, strict=True))


def test_out_of_range_rows_and_bad_backends_are_refused():
    tensors = _gdn_like_states(5)
    with pytest.raises(IndexError, match="out of range"):
        copy_state_rows(tensors, [0], [5])
    with pytest.raises(ValueError, match="unknown backend"):
        copy_state_rows(tensors, [0], [1], backend="cuda")
    if not CUDA:
        with pytest.raises(ValueError, match="needs CUDA"):
            copy_state_rows(tensors, [0], [1], backend="triton")


@needs_cuda
@pytest.mark.parametrize("head_k", [8, 128])     # 128: rows of 2 MiB, many chunks per row
def test_triton_path_equals_the_torch_path(head_k):
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(40, generator=g).tolist()
    src, dst = perm[:12], perm[12:24]
    a = _gdn_like_states(40, "cuda", heads=32 if head_k == 128 else 2, head_v=head_k, head_k=head_k)
    b = [t.clone() for t in a]
    expected = _reference(a, src, dst)
    copier = StateRowCopier(a, backend="triton")
    assert copier.backend == "triton"
    copier.copy(src[:6], dst[:6])
    copy_state_rows(a, src[6:], dst[6:], backend="triton")
    copy_state_rows(b, src, dst, backend="torch")
    torch.cuda.synchronize()
    for x, y, want in zip(a, b, expected, strict=True):
        assert torch.equal(x, y) and torch.equal(x, want)


@needs_cuda
def test_auto_takes_torch_on_cuda_when_rows_are_not_dense():
    t = torch.randn(6, 4, 6, device="cuda")[:, :, ::2]
    want = _reference([t], [0], [5])[0]
    copy_state_rows([t], [0], [5])
    assert torch.equal(t, want)
