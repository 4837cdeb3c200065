"""The CPU pieces of Mamba2 ``inpass`` checkpoints (``plugin/runner/mamba2_export.py``).

Each is held to the vLLM code it stands in for: the chunk layout to vLLM's own
``_compute_chunk_metadata`` where that takes the case (one checkpoint per row), the
segmented scan to one call of vLLM's CPU SSD scan (outputs and final states bit for bit,
and each chunk-end state to the final state of a run over the prefix alone), the store to
the semantics of vLLM's Triton ``store_prefill_checkpoint``, and the step metadata to
vLLM's ``MambaPrefillCheckpointMetadata`` (its own re-gather for a second KV cache group).
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from vllm_admission.plugin.runner.mamba2_export import (  # noqa: E402
    checkpoint_chunk_layout,
    checkpoint_entries,
    scan_with_chunk_states,
    store_checkpoints,
)


def _cpu_scan():
    pytest.importorskip("vllm")
    from vllm.model_executor.layers.mamba.ops.cpu.mamba_ssm import _mamba_chunk_scan_combined_fwd_cpu

    return _mamba_chunk_scan_combined_fwd_cpu


# -- layout ------------------------------------------------------------------------
@st.composite
def one_checkpoint_batches(draw):
    chunk = draw(st.sampled_from([4, 8, 16]))
    rows = draw(st.integers(1, 4))
    computed, lengths, offsets = [], [], []
    for _ in range(rows):
        length = draw(st.integers(1, 60))
        computed.append(draw(st.integers(0, 40)))
        lengths.append(length)
        offsets.append([draw(st.integers(1, length - 1))] if length > 1 and draw(st.booleans()) else [])
    return chunk, computed, lengths, offsets


@settings(max_examples=150, deadline=None)
@given(one_checkpoint_batches())
def test_layout_is_vllms_with_one_checkpoint_per_row(case):
    pytest.importorskip("vllm")
    from vllm.v1.attention.backends.mamba_attn import BaseMambaAttentionMetadataBuilder

    chunk, computed, lengths, offsets = case
    qsl = [0]
    for n in lengths:
        qsl.append(qsl[-1] + n)
    cu, seq_idx, last, ckpt = BaseMambaAttentionMetadataBuilder._compute_chunk_metadata(
        chunk, len(lengths), torch.tensor(computed), torch.tensor(qsl),
        [o[0] if o else 0 for o in offsets])
    ours = checkpoint_chunk_layout(chunk, computed, lengths, offsets)
    assert list(ours.cu_chunk_seqlen) == cu
    assert list(ours.seq_idx) == seq_idx
    assert list(ours.last_chunk_indices) == last
    assert [c[0] if c else -1 for c in ours.checkpoint_chunks] == ckpt


def test_layout_ends_a_chunk_on_every_checkpoint():
    # two rows: 100 tokens after 32 computed (checkpoints at 32 and 96), 50 fresh tokens (none)
    layout = checkpoint_chunk_layout(64, [32, 0], [100, 50], [[32, 96], []])
    ends = [layout.cu_chunk_seqlen[c + 1] for c in layout.checkpoint_chunks[0]]
    assert ends == [32, 96]
    # chunks never straddle a multiple of 64 in absolute position: 32+[0,32) | [64,128) | [128,132)
    assert layout.cu_chunk_seqlen == (0, 32, 96, 100, 150)
    assert layout.seq_idx == (0, 0, 0, 1)
    assert layout.last_chunk_indices == (2, 3)
    # without a chunk size: one chunk per segment
    flat = checkpoint_chunk_layout(None, [32, 0], [300, 50], [[32, 96], []])
    assert flat.cu_chunk_seqlen == (0, 32, 96, 300, 350)
    assert flat.checkpoint_chunks == ((0, 1), ())
    rows, offs, blocks, chunks = checkpoint_entries(flat, [[32, 96], []], [[7, 9], []])
    assert (rows, offs, blocks, chunks) == ([0, 0], [32, 96], [7, 9], [0, 1])


@pytest.mark.parametrize("offsets", [[[0]], [[10]], [[5, 5]], [[6, 3]]])
def test_layout_refuses_offsets_outside_or_out_of_order(offsets):
    with pytest.raises(ValueError, match="checkpoint offsets"):
        checkpoint_chunk_layout(4, [0], [10], offsets)


def test_layout_refuses_mismatched_lists_and_empty_rows():
    with pytest.raises(ValueError, match="one each per prefill row"):
        checkpoint_chunk_layout(4, [0, 0], [10], [[]])
    with pytest.raises(ValueError, match="no tokens"):
        checkpoint_chunk_layout(4, [0], [0], [[]])


# -- scan --------------------------------------------------------------------------
def scan_inputs(lengths, seed=0, heads=4, head_dim=16, groups=2, dstate=16):
    g = torch.Generator().manual_seed(seed)
    T = sum(lengths)

    def rnd(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=g).to(dtype)

    return dict(x=rnd(T, heads, head_dim), dt=rnd(T, heads), A=-torch.rand(heads, generator=g),
                B=rnd(T, groups, dstate), C=rnd(T, groups, dstate),
                kwargs=dict(D=torch.randn(heads, generator=g), dt_bias=torch.randn(heads, generator=g),
                            dt_softplus=True),
                init=torch.randn(len(lengths), heads, head_dim, dstate, generator=g))


def run_scan(fwd, inp, lengths, layout=None, init=None, state_dtype=torch.float32):
    qsl = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    out = torch.empty_like(inp["x"])
    if layout is None:
        states = fwd(inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], 128, out, cu_seqlens=qsl,
                     initial_states=init, state_dtype=state_dtype, **inp["kwargs"])
    else:
        states = scan_with_chunk_states(
            fwd, inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], 128, out, cu_seqlens=qsl,
            cu_chunk_seqlens=torch.tensor(layout.cu_chunk_seqlen), seq_idx=torch.tensor(layout.seq_idx),
            last_chunk_indices=torch.tensor(layout.last_chunk_indices), initial_states=init,
            return_intermediate_states=True, state_dtype=state_dtype, **inp["kwargs"])
    return out, states


def row_alone(inp, start, length):
    return {k: (v[start:start + length] if k in ("x", "dt", "B", "C") else v) for k, v in inp.items()}


#: vLLM's CPU scan is not exactly invariant to how a row is cut into calls, nor to the other
#: rows of a call: its float32 states move by up to ~1e-6 (measured: 0 to 9.5e-7 over cuts of
#: 1..299 tokens, bit-identical for cuts at multiples of 16; ~2e-7 with other rows in the
#: batch). Its bf16 outputs do not move.
STATE_ATOL = 2e-6


@pytest.mark.parametrize("chunk_size", [None, 32])
@pytest.mark.parametrize(("length", "offsets"), [(150, [32, 96]), (300, [128, 256]), (97, [1, 64])])
def test_scan_in_rounds_is_one_call(chunk_size, length, offsets):
    fwd = _cpu_scan()
    inp = scan_inputs([length], seed=length)
    init = inp["init"]
    out1, final1 = run_scan(fwd, inp, [length], init=init)
    layout = checkpoint_chunk_layout(chunk_size, [0], [length], [offsets])
    out2, states = run_scan(fwd, inp, [length], layout, init=init)
    assert torch.equal(out1, out2)
    torch.testing.assert_close(states[layout.last_chunk_indices[0]], final1[0], rtol=0, atol=STATE_ATOL)
    # each checkpoint's state is the final state of a run over the prefix alone
    for off, chunk in zip(offsets, layout.checkpoint_chunks[0], strict=True):
        _, alone = run_scan(fwd, row_alone(inp, 0, off), [off], init=init)
        torch.testing.assert_close(states[chunk], alone[0], rtol=0, atol=STATE_ATOL)
        if chunk_size is None and chunk == 0:   # round 0 is that very call: same bits
            assert torch.equal(states[chunk], alone[0])


def test_scan_in_rounds_over_a_batch():
    fwd = _cpu_scan()
    lengths, offsets, starts = [150, 40, 97], [[32, 96], [], [64]], [0, 150, 190]
    inp = scan_inputs(lengths)
    out1, final1 = run_scan(fwd, inp, lengths, init=inp["init"])
    layout = checkpoint_chunk_layout(None, [0, 0, 0], lengths, offsets)
    out2, states = run_scan(fwd, inp, lengths, layout, init=inp["init"])
    assert torch.equal(out1, out2)
    torch.testing.assert_close(states[list(layout.last_chunk_indices)], final1, rtol=0, atol=STATE_ATOL)
    for row, offs in enumerate(offsets):
        for off, chunk in zip(offs, layout.checkpoint_chunks[row], strict=True):
            _, alone = run_scan(fwd, row_alone(inp, starts[row], off), [off], init=inp["init"][row:row + 1])
            torch.testing.assert_close(states[chunk], alone[0], rtol=0, atol=STATE_ATOL)


def test_scan_without_intermediate_states_is_vllms_call():
    fwd = _cpu_scan()
    inp = scan_inputs([50, 30])
    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return fwd(*args, **kwargs)

    qsl = torch.tensor([0, 50, 80], dtype=torch.int32)
    out = torch.empty_like(inp["x"])
    scan_with_chunk_states(spy, inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], 128, out, cu_seqlens=qsl,
                           cu_chunk_seqlens=qsl, seq_idx=torch.tensor([0, 1]), **inp["kwargs"])
    assert len(calls) == 1 and calls[0]["cu_seqlens"] is qsl


def test_scan_rounds_the_returned_states_once_to_the_state_dtype():
    # bf16 cache: the carry stays float32 between rounds (as inside one scan), only the
    # returned states are rounded
    fwd = _cpu_scan()
    lengths = [200]
    inp = scan_inputs(lengths, seed=3)
    _, final = run_scan(fwd, inp, lengths, init=inp["init"][:1], state_dtype=torch.bfloat16)
    layout = checkpoint_chunk_layout(None, [0], lengths, [[64, 128]])
    _, states = run_scan(fwd, inp, lengths, layout, init=inp["init"][:1], state_dtype=torch.bfloat16)
    assert states.dtype == torch.bfloat16
    torch.testing.assert_close(states[2].float(), final[0].float(), rtol=0, atol=STATE_ATOL + 2 ** -8)


def test_scan_refuses_chunks_that_do_not_tile_the_rows():
    fwd = _cpu_scan()
    inp = scan_inputs([50])
    with pytest.raises(ValueError, match="do not tile"):
        scan_with_chunk_states(fwd, inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], 128,
                               torch.empty_like(inp["x"]), cu_seqlens=torch.tensor([0, 50]),
                               cu_chunk_seqlens=torch.tensor([0, 20, 40]), seq_idx=torch.tensor([0, 0]),
                               return_intermediate_states=True, **inp["kwargs"])


# -- store -------------------------------------------------------------------------
@dataclasses.dataclass
class Entries:
    checkpoint_offsets: torch.Tensor
    state_indices: torch.Tensor
    prefill_rows: list[int] | None = None


def test_store_writes_conv_window_and_chunk_state_per_entry():
    dim, width1, T = 6, 3, 40
    x = torch.arange(dim * T, dtype=torch.float32).view(dim, T)
    conv = torch.zeros(10, width1, dim).transpose(1, 2)      # vLLM's "SD" layout, dim-first view
    ssm = torch.zeros(10, 2, 3, 4)
    chunk_states = torch.randn(5, 2, 3, 4)
    qsl = torch.tensor([0, 25, 40])
    # row 0: checkpoints at 8 and 16; row 1: at 5
    entries = Entries(torch.tensor([8, 16, 5]), torch.tensor([3, 4, 7]), prefill_rows=[0, 0, 1])
    store_checkpoints(entries, torch.tensor([0, 1, 3]), x, conv, chunk_states, ssm, qsl, state_len=width1)
    for dst, t, chunk in ((3, 8, 0), (4, 16, 1), (7, 30, 3)):
        assert torch.equal(conv[dst], x[:, t - width1:t]), dst
        assert torch.equal(ssm[dst], chunk_states[chunk]), dst
    assert conv[[0, 1, 2, 5, 6, 8, 9]].abs().sum() == 0 and ssm[[0, 1, 2, 5, 6, 8, 9]].abs().sum() == 0


def test_store_takes_vllms_one_entry_per_row_and_skips_rows_without():
    x = torch.randn(4, 20)
    conv, ssm = torch.zeros(6, 4, 2), torch.zeros(6, 3)
    states = torch.randn(4, 3)
    entries = Entries(torch.tensor([0, 6]), torch.tensor([0, 5]))      # row 0 declines (offset 0)
    store_checkpoints(entries, torch.tensor([0, 2]), x, conv, states, ssm, torch.tensor([0, 9, 20]),
                      state_len=2)
    assert torch.equal(conv[5], x[:, 13:15]) and torch.equal(ssm[5], states[2])
    assert conv[0].abs().sum() == 0


def test_store_refuses_an_offset_inside_the_conv_window():
    with pytest.raises(ValueError, match="conv window"):
        store_checkpoints(Entries(torch.tensor([2]), torch.tensor([1])), torch.tensor([0]), torch.randn(4, 9),
                          torch.zeros(3, 4, 3), torch.randn(1, 2), torch.zeros(3, 2), torch.tensor([0, 9]),
                          state_len=3)
    # the GPU path checks the metadata's host offsets before launching vLLM's kernel
    pytest.importorskip("vllm")
    from vllm_admission.plugin.runner.mamba2_export import store_checkpoints_triton

    host = dataclasses.make_dataclass("Host", [("checkpoint_offsets", object), ("state_indices", object),
                                               ("offsets", list)])
    with pytest.raises(ValueError, match="conv window"):
        store_checkpoints_triton(host(torch.tensor([2]), torch.tensor([1]), [2]), torch.tensor([0]),
                                 torch.randn(4, 9), torch.zeros(3, 4, 3), torch.randn(1, 2), torch.zeros(3, 2),
                                 torch.tensor([0, 9]), state_len=3)


def test_cpu_pieces_accept_what_vllm_passes(monkeypatch):
    pytest.importorskip("vllm")
    import inspect

    from vllm.model_executor.layers.mamba.ops import ssd_checkpoint, ssd_combined

    from vllm_admission.plugin.boundary.surface import accepts

    assert accepts(ssd_checkpoint.store_prefill_checkpoint, store_checkpoints) == []
    # record the call vLLM's mamba_chunk_scan_combined_varlen makes, and bind it to the wrapped scan
    calls = []
    monkeypatch.setattr(ssd_combined, "_mamba_chunk_scan_combined_fwd",
                        lambda *args, **kwargs: calls.append((args, kwargs)))
    inp = scan_inputs([8])
    qsl = torch.tensor([0, 8], dtype=torch.int32)
    ssd_combined.mamba_chunk_scan_combined_varlen(
        inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], 128, qsl, qsl, torch.tensor([0]),
        torch.tensor([0]), torch.empty_like(inp["x"]), return_intermediate_states=True, **inp["kwargs"])
    (args, kwargs), = calls
    inspect.signature(functools.partial(scan_with_chunk_states, _cpu_scan())).bind(*args, **kwargs)


# -- step metadata -----------------------------------------------------------------
@dataclasses.dataclass
class StepMetadata:
    """The fields of vLLM's ``Mamba2AttentionMetadata`` that the step metadata reads or sets."""

    num_prefills: int
    num_decodes: int
    state_indices_tensor_p: torch.Tensor
    query_start_loc_p: torch.Tensor
    cu_chunk_seqlen_p: torch.Tensor | None = None
    seq_idx_p: torch.Tensor | None = None
    last_chunk_indices_p: torch.Tensor | None = None
    checkpoint_chunk_idx: torch.Tensor | None = None
    checkpoint_meta: object = None


def step_case():
    # one decode row (0), two prefill rows; B = 16; row 1 computed 32, runs 48 tokens (to 80)
    # with checkpoints at 48 and 64 (offsets 16, 32); row 2 fresh, 20 tokens, none
    table = torch.tensor([[1, 2, 0, 0, 0, 0],
                          [3, 4, 5, 6, 7, 0],
                          [8, 9, 0, 0, 0, 0]])
    md = StepMetadata(num_prefills=2, num_decodes=1, state_indices_tensor_p=torch.tensor([7, 9]),
                      query_start_loc_p=torch.tensor([0, 48, 68]))
    return md, table


def test_step_metadata_puts_every_checkpoint_in_vllms_fields():
    pytest.importorskip("vllm")
    from vllm.model_executor.layers.mamba.checkpoint import MambaPrefillCheckpointMetadata

    from vllm_admission.plugin.runner.inpass_runner import mamba2_step_metadata

    md, table = step_case()
    plan = {7: ((16, 5), (32, 6)), 99: ((16, 42),)}
    new = mamba2_step_metadata(md, plan, block_size=16, computed=[32, 0], block_table=table, chunk_size=None)
    meta = new.checkpoint_meta
    assert isinstance(meta, MambaPrefillCheckpointMetadata)
    assert meta.offsets == [16, 32] and meta.prefill_rows == [0, 0]
    assert meta.state_indices.tolist() == [5, 6] and meta.request_rows.tolist() == [1, 1]
    assert meta.block_cols.tolist() == [2, 3]
    assert new.cu_chunk_seqlen_p.tolist() == [0, 16, 32, 48, 68]
    assert new.checkpoint_chunk_idx.tolist() == [0, 1]
    assert new.last_chunk_indices_p.tolist() == [2, 3]
    # a second KV cache group re-gathers its own destinations with vLLM's method
    other = table + 100
    assert meta.regather_state_indices(other).state_indices.tolist() == [105, 106]
    # no prefill row with a checkpoint: the metadata itself
    assert mamba2_step_metadata(md, {9: ()}, block_size=16, computed=[32, 0], block_table=table,
                                chunk_size=None) is md


def test_step_metadata_refuses_a_plan_the_block_table_disagrees_with():
    pytest.importorskip("vllm")
    from vllm_admission.plugin.runner.inpass_runner import mamba2_step_metadata

    md, table = step_case()
    with pytest.raises(RuntimeError, match="block table"):
        mamba2_step_metadata(md, {7: ((16, 6),)}, block_size=16, computed=[32, 0], block_table=table,
                             chunk_size=None)


# -- vLLM's Triton store under Triton's interpreter ---------------------------------
@pytest.mark.slow
def test_vllms_triton_store_writes_several_checkpoints_per_row(tmp_path):
    # The GPU path's store (store_checkpoints_triton: vLLM's own kernel, row starts gathered
    # per entry) run by Triton's interpreter on CPU (tests/ssd_store_interpreter.py), against
    # the torch store and against the rows each entry must get. Not run on a GPU.
    import importlib.util
    import os
    import subprocess
    import sys
    from pathlib import Path

    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (the interpreter runs vLLM's Triton store on CPU)")
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "store.pt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(root / "tests" / "ssd_store_interpreter.py"), str(out)],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = torch.load(out)
    for name in ("multi", "one"):
        (conv_t, ssm_t), (conv_p, ssm_p) = r[f"{name}_triton"], r[f"{name}_torch"]
        assert torch.equal(conv_t, conv_p) and torch.equal(ssm_t, ssm_p), name
    conv, ssm = r["multi_triton"]
    x, states, qsl = r["x"], r["chunk_states"], r["qsl"]
    # entries (row, offset, block, chunk): (0, 8, 3, 0), (0, 16, 5, 1), (0, 32, 9, 2), (2, 12, 11, 5)
    for row, off, block, chunk in ((0, 8, 3, 0), (0, 16, 5, 1), (0, 32, 9, 2), (2, 12, 11, 5)):
        t = int(qsl[row]) + off
        assert torch.equal(conv[block], x[:, t - 3:t].transpose(0, 1)), block   # stored [width-1, dim]
        assert torch.equal(ssm[block], states[chunk]), block
    untouched = [b for b in range(conv.size(0)) if b not in (3, 5, 9, 11)]
    assert conv[untouched].abs().sum() == 0 and ssm[untouched].abs().sum() == 0
