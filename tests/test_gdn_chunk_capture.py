"""GDN checkpoints read from the chunk kernel's per-chunk states (the GPU path's capture).

Two parts: the planning and the writes with plain torch tensors (no Triton), and vLLM's
own Triton kernels run under Triton's interpreter on CPU in a subprocess
(``tests/fla_interpreter.py``, one run per session, about a minute on 2 loaded cores),
whose captured states are compared with the kernels' final states of each checkpoint's
prefix run on its own.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from shared_data import MODEL_CONFIGS, require

from vllm_admission.plugin.runner import gdn_chunk_capture as cap
from vllm_admission.plugin.state_copy import write_state_rows

pytestmark = pytest.mark.slow  # subprocesses or Triton's interpreter: make test-fast leaves it out

ROOT = Path(__file__).resolve().parents[1]


# -- planning and block sizes (no Triton) ------------------------------------------
def test_chunk_size_is_vllms() -> None:
    from vllm.third_party.flash_linear_attention.ops import utils

    assert cap.CHUNK_SIZE == utils.FLA_CHUNK_SIZE


def test_block_sizes_vllm_gives_qwen_models() -> None:
    from vllm_admission.core.costs import load_model
    from vllm_admission.core.geometry import aligned_block_size

    model = require(MODEL_CONFIGS / "Qwen__Qwen3-Next-80B-A3B-Instruct.json")
    costs = load_model(str(model))
    default = aligned_block_size(costs)                   # vLLM's alignment from --block-size 16
    problem = cap.gpu_block_size_problem(default)
    assert default % cap.CHUNK_SIZE and problem is not None and "--block-size 64" in problem
    assert "\n" not in problem
    assert cap.gpu_block_size_problem(aligned_block_size(costs, 64)) is None


def test_plan_maps_offsets_to_chunk_states() -> None:
    # lengths 200, 0, 130, 64: chunks 4, 0, 3, 1 -> sequence starts in h at 0, 4, 4, 7
    qsl = [0, 200, 200, 330, 394]
    plan = cap.plan_chunk_captures(qsl, [[64, 192], [], [128], []], [[7, 8], [], [9], []])
    assert plan.h_index == (0 + 1, 0 + 3, 4 + 2)
    assert plan.token_end == (64, 192, 200 + 128)
    assert plan.rows == (7, 8, 9)


@pytest.mark.parametrize("offsets, rows, message", [
    ([[100]], [[5]], "not a multiple of the GDN chunk size 64"),
    ([[200]], [[5]], "not inside its chunk"),
    ([[128, 64]], [[5, 6]], "not strictly increasing"),
    ([[64, 128]], [[5, 5]], "named twice"),
    ([[64]], [[5, 6]], "1 checkpoint offsets but 2 rows"),
])
def test_plan_refuses(offsets, rows, message) -> None:
    with pytest.raises(ValueError, match=message):
        cap.plan_chunk_captures([0, 200], offsets, rows)


@pytest.mark.parametrize("dim_first", [False, True])
def test_write_reads_the_planned_entries(dim_first: bool) -> None:
    # h[0, c] holds c everywhere and token t of the conv input holds t, so each written
    # row says which chunk state and which tokens it came from.
    heads, dv, dk, dim, width = 2, 3, 4, 5, 4
    h = torch.arange(6, dtype=torch.bfloat16).view(1, 6, 1, 1, 1).expand(1, 6, heads, dv, dk).contiguous()
    x = torch.arange(330, dtype=torch.float32).view(330, 1).expand(330, dim)
    plan = cap.plan_chunk_captures([0, 200, 330], [[64, 128], [64]], [[3, 4], [6]], conv_width=width)
    ssm = torch.full((8, heads, dv, dk), -1.0)
    conv = torch.full((8, dim, width - 1) if dim_first else (8, width - 1, dim), -1.0)
    cap.write_chunk_checkpoints(plan, h, x, ssm_state=ssm, conv_state=conv, conv_state_dim_first=dim_first)
    for row, chunk, end in ((3, 1, 64), (4, 2, 128), (6, 4 + 1, 264)):
        assert torch.all(ssm[row] == chunk)
        hist = conv[row].t() if dim_first else conv[row]              # [width - 1, dim]
        assert torch.equal(hist[:, 0], torch.arange(end - width + 1, end, dtype=torch.float32))
    untouched = [r for r in range(8) if r not in plan.rows]
    assert torch.all(ssm[untouched] == -1) and torch.all(conv[untouched] == -1)


def test_write_state_rows_checks() -> None:
    t = torch.zeros(4, 2)
    with pytest.raises(ValueError, match="names a row twice"):
        write_state_rows([t], [1, 1], [torch.ones(2, 2)])
    with pytest.raises(ValueError, match="do not fit"):
        write_state_rows([t], [1], [torch.ones(1, 3)])
    with pytest.raises(IndexError):
        write_state_rows([t], [4], [torch.ones(1, 2)])


# -- vLLM's Triton kernels under Triton's interpreter ------------------------------
def _triton_missing() -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (the interpreter runs vLLM's Triton kernels on CPU)"
    if importlib.util.find_spec("vllm.third_party.flash_linear_attention") is None:
        return "this vLLM has no Triton FLA ops"
    return None


@pytest.fixture(scope="module")
def interp(tmp_path_factory) -> dict:
    reason = _triton_missing()
    if reason:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("fla") / "run.pt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "fla_interpreter.py"), str(out)],
                          env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out)


def _truncate_bf16(x: torch.Tensor) -> torch.Tensor:
    return (x.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)


def test_states_are_those_of_the_recurrence(interp) -> None:
    """The interpreted kernels compute the gated delta rule (a float32 token-by-token
    reference; the kernels keep q, k, v, w, u in bf16, hence the tolerance)."""
    inp = interp["inputs"]
    hg, heads = interp["heads"]
    cu = [0, *torch.tensor(interp["lengths"]).cumsum(0).tolist()]
    for i in range(len(cu) - 1):
        s = inp["init"][i].clone()
        for t in range(cu[i], cu[i + 1]):
            for head in range(heads):
                kk = inp["k"][0, t, head * hg // heads].float()
                s[head] *= torch.exp(inp["g"][0, t, head])
                s[head] += inp["beta"][0, t, head] * torch.outer(inp["v"][0, t, head].float() - s[head] @ kk, kk)
        assert torch.allclose(interp["final_vllm"][i], s, atol=0.05), i


def test_composition_equals_vllms_chunk_rule(interp) -> None:
    assert torch.equal(interp["o_ours"], interp["o_vllm"])
    assert torch.equal(interp["final_ours"], interp["final_vllm"])


def test_chunk_states_equal_prefix_final_states(interp) -> None:
    """h at each checkpoint is the prefix run's float32 final state, converted to bf16.

    The interpreter converts float32 to bfloat16 by truncation (``_convert_float`` without
    a rounding mode); a GPU's ``.to(tl.bfloat16)`` rounds to nearest even, as torch does.
    So here h equals the truncated prefix state bit for bit, and is within one bf16 step
    of torch's rounding of it."""
    h = interp["h"][0, list(interp["h_index"])]
    prefix = interp["final_prefix"]
    assert prefix.dtype == torch.float32 and h.dtype == torch.bfloat16
    assert torch.equal(h, _truncate_bf16(prefix))
    steps = (h.view(torch.int16).int() - prefix.to(torch.bfloat16).view(torch.int16).int()).abs()
    assert int(steps.max()) <= 1


@pytest.mark.parametrize("cache", ["bf16", "fp32"])
def test_captured_rows(interp, cache: str) -> None:
    rows = list(interp["rows"])
    got = interp["caches"][cache]
    h = interp["h"][0, list(interp["h_index"])]
    prefix = interp["final_prefix"]
    ssm = got["ssm"][rows]
    assert torch.equal(ssm, h.to(ssm.dtype))                     # the write is exact
    # against the prefix's float32 state: bf16 precision, truncated here (below 2**-7 relative)
    assert torch.all((ssm.float() - prefix).abs() <= prefix.abs() * 2.0 ** -7)
    assert torch.equal(got["conv_ds"][rows], interp["conv_prefix"])
    assert torch.equal(got["conv_sd"][rows].transpose(1, 2), interp["conv_prefix"])


def test_scenario_covers_the_cases(interp) -> None:
    offsets, has_initial = interp["offsets"], interp["has_initial"]
    assert len(interp["lengths"]) >= 3 and max(len(o) for o in offsets) >= 2
    assert any(o and init for o, init in zip(offsets, has_initial, strict=True))          # prefix hit with checkpoints
    assert any(o and not init for o, init in zip(offsets, has_initial, strict=True))
    assert any(not o for o in offsets)


def test_the_gpu_wiring_writes_the_same_rows(interp) -> None:
    """``GPUCapture``'s wrappers around vLLM's conv and chunk rule, called in
    ``_forward_core``'s order with a decode token before the prefills: vLLM's own outputs
    (``o``, final states) unchanged, and the checkpoint rows those of the direct capture,
    bit for bit (the conv rows skip the decode token)."""
    wired, direct = interp["wired"], interp["caches"]["bf16"]
    assert torch.equal(wired["o"], interp["o_vllm"]) and torch.equal(wired["final"], interp["final_vllm"])
    rows = list(interp["rows"])
    assert wired["decode_tokens"] == 1
    assert torch.equal(wired["ssm"][rows], direct["ssm"][rows])
    assert torch.equal(wired["conv_sd"][rows], direct["conv_sd"][rows])
    others = [b for b in range(wired["ssm"].size(0)) if b not in rows]
    assert not wired["ssm"][others].any() and not wired["conv_sd"][others].any()
