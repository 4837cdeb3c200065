"""The segmented GDN prefill (``plugin/runner/gdn_capture.py``) against vLLM's own CPU path.

The reference is vLLM's un-segmented prefill, ``_cpu_gdn_attention_nonspec``, called with a
stand-in layer and metadata (no engine). Shapes are the tiny model's GDN layer
(``out/tiny-model/config.json``: 2 key heads x 64, 4 value heads x 64, conv width 4).
"""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from vllm_admission.plugin.runner.gdn_capture import (
    GDNCoreParams,
    gdn_ops_available,
    gdn_prefill_with_capture,
    plan_rounds,
)
from vllm_admission.plugin.state_copy import StateRowCopier

_CONFIG = Path(__file__).resolve().parents[1] / "out" / "tiny-model" / "config.json"
_DEFAULT_SHAPES = {"linear_num_key_heads": 2, "linear_key_head_dim": 64, "linear_num_value_heads": 4,
                   "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4}
BLOCK = 64      # checkpoint offsets below are multiples of this (a block size)


def _shapes() -> dict:
    cfg = json.loads(_CONFIG.read_text()) if _CONFIG.exists() else _DEFAULT_SHAPES
    return {k: cfg[k] for k in _DEFAULT_SHAPES}


@pytest.fixture(scope="module")
def ops():
    if not gdn_ops_available():
        pytest.skip("vLLM's CPU GDN kernels are not available")
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention
    # One thread: on a small shared CPU the kernels' OpenMP threads spin against each other
    # (a call measured 0.5 to 45 s with 2 threads, ~0.15 s with 1).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield SimpleNamespace(nonspec=gdn_attention._cpu_gdn_attention_nonspec,
                          rearrange=QwenGatedDeltaNetAttention.rearrange_mixed_qkv)
    torch.set_num_threads(threads)


class Case:
    """Random weights, inputs and state caches of one GDN layer, plus vLLM's reference."""

    def __init__(self, ops, lengths, *, ssm_dtype=torch.bfloat16, num_blocks=32, seed=0):
        s = _shapes()
        gen = torch.Generator().manual_seed(seed)
        hk, dk = s["linear_num_key_heads"], s["linear_key_head_dim"]
        hv, dv = s["linear_num_value_heads"], s["linear_value_head_dim"]
        width = s["linear_conv_kernel_dim"]
        conv_dim = 2 * hk * dk + hv * dv
        self.ops = ops

        def rnd(*shape, scale=1.0, dtype=torch.bfloat16):
            return (torch.randn(*shape, generator=gen) * scale).to(dtype)

        self.params = GDNCoreParams(
            A_log=rnd(hv, scale=0.5, dtype=torch.float32), dt_bias=rnd(hv, scale=0.5),
            conv_weight=rnd(conv_dim, 1, width, scale=0.5), conv_bias=rnd(conv_dim, scale=0.1),
            activation="silu", num_k_heads=hk, num_v_heads=hv, head_k_dim=dk, head_v_dim=dv)
        self.lengths = list(lengths)
        total = sum(self.lengths)
        self.qsl = [0]
        for n in self.lengths:
            self.qsl.append(self.qsl[-1] + n)
        self.mixed_qkv = rnd(total, conv_dim)
        self.a = rnd(total, hv)
        self.b = rnd(total, hv)
        # vLLM's default "SD" conv layout: [blocks, width - 1, conv_dim] in memory.
        self.conv = rnd(num_blocks, width - 1, conv_dim)
        self.ssm = rnd(num_blocks, hv, dv, dk, scale=0.1, dtype=ssm_dtype)
        # vLLM's reference takes the conv weight as loaded: packed where its CPU path uses the
        # C++ conv (CPUs with AVX-512 BF16 or Arm BF16), else as is. The segmented run gets
        # the plain weight and prepares it itself.
        prepared = self.params.for_vllm_conv()
        self.layer = SimpleNamespace(
            conv1d=SimpleNamespace(weight=prepared.conv_weight if prepared.conv_weight_packed
                                   else self.params.conv_weight, bias=self.params.conv_bias),
            activation="silu", A_log=self.params.A_log, dt_bias=self.params.dt_bias,
            key_dim=hk * dk, value_dim=hv * dv, tp_size=1, head_k_dim=dk, head_v_dim=dv)
        self.layer.rearrange_mixed_qkv = lambda x: ops.rearrange(self.layer, x)

    def vllm_run(self, conv, ssm, token_ranges, rows, has_init):
        """vLLM's un-segmented prefill over ``token_ranges`` (one sequence each) of the
        case's tokens, states in ``conv``/``ssm`` rows ``rows``; returns the outputs."""
        idx = torch.cat([torch.arange(s, e) for s, e in token_ranges])
        lens = [e - s for s, e in token_ranges]
        qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
        self.layer.kv_cache = [conv, ssm]
        meta = SimpleNamespace(
            spec_sequence_masks=None, num_accepted_tokens=None,
            non_spec_state_indices_tensor=torch.tensor(rows, dtype=torch.int32),
            non_spec_query_start_loc=qsl, num_decodes=0, num_decode_tokens=0,
            num_prefills=len(rows), num_prefill_tokens=len(idx),
            has_initial_state=torch.tensor(has_init, dtype=torch.bool))
        out = torch.zeros(len(idx), self.params.num_v_heads, self.params.head_v_dim, dtype=torch.bfloat16)
        self.ops.nonspec(self.layer, meta, self.mixed_qkv[idx], self.b[idx], self.a[idx], out)
        return out

    def segmented(self, conv, ssm, rows, has_init, offsets, dst, copier=None):
        return gdn_prefill_with_capture(
            self.params, self.mixed_qkv, self.a, self.b, conv_state=conv, ssm_state=ssm,
            query_start_loc=torch.tensor(self.qsl, dtype=torch.int32),
            state_indices=torch.tensor(rows, dtype=torch.int32), has_initial_state=has_init,
            checkpoint_offsets=offsets, checkpoint_rows=dst, copier=copier)


class CountingCopier(StateRowCopier):
    def __init__(self, tensors):
        super().__init__(tensors)
        self.calls = []

    def copy(self, src, dst):
        self.calls.append((list(src), list(dst)))
        super().copy(src, dst)


def _diff(x, y):
    return (x.float() - y.float()).abs().max().item()


def _scale(x):
    return max(x.float().abs().max().item(), 1e-3)


# Five sequences in one batch: 0, 1, 2, 2 and 1 checkpoints; block-aligned offsets.
LENGTHS = [200, 320, 448, 300, 130]
OFFSETS = [[], [BLOCK * 2], [BLOCK, BLOCK * 5], [BLOCK * 2, BLOCK * 4], [BLOCK * 2]]
ROWS = [1, 2, 3, 4, 5]
DST = [[], [10], [11, 12], [13, 14], [15]]


@pytest.mark.parametrize("ssm_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("has_init", [[False] * 5, [True] * 5, [True, False, True, False, True]],
                         ids=["fresh", "initial", "mixed"])
def test_segmented_run_matches_vllm(ops, ssm_dtype, has_init):
    case = Case(ops, LENGTHS, ssm_dtype=ssm_dtype)
    ref_conv, ref_ssm = case.conv.clone(), case.ssm.clone()
    ref_out = case.vllm_run(ref_conv, ref_ssm, list(pairwise(case.qsl)), ROWS, has_init)

    conv, ssm = case.conv.clone(), case.ssm.clone()
    copier = CountingCopier([conv, ssm])
    out = case.segmented(conv, ssm, ROWS, has_init, OFFSETS, DST, copier=copier)

    # (a) outputs: the same tokens as vLLM's single call.
    out_diff = _diff(out, ref_out)
    print(f"\n[{ssm_dtype}, {has_init}] output max abs diff {out_diff:.3g} (max |out| {_scale(ref_out):.3g})")
    assert out_diff <= 2e-2 * _scale(ref_out)

    # One copy per round that reached checkpoints, all its sequences at once.
    assert copier.calls == [([2, 3, 4, 5], [10, 11, 13, 15]), ([3, 4], [12, 14])]

    # (c) the working rows end with the single run's final state.
    assert torch.equal(conv[ROWS], ref_conv[ROWS])          # conv state: the last inputs, exact
    ssm_diff = _diff(ssm[ROWS], ref_ssm[ROWS])
    print(f"  final SSM state max abs diff {ssm_diff:.3g} (max |state| {_scale(ref_ssm[ROWS]):.3g})")
    assert ssm_diff <= 2e-2 * _scale(ref_ssm[ROWS])

    # (b) each checkpoint row holds the state of a separate vLLM run over the first p tokens.
    ranges, src, dst = [], [], []
    for i, (offs, rows) in enumerate(zip(OFFSETS, DST, strict=True)):
        for p, row in zip(offs, rows, strict=True):
            ranges.append((case.qsl[i], case.qsl[i] + p))
            src.append(ROWS[i])
            dst.append(row)
    pre_conv, pre_ssm = case.conv.clone(), case.ssm.clone()
    # Each prefix runs from its sequence's initial state, in the checkpoint's own row.
    for s, d in zip(src, dst, strict=True):
        pre_conv[d] = case.conv[s]
        pre_ssm[d] = case.ssm[s]
    init = [has_init[ROWS.index(s)] for s in src]
    case.vllm_run(pre_conv, pre_ssm, ranges, dst, init)
    assert torch.equal(conv[dst], pre_conv[dst])
    cap_diff = _diff(ssm[dst], pre_ssm[dst])
    print(f"  captured SSM state max abs diff {cap_diff:.3g}")
    assert cap_diff <= 2e-2 * _scale(pre_ssm[dst])

    # Rows that are neither working nor checkpoint rows are untouched.
    others = [r for r in range(conv.size(0)) if r not in ROWS and r not in dst]
    assert torch.equal(conv[others], case.conv[others])
    assert torch.equal(ssm[others], case.ssm[others])


def test_no_checkpoints_is_vllm_exactly(ops):
    case = Case(ops, [150, 260], seed=1)
    ref_conv, ref_ssm = case.conv.clone(), case.ssm.clone()
    ref = case.vllm_run(ref_conv, ref_ssm, list(pairwise(case.qsl)), [3, 7], [True, False])
    conv, ssm = case.conv.clone(), case.ssm.clone()
    out = case.segmented(conv, ssm, [3, 7], [True, False], [[], []], [[], []])
    assert torch.equal(out, ref)
    assert torch.equal(conv, ref_conv) and torch.equal(ssm, ref_ssm)


def test_offsets_off_the_kernel_chunk(ops):
    """Offsets that are not multiples of the kernel's chunk of 64 (a block size of 16)."""
    case = Case(ops, [177, 90], seed=2)
    ref_conv, ref_ssm = case.conv.clone(), case.ssm.clone()
    ref = case.vllm_run(ref_conv, ref_ssm, list(pairwise(case.qsl)), [1, 2], [True, True])
    conv, ssm = case.conv.clone(), case.ssm.clone()
    out = case.segmented(conv, ssm, [1, 2], [True, True], [[16, 112, 160], [48]], [[5, 6, 7], [8]])
    diff = _diff(out, ref)
    print(f"\noffsets 16/112/160 and 48: output max abs diff {diff:.3g}")
    assert diff <= 2e-2 * _scale(ref)
    assert torch.equal(conv[[1, 2]], ref_conv[[1, 2]])
    assert _diff(ssm[[1, 2]], ref_ssm[[1, 2]]) <= 2e-2 * _scale(ref_ssm[[1, 2]])


# -- (d) bad offsets: plan_rounds needs no vLLM -----------------------------------------
@pytest.mark.parametrize("offsets, message", [
    ([[0], []], "not inside its chunk"),
    ([[128], []], "not inside its chunk"),          # the chunk end: the pass writes it anyway
    ([[200], []], "not inside its chunk"),
    ([[-64], []], "not inside its chunk"),
    ([[64, 64], []], "not strictly increasing"),
    ([[96, 32], []], "not strictly increasing"),
    ([[], [10]], "not inside its chunk"),           # an empty chunk has no inside
])
def test_bad_offsets_raise(offsets, message):
    rows = [[20 + j for j in range(len(o))] for o in offsets]
    with pytest.raises(ValueError, match=message):
        plan_rounds([0, 128, 128], [0, 1], offsets, rows)


@pytest.mark.parametrize("rows, dst, message", [
    ([0, 0], [[5], []], "share a working state row"),
    ([0, 1], [[1], []], "are working state rows"),
    ([0, 1], [[5], [5]], "named twice"),
    ([0, 1], [[5, 6], []], "checkpoint offsets but"),
])
def test_bad_rows_raise(rows, dst, message):
    with pytest.raises(ValueError, match=message):
        plan_rounds([0, 128, 256], rows, [[64], [64] if dst[1] else []], dst)


def test_plan_rounds_groups_kth_segments():
    rounds = plan_rounds([0, 100, 100, 300, 364], [4, 5, 6, 7], [[], [], [64, 128], [32]],
                         [[], [], [10, 11], [12]])
    assert [(r.seq_ids, r.starts, r.ends) for r in rounds] == [
        ((0, 2, 3), (0, 100, 300), (100, 164, 332)),
        ((2, 3), (164, 332), (228, 364)),
        ((2,), (228,), (300,)),
    ]
    assert [(r.capture_src, r.capture_dst) for r in rounds] == [((6, 7), (10, 12)), ((6,), (11,)), ((), ())]
    with pytest.raises(ValueError, match="integers"):
        plan_rounds([0, 10], [0], [[True]], [[1]])
