"""Torch stand-ins for the compiled vLLM ops a GPU engine without vLLM's extensions reaches.

Part of the test harness, not of the package users install: on a real GPU install the
plugin runs on the user's vLLM with its compiled ops. The engine tree
(``benchmarks/gpu/make_engine_tree.py``) carries vLLM's Python files to a lent GPU machine
that has torch and Triton but cannot build vLLM's extensions; its platform plugin calls
:func:`install` in every process before vLLM imports its CUDA platform.

Which ops, and why none of vLLM's settings avoids them (vLLM 0.32.0; read from its source
and traced with the extensions absent, for the tiny Qwen3-Next and Nemotron-H with the
settings of :data:`ENGINE_ENV` and ``benchmarks/gpu/engine_check.py``'s engine arguments):

* ``_moe_C.topk_softmax`` (``fused_moe/router/fused_topk_router.py``),
  ``_moe_C.moe_align_block_size`` (``fused_moe/moe_align_block_size.py``) and
  ``_moe_C.moe_sum`` (``fused_moe/experts/triton_moe.py``): every forward of the Triton
  fused-MoE path, vLLM's only non-compiled one;
* ``_C.silu_and_mul`` (the fused-MoE activation, and looked up when ``SiluAndMul`` is
  built) and ``_C.relu_squared`` (looked up when Nemotron-H's ``ReLUSquaredActivation`` is
  built; its forward is the native one);
* ``_C.cutlass_scaled_mm_supports_fp8`` / ``_supports_block_fp8``, asked at import and
  model load about fp8 kernels: no (the models are not quantized);
* modules: ``vllm._C_stable_libtorch`` (imported by ``platforms/cuda.py``; the tree holds an
  empty one) and ``vllm.vllm_flash_attn``, whose ``__init__`` raises without its compiled
  FlashAttention, imported through the attention layers whatever the backend: a module
  that answers "not available" (the engine runs the Triton attention backend).

Semantics are those of vLLM's CUDA kernels (``csrc/moe/topk_softmax_kernels.cu``,
``csrc/moe/moe_align_sum_kernels.cu``, ``csrc/activation_kernels.cu``); where two orders
are allowed (the tokens inside one expert's segment of ``moe_align_block_size``, which the
kernel fills with atomics) any is. ``tests/test_gpu_standins.py`` checks each against vLLM's
CPU op where the CPU build has one (``silu_and_mul``; the CPU router's top-k) and against
vLLM's own test references otherwise.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["ENGINE_ENV", "SCHEMAS", "install", "moe_align_block_size", "moe_sum",
           "relu_squared", "silu_and_mul", "topk_softmax"]

#: vLLM settings, by environment variable, under which no other compiled op is reached:
#: the V1 model runner (the V2 one maps pinned host memory through a compiled op, and it
#: is the runner the plugin's in-pass hook wraps) and no FlashInfer sampler.
ENGINE_ENV = {"VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_USE_FLASHINFER_SAMPLER": "0"}


def topk_softmax(topk_weights: torch.Tensor, topk_indices: torch.Tensor,
                 token_expert_indices: torch.Tensor, gating_output: torch.Tensor,
                 renormalize: bool, bias: torch.Tensor | None = None,
                 is_padding: torch.Tensor | None = None) -> None:
    """``_moe_C.topk_softmax``: route each of ``T`` tokens to its ``k`` top experts.

    ``gating_output`` ``[T, E]`` (any float dtype) is softmaxed in float32 (non-finite
    probabilities count as 0); the ``k`` largest of ``probability + bias`` are chosen in
    descending order, ties to the lower expert id, as the CUDA kernel's argmax rounds do.
    Written in place: ``topk_weights`` ``[T, k]`` float32, the unbiased probabilities (over
    their sum with ``renormalize``, when it is positive); ``topk_indices`` ``[T, k]``, the
    expert ids, -1 for a row ``is_padding`` marks; ``token_expert_indices`` ``[T, k]``,
    ``j * T + t``.
    """
    experts = gating_output.shape[-1]
    probs = torch.softmax(gating_output.reshape(-1, experts).float(), dim=-1)
    probs = torch.where(torch.isfinite(probs), probs, torch.zeros_like(probs))
    tokens, k = probs.shape[0], topk_weights.shape[-1]
    score = probs if bias is None else probs + bias.float().unsqueeze(0)
    chosen = torch.sort(score, dim=-1, descending=True, stable=True).indices[:, :k]
    weights = probs.gather(1, chosen)
    if renormalize:
        total = weights.sum(dim=-1, keepdim=True)
        weights = weights / torch.where(total > 0, total, torch.ones_like(total))
    if is_padding is not None:
        pad = is_padding.reshape(-1)[:tokens].unsqueeze(1)
        chosen = torch.where(pad, torch.full_like(chosen, -1), chosen)
    topk_weights.copy_(weights.reshape(topk_weights.shape))
    topk_indices.copy_(chosen.to(topk_indices.dtype).reshape(topk_indices.shape))
    rank = torch.arange(k, device=probs.device, dtype=torch.int64).unsqueeze(0)
    token = torch.arange(tokens, device=probs.device, dtype=torch.int64).unsqueeze(1)
    token_expert_indices.copy_((rank * tokens + token).to(token_expert_indices.dtype)
                               .reshape(token_expert_indices.shape))


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_size: int,
                         sorted_token_ids: torch.Tensor, experts_ids: torch.Tensor,
                         num_tokens_post_pad: torch.Tensor,
                         maybe_expert_map: torch.Tensor | None = None,
                         scatter_idx: torch.Tensor | None = None) -> None:
    """``_moe_C.moe_align_block_size``: lay the ``N = T * k`` routed slots out by expert,
    each expert's run padded to a multiple of ``block_size``.

    Slot ``i`` of ``topk_ids.flatten()`` goes to expert ``e = topk_ids[i]`` (through
    ``maybe_expert_map`` when given; an id outside ``[0, num_experts)``, or mapped to -1,
    is left out). Written in place: ``sorted_token_ids`` (preallocated by vLLM), ``N``
    everywhere but each expert's segment ``[start_e, start_e + count_e)``, which holds its
    slot indices (ascending here; the kernel's order inside a segment is free), where
    ``start_e`` is the sum of the padded counts of the experts before ``e``;
    ``experts_ids[b]``, the expert owning block ``b``, -1 past the last;
    ``num_tokens_post_pad[0]``, the padded total; ``scatter_idx`` (if given), ``i`` for a
    kept slot, -1 otherwise. No host synchronisation.
    """
    device = topk_ids.device
    experts, size = int(num_experts), int(block_size)
    flat = topk_ids.reshape(-1).to(torch.int64)
    slots = flat.numel()
    kept = (flat >= 0) & (flat < experts)
    expert = flat
    if maybe_expert_map is not None:
        mapped = maybe_expert_map.to(torch.int64)[flat.clamp(0, experts - 1)]
        expert = torch.where(kept, mapped, torch.full_like(flat, -1))
        kept = expert >= 0
    expert = torch.where(kept, expert, torch.full_like(expert, experts))   # left out: last
    counts = torch.bincount(expert, minlength=experts + 1)[:experts + 1]
    padded = (counts[:experts] + size - 1) // size * size
    padded_end = torch.cumsum(padded, dim=0)
    order = torch.argsort(expert, stable=True)
    ordered = expert[order]
    first_of = torch.cumsum(counts, dim=0) - counts
    rank = torch.arange(slots, device=device) - first_of[ordered]
    length = sorted_token_ids.numel()
    dest = torch.where(ordered < experts,
                       (padded_end - padded)[ordered.clamp(max=experts - 1)] + rank,
                       torch.full_like(rank, length))                  # left out: a spare slot
    out = torch.full((length + 1,), slots, dtype=torch.int64, device=device)
    out.scatter_(0, dest, order)
    sorted_token_ids.copy_(out[:length].to(sorted_token_ids.dtype))
    blocks = torch.arange(experts_ids.numel(), device=device)
    owner = torch.searchsorted(padded_end // size, blocks, right=True)
    experts_ids.copy_(torch.where(owner < experts, owner, torch.full_like(owner, -1))
                      .to(experts_ids.dtype))
    num_tokens_post_pad.copy_(padded_end[-1:].to(num_tokens_post_pad.dtype))
    if scatter_idx is not None:
        index = torch.where(kept, torch.arange(slots, device=device), torch.full_like(flat, -1))
        scatter_idx.copy_(index.to(scatter_idx.dtype).reshape(scatter_idx.shape))


def moe_sum(input: torch.Tensor, output: torch.Tensor, topk_ids: torch.Tensor | None = None,  # noqa: A002
            expert_map: torch.Tensor | None = None) -> None:
    """``_moe_C.moe_sum``: ``output`` ``[T, H]`` = the sum over ``k`` of ``input``
    ``[T, k, H]``, in float32, rounded to ``output``'s dtype; with ``topk_ids``, slots whose
    id (mapped by ``expert_map`` when given) is negative are left out."""
    values = input.float()
    if topk_ids is not None:
        keep = topk_ids >= 0
        if expert_map is not None:
            keep &= expert_map[topk_ids.clamp(min=0).long()] >= 0
        values = values * keep.unsqueeze(-1)
    output.copy_(values.sum(dim=1).to(output.dtype).reshape(output.shape))


def silu_and_mul(result: torch.Tensor, input: torch.Tensor) -> None:  # noqa: A002
    """``_C.silu_and_mul``: ``result`` ``[..., d]`` = ``silu(x[..., :d]) * x[..., d:]`` of
    ``input`` ``[..., 2d]``, each factor rounded to the dtype (``SiluAndMul.forward_native``)."""
    half = input.shape[-1] // 2
    torch.mul(F.silu(input[..., :half]), input[..., half:], out=result)


def relu_squared(out: torch.Tensor, input: torch.Tensor) -> None:  # noqa: A002
    """``_C.relu_squared``: ``out = relu(x) ** 2`` in float32, rounded to ``out``'s dtype."""
    out.copy_(torch.square(F.relu(input.float())).to(out.dtype))


def _no(*_: Any) -> bool:
    return False


#: ``{namespace: {op: (schema, function)}}``, the schemas as vLLM's bindings declare them
#: (``csrc/torch_bindings.cpp``, ``csrc/moe/torch_bindings.cpp``).
SCHEMAS: dict[str, dict[str, tuple[str, Callable[..., Any]]]] = {
    "_moe_C": {
        "topk_softmax": ("topk_softmax(Tensor! topk_weights, Tensor! topk_indices, Tensor! "
                         "token_expert_indices, Tensor gating_output, bool renormalize, "
                         "Tensor? bias, Tensor? is_padding) -> ()", topk_softmax),
        "moe_align_block_size": ("moe_align_block_size(Tensor topk_ids, int num_experts, "
                                 "int block_size, Tensor! sorted_token_ids, Tensor! "
                                 "experts_ids, Tensor! num_tokens_post_pad, Tensor? "
                                 "maybe_expert_map, Tensor(a!)? scatter_idx=None) -> ()",
                                 moe_align_block_size),
        "moe_sum": ("moe_sum(Tensor input, Tensor! output, Tensor? topk_ids=None, "
                    "Tensor? expert_map=None) -> ()", moe_sum),
    },
    "_C": {
        "silu_and_mul": ("silu_and_mul(Tensor! result, Tensor input) -> ()", silu_and_mul),
        "relu_squared": ("relu_squared(Tensor! out, Tensor input) -> ()", relu_squared),
        "cutlass_scaled_mm_supports_fp8": (
            "cutlass_scaled_mm_supports_fp8(int cuda_device_capability) -> bool", _no),
        "cutlass_scaled_mm_supports_block_fp8": (
            "cutlass_scaled_mm_supports_block_fp8(int cuda_device_capability) -> bool", _no),
    },
}

_LIBRARIES: list[Any] = []


def _op_exists(namespace: str, name: str) -> bool:
    try:
        getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        return False
    return True


def _flash_attn_module() -> types.ModuleType:
    """``vllm.vllm_flash_attn`` that says FlashAttention is not available."""
    module = types.ModuleType("vllm.vllm_flash_attn")
    module.__path__ = []  # a package, as vLLM's is

    def unavailable(*_: Any, **__: Any) -> Any:
        raise RuntimeError("vllm_flash_attn is not available in the engine tree (no compiled "
                           "FlashAttention); run the Triton attention backend")

    module.flash_attn_varlen_func = unavailable
    module.get_scheduler_metadata = unavailable
    module.compile_flash_attn_varlen_func_from_specs = unavailable
    module.is_fa_version_supported = lambda *_, **__: False
    module.fa_version_unsupported_reason = (
        lambda *_, **__: "vLLM's compiled FlashAttention is not in the engine tree")
    return module


def _has_compiled_flash_attn() -> bool:
    """Whether vLLM's FlashAttention extension is there, read from the files (importing the
    package would run its ``__init__``, which raises without it)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(any((Path(root) / "vllm_flash_attn").glob("_vllm_fa*_C*"))
               for root in spec.submodule_search_locations)


def install() -> list[str]:
    """Register every op of :data:`SCHEMAS` that is not registered yet (CUDA and CPU
    dispatch keys; the two capability queries for every key), put the stand-in modules in
    ``sys.modules`` where vLLM's are missing, and set :data:`ENGINE_ENV` where unset.
    Idempotent; call before vLLM imports its CUDA platform. Returns
    ``"namespace.op"`` of each op registered by this call."""
    for key, value in ENGINE_ENV.items():
        os.environ.setdefault(key, value)
    sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
    if "vllm.vllm_flash_attn" not in sys.modules and not _has_compiled_flash_attn():
        sys.modules["vllm.vllm_flash_attn"] = _flash_attn_module()
    registered = []
    for namespace, ops in SCHEMAS.items():
        missing = {name: op for name, op in ops.items() if not _op_exists(namespace, name)}
        if not missing:
            continue
        library = torch.library.Library(namespace, "FRAGMENT")
        _LIBRARIES.append(library)
        for name, (schema, function) in missing.items():
            library.define(schema)
            keys = (("CompositeExplicitAutograd",) if name.startswith("cutlass_")
                    else ("CUDA", "CPU"))
            for key in keys:
                library.impl(name, function, key)
            registered.append(f"{namespace}.{name}")
    return registered
