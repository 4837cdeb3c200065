"""Run vLLM's Triton GDN kernels under Triton's interpreter on CPU (a subprocess of the tests).

``python tests/fla_interpreter.py OUT.pt`` runs one varlen GDN prefill batch through
vLLM's Triton/FLA chunked delta rule and its Triton causal conv1d, captures checkpoint
states with :mod:`vllm_admission.plugin.runner.gdn_chunk_capture`, runs every checkpoint's
prefix through the same kernels for reference, and saves all tensors to ``OUT.pt`` for
``tests/test_gdn_chunk_capture.py`` to compare. It must run in a fresh process:
``TRITON_INTERPRET=1`` has to be set before the kernels are decorated, and five shims
(below) are needed before vLLM's kernels run under the interpreter at all, each for a
reason found by running them:

1. vLLM's CPU build disables Triton (``vllm/triton_utils/importing.py``: Triton has no
   "cpu" backend, so ``HAS_TRITON = False`` and ``triton.jit`` is a no-op placeholder:
   ``TypeError: 'function' object is not subscriptable`` at the first launch). The shim
   points ``vllm.triton_utils``' ``triton``/``tl``/``tldevice`` at the real modules before
   the FLA modules are imported.
2. ``triton.autotune`` benchmarks every config through the active driver's benchmarker;
   with no GPU there is no driver (``RuntimeError: 0 active drivers``). The shim sets a
   driver whose benchmarker reports equal times, so the first config runs (the configs
   differ in ``BV``, warps and stages; the interpreter ignores warps and stages).
3. The interpreter patches the attributes of ``triton.language`` while a kernel runs, not
   names bound to them at import: FLA's ``op.py`` has ``exp = tl.exp`` and the kernels call
   ``exp(...)`` (``chunk_scaled_dot_kkt.py`` line 106), which raises ``ValueError: Did you
   forget to add @triton.jit ?``. The shim rebinds such module-level aliases to look the
   builtin up on ``tl`` at call time.
4. A Python ``range`` in an interpreted kernel yields ints; ``chunk_delta_h.py`` line 144
   calls ``i_t.to(tl.int64)`` on its loop variable (``AttributeError: 'int' object has no
   attribute 'to'``). The shim gives that module a ``range`` that yields interpreter tensors.
5. The interpreter keeps bfloat16 values as their raw ``uint16`` bits, and its
   ``create_dot`` converts only 8-bit float operands before ``np.matmul``: a ``tl.dot`` of
   two bfloat16 blocks multiplies the bit patterns as integers (a 16x16 product of
   N(0, 1) values came out near 3e10; ``wy_fast.py``'s ``tl.dot(b_A, b_vb)`` gave states
   of 1e11 where the recurrence gives 1). The shim widens bfloat16 operands to float32
   (exact) before the product, which is what a GPU's bf16 MMA with float32 accumulation
   computes, up to the order of the accumulation.

No kernel source is changed; the shims only make the interpreter execute them.
"""

from __future__ import annotations

import builtins
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch


def install_shims() -> None:
    """Shims 1-5 of the module docstring; call before importing vLLM's FLA ops."""
    import triton
    import triton.language as tl
    import triton.language.extra.libdevice as tldevice
    from triton.runtime.interpreter import _implicit_cvt
    from vllm import triton_utils

    triton_utils.triton, triton_utils.tl, triton_utils.tldevice = triton, tl, tldevice   # 1
    triton_utils.HAS_TRITON = True

    class _EqualTimes:                                                                   # 2
        def get_benchmarker(self):
            return lambda fn, quantiles=None, **kw: [1.0, 1.0, 1.0]

    triton.runtime.driver.set_active(_EqualTimes())

    import vllm.model_executor.layers.mamba.ops.causal_conv1d
    import vllm.third_party.flash_linear_attention.ops.chunk  # noqa: F401
    from vllm.third_party.flash_linear_attention.ops import chunk_delta_h
    for name, module in list(sys.modules.items()):                                       # 3
        if name.startswith(("vllm.third_party.flash_linear_attention", "vllm.model_executor.layers.mamba.ops")):
            _late_bind_builtins(module, tl)
    chunk_delta_h.range = lambda *a: (_implicit_cvt(i) for i in builtins.range(*(int(x) for x in a)))  # 4
    _widen_bf16_dot()                                                                    # 5


def _widen_bf16_dot() -> None:
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    original = InterpreterBuilder.create_dot

    def widen(x):
        if x.dtype != tl.bfloat16:
            return x
        return TensorHandle((x.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    InterpreterBuilder.create_dot = create_dot


def _late_bind_builtins(module, tl) -> None:
    for name, value in list(vars(module).items()):
        if not tl.core.is_builtin(value):
            continue
        for ns in (tl, tl.math):
            attr = next((a for a, m in vars(ns).items() if m is value), None)
            if attr is not None:
                setattr(module, name, lambda *a, _ns=ns, _attr=attr, **k: getattr(_ns, _attr)(*a, **k))
                break


# -- the scenario ------------------------------------------------------------------
#: Prefill lengths, checkpoint offsets (multiples of 64) and whether each has an
#: initial state (a prefix hit). Tiny heads keep each interpreted run to seconds.
LENGTHS = (200, 140, 70)
OFFSETS = ((64, 128, 192), (64, 128), ())
HAS_INITIAL = (False, True, True)
HG, H, DK, DV, CONV_WIDTH = 1, 2, 64, 64, 4


def _inputs(seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    t = sum(LENGTHS)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen)

    q = torch.nn.functional.normalize(rnd(1, t, HG, DK), dim=-1).to(torch.bfloat16)
    k = torch.nn.functional.normalize(rnd(1, t, HG, DK), dim=-1).to(torch.bfloat16)
    v = rnd(1, t, H, DV).to(torch.bfloat16)
    g = torch.nn.functional.logsigmoid(rnd(1, t, H) + 3.0)          # log-space decay near 0
    beta = torch.sigmoid(rnd(1, t, H))
    init = rnd(len(LENGTHS), H, DV, DK) * 0.1
    init[~torch.tensor(HAS_INITIAL)] = 0                            # as vLLM zeroes them
    conv_dim = 2 * HG * DK + H * DV
    x = rnd(t, conv_dim).to(torch.bfloat16)                         # the conv input (mixed_qkv)
    conv_init = (rnd(len(LENGTHS), conv_dim, CONV_WIDTH - 1) * 0.5).to(torch.bfloat16)
    weight = (rnd(conv_dim, CONV_WIDTH) * 0.5).to(torch.bfloat16)
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta, "init": init, "x": x, "conv_init": conv_init,
            "weight": weight}


def _cu(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _prefix_batch(inp: dict) -> tuple[dict, list[tuple[int, int]]]:
    """One varlen batch holding every checkpoint's prefix (sequence i's first p tokens)."""
    starts = _cu(LENGTHS).tolist()
    pieces, which = [], []
    for i, offs in enumerate(OFFSETS):
        for p in offs:
            pieces.append(torch.arange(starts[i], starts[i] + p))
            which.append((i, p))
    idx = torch.cat(pieces)
    out = {name: inp[name][:, idx] for name in ("q", "k", "v", "g", "beta")}
    out["x"] = inp["x"][idx]
    seq = [i for i, _ in which]
    out["init"] = inp["init"][seq]
    out["conv_init"] = inp["conv_init"][seq]
    out["lengths"] = [p for _, p in which]
    return out, which


def _conv(x: torch.Tensor, weight: torch.Tensor, conv_init: torch.Tensor, lengths, has_initial):
    """vLLM's Triton causal conv1d over a varlen batch; returns (out [T, dim], states [N, dim, w-1])."""
    from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_fn

    states = conv_init.clone()                                      # DS view: [N, dim, w - 1]
    out = causal_conv1d_fn(x.t(), weight, None, conv_states=states, query_start_loc=_cu(lengths),
                           cache_indices=torch.arange(len(lengths), dtype=torch.int32),
                           has_initial_state=torch.tensor(has_initial), activation="silu")
    return out.t(), states


def _wired(inp: dict, cu: torch.Tensor, rows: list[list[int]], blocks: int) -> dict:
    """The GPU wiring's path (``GPUCapture``'s three wrappers around vLLM's conv and chunk
    rule), called in the order ``QwenGatedDeltaNetAttention._forward_core`` calls them: the
    conv over the non-speculative tokens with one decode token first, then the chunk rule
    over the prefill tokens. The layer's cache gets the rows the wrappers write."""
    from types import SimpleNamespace

    from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_fn
    from vllm.third_party.flash_linear_attention.ops.chunk import chunk_gated_delta_rule

    from vllm_admission.plugin.runner import gdn_chunk_capture as cap

    n, dim = len(LENGTHS), inp["x"].size(1)
    slots = list(range(n))                                   # running state block of each row
    checkpoints = {slots[i]: tuple(zip(OFFSETS[i], rows[i], strict=True)) for i in range(n) if OFFSETS[i]}
    found = cap.step_capture(checkpoints, slots, cu, decode_tokens=1, conv_width=CONV_WIDTH)
    capture = cap.GPUCapture()
    conv = capture.conv_fn(causal_conv1d_fn)
    rule = capture.chunk_rule(chunk_gated_delta_rule, conv_state_dim_first=lambda: False)
    layer = SimpleNamespace(kv_cache=[
        torch.zeros(blocks, CONV_WIDTH - 1, dim, dtype=torch.bfloat16),      # SD layout
        torch.zeros(blocks, H, DV, DK, dtype=torch.bfloat16)])
    metadata = SimpleNamespace(inpass_capture=found)
    decode = torch.randn(1, dim, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    out: dict = {}

    def forward_core(layer_: SimpleNamespace) -> None:            # vLLM's order of calls
        x = torch.cat([decode, inp["x"]])
        lengths = [1, *LENGTHS]
        conv_states = torch.cat([torch.zeros(1, dim, CONV_WIDTH - 1, dtype=torch.bfloat16),
                                 inp["conv_init"]])
        conv(x.t(), inp["weight"], None, conv_states=conv_states, query_start_loc=_cu(lengths),
             cache_indices=torch.arange(n + 1, dtype=torch.int32),
             has_initial_state=torch.tensor([True, *HAS_INITIAL]), activation="silu")
        out["o"], out["final"] = rule(
            q=inp["q"], k=inp["k"], v=inp["v"], g=inp["g"], beta=inp["beta"],
            initial_state=inp["init"].clone(), output_final_state=True, cu_seqlens=cu,
            chunk_indices=None, chunk_offsets=None, use_qk_l2norm_in_kernel=False,
            core_attn_out=None)

    capture.forward_core(lambda layer_: forward_core(layer_), lambda layer_: metadata)(layer)
    return {"o": out["o"], "final": out["final"], "ssm": layer.kv_cache[1],
            "conv_sd": layer.kv_cache[0], "decode_tokens": found.decode_tokens}


def run(out_path: str) -> None:
    install_shims()
    from vllm.third_party.flash_linear_attention.ops.chunk import chunk_gated_delta_rule

    from vllm_admission.plugin.runner import gdn_chunk_capture as cap

    inp = _inputs()
    cu = _cu(LENGTHS)
    rule = {"cu_seqlens": cu, "output_final_state": True, "use_qk_l2norm_in_kernel": False}
    args = [inp[n] for n in ("q", "k", "v", "g", "beta")]
    o_vllm, final_vllm = chunk_gated_delta_rule(*args, initial_state=inp["init"].clone(), **rule)
    ours = cap.chunk_gated_delta_rule_with_states(*args, initial_state=inp["init"].clone(), **rule)

    n = len(LENGTHS)
    rows = [[n + 1 + 10 * i + j for j in range(len(o))] for i, o in enumerate(OFFSETS)]
    plan = cap.plan_chunk_captures(cu, OFFSETS, rows, conv_width=CONV_WIDTH)
    blocks = n + 1 + 10 * n
    caches = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        ssm = torch.zeros(blocks, H, DV, DK, dtype=dtype)
        conv_sd = torch.zeros(blocks, CONV_WIDTH - 1, inp["x"].size(1), dtype=torch.bfloat16)
        cap.write_chunk_checkpoints(plan, ours.h, inp["x"], ssm_state=ssm, conv_state=conv_sd,
                                    conv_state_dim_first=False)
        conv_ds = torch.zeros(blocks, inp["x"].size(1), CONV_WIDTH - 1, dtype=torch.bfloat16)
        cap.write_chunk_checkpoints(plan, ours.h, inp["x"], ssm_state=ssm.clone(), conv_state=conv_ds,
                                    conv_state_dim_first=True)
        caches[name] = {"ssm": ssm, "conv_sd": conv_sd, "conv_ds": conv_ds}

    wired = _wired(inp, cu, rows, blocks)
    pre, which = _prefix_batch(inp)
    pre_args = [pre[n] for n in ("q", "k", "v", "g", "beta")]
    _, final_prefix = chunk_gated_delta_rule(*pre_args, initial_state=pre["init"].clone(),
                                             **{**rule, "cu_seqlens": _cu(pre["lengths"])})
    has_init_prefix = [HAS_INITIAL[i] for i, _ in which]
    _, conv_prefix = _conv(pre["x"], inp["weight"], pre["conv_init"], pre["lengths"], has_init_prefix)

    torch.save({"o_vllm": o_vllm, "final_vllm": final_vllm, "o_ours": ours.o, "final_ours": ours.final_state,
                "h": ours.h, "rows": plan.rows, "h_index": plan.h_index, "which": which, "caches": caches,
                "final_prefix": final_prefix, "conv_prefix": conv_prefix, "lengths": LENGTHS,
                "offsets": OFFSETS, "has_initial": HAS_INITIAL, "inputs": inp, "heads": (HG, H),
                "wired": wired}, out_path)


if __name__ == "__main__":
    run(sys.argv[1])
