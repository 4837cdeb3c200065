"""In-pass checkpoints on a GPU: correctness of the GPU pieces and what they cost, in one process.

Runs vLLM's own Triton kernels (Gated DeltaNet's chunked delta rule from FLA, Mamba2's SSD
scan and checkpoint store) with the plugin's GPU pieces around them, on a machine that has
torch and Triton but no vLLM: the kernels come from a kernel tree built here from the
installed vLLM (``benchmarks/gpu/make_kernel_tree.py``, default ``.gpu/kernels``, git-ignored,
about 0.2 MiB) and put on ``PYTHONPATH``.

Parts (each runs on its own; a failing part is recorded and the others still run):

* ``gdn_check``: ``chunk_gated_delta_rule_with_states`` against vLLM's
  ``chunk_gated_delta_rule`` (``o`` and ``final_state`` bit for bit); the checkpoint rows
  ``plan_chunk_captures`` + ``write_chunk_checkpoints`` read from ``h`` against split mode's
  state (vLLM's rule over the first ``p`` tokens only, its final state cast to the bf16 cache),
  and the conv rows against the last ``width - 1`` conv inputs before ``p``.
* ``copy_check``: ``copy_state_rows`` / ``StateRowCopier`` (one Triton launch on CUDA) against
  per-tensor ``index_copy_`` on views into shared page buffers laid out as vLLM lays them
  (conv state stored ``[blocks, width - 1, dim]``, also read transposed), every other byte
  of the buffers untouched.
* ``mamba2_check``: ``store_checkpoints_triton`` (vLLM's ``store_prefill_checkpoint``, several
  entries per row) against the torch ``store_checkpoints`` on CPU copies; the chunk-end state
  at each checkpoint from ``mamba_chunk_scan_combined_varlen(return_intermediate_states=True)``
  with ``checkpoint_chunk_layout`` against a separate scan over the first ``p`` tokens.
* ``gdn_time``, ``mamba2_time``: one layer's prefill core with real shapes (Qwen3-Next-80B-A3B,
  Nemotron-3-Nano-30B-A3B): the plain call (baseline), in-pass checkpoints (1 and 4, or 1 and 3,
  per sequence) and split mode (the same batch cut at the checkpoints, one call per round with
  the state carried through the cache). Per layer only: split mode's other costs (a forward
  pass of the whole model per extra step) are not in these numbers.
* ``copy_time``: the copy op over all 36 GDN layers of Qwen3-Next for 1, 8 and 64 row pairs
  against a per-tensor ``index_copy_`` loop, with the bandwidth reached.

Variants are interleaved (the order rotates each repeat) and timed with CUDA events; medians.
By default each autotuned kernel runs its first valid config (``--autotune first``, as vLLM's
``VLLM_TRITON_FORCE_FIRST_CONFIG`` does) to keep compilation to about a minute; baseline and
in-pass then run the very same kernel configs. ``--autotune full`` tunes as vLLM does at start-up
(about 160 configs to compile: several more minutes).

Build the tree here, then on the GPU machine (no network, no vLLM needed)::

    python benchmarks/gpu/make_kernel_tree.py                     # writes .gpu/kernels
    PYTHONPATH=.:.gpu/kernels python3 benchmarks/gpu_inpass_bench.py --json $OUT/gpu_inpass.json

Check it end to end on a CPU with Triton's interpreter (tiny shapes, one repeat, about a minute)::

    TRITON_INTERPRET=1 PYTHONPATH=.:.gpu/kernels python benchmarks/gpu_inpass_bench.py --small \\
        --json /tmp/gpu_small.json

Exit status 0 when every part ran and every check passed.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
START = time.perf_counter()

FLA_OPS = "vllm.third_party.flash_linear_attention.ops"
MAMBA_OPS = "vllm.model_executor.layers.mamba.ops"


# -- model shapes --------------------------------------------------------------------
@dataclass(frozen=True)
class GDNShape:
    """One Gated DeltaNet layer's core: key heads, value heads, head dims, conv width."""

    hk: int
    hv: int
    dk: int
    dv: int
    width: int

    @property
    def conv_dim(self) -> int:
        return 2 * self.hk * self.dk + self.hv * self.dv


@dataclass(frozen=True)
class Mamba2Shape:
    """One Mamba2 layer's SSD scan: heads, head dim, state size, groups, chunk size, conv width."""

    heads: int
    head_dim: int
    state: int
    groups: int
    chunk: int
    width: int

    @property
    def conv_dim(self) -> int:
        return self.heads * self.head_dim + 2 * self.groups * self.state


#: /work/shared/model_configs/Qwen__Qwen3-Next-80B-A3B-Instruct.json: linear_num_key_heads 16,
#: linear_key_head_dim 128, linear_num_value_heads 32, linear_value_head_dim 128,
#: linear_conv_kernel_dim 4; num_hidden_layers 48 with full_attention_interval 4, so 36 GDN
#: layers; torch_dtype bfloat16 (SSM cache bf16, vLLM's "auto").
QWEN3_NEXT = GDNShape(hk=16, hv=32, dk=128, dv=128, width=4)
QWEN3_NEXT_GDN_LAYERS = 36
#: vLLM's hybrid block for Qwen3-Next with --block-size 64 (``core/geometry.py``
#: ``aligned_block_size``: 576 = 9 * 64; the default --block-size 16 gives 544, not a
#: multiple of the FLA chunk of 64).
QWEN3_NEXT_BLOCK = 576

#: /work/shared/model_configs/nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json: mamba_num_heads
#: 64, mamba_head_dim 64, ssm_state_size 128, n_groups 8, chunk_size 128, conv_kernel 4;
#: hybrid_override_pattern has 23 "M" (Mamba2) of 52 layers; mamba_ssm_cache_dtype float32.
NEMOTRON_NANO = Mamba2Shape(heads=64, head_dim=64, state=128, groups=8, chunk=128, width=4)
NEMOTRON_NANO_MAMBA_LAYERS = 23
NEMOTRON_NANO_SSM_DTYPE = torch.float32
#: vLLM's hybrid block for Nemotron-3-Nano with --block-size 64 (``aligned_block_size``).
NEMOTRON_NANO_BLOCK = 2112

#: What the JSON records of the model constants above.
MODELS = {"Qwen/Qwen3-Next-80B-A3B-Instruct": {**asdict(QWEN3_NEXT), "gdn_layers": QWEN3_NEXT_GDN_LAYERS,
                                               "block": QWEN3_NEXT_BLOCK, "ssm_dtype": "bfloat16"},
          "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": {**asdict(NEMOTRON_NANO),
                                                         "mamba_layers": NEMOTRON_NANO_MAMBA_LAYERS,
                                                         "block": NEMOTRON_NANO_BLOCK, "ssm_dtype": "float32"}}

SMALL_GDN = GDNShape(hk=1, hv=2, dk=64, dv=64, width=4)
SMALL_MAMBA = Mamba2Shape(heads=4, head_dim=16, state=16, groups=2, chunk=32, width=4)


# -- output -------------------------------------------------------------------------
def log(msg: str) -> None:
    print(f"[{time.perf_counter() - START:7.1f}s] {msg}", flush=True)


def write_json(path: Path | None, data: dict) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)


def meta(args: argparse.Namespace, device: torch.device) -> dict:
    import triton

    info = {"argv": sys.argv, "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda, "device": str(device), "interpret": INTERPRET,
            "host": platform.node()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(device_name=props.name, capability=list(torch.cuda.get_device_capability(device)),
                    sm_count=props.multi_processor_count, memory_gib=round(props.total_memory / 2**30, 1))
    import vllm

    tree = Path(vllm.__file__).resolve().parents[1]
    manifest = tree / "MANIFEST.json"
    info["kernel_tree"] = str(tree)
    if manifest.exists():
        m = json.loads(manifest.read_text())
        info["kernel_tree_vllm_version"] = m.get("vllm_version")
        info["kernel_tree_files"] = m.get("copied")
    try:
        info["git_head"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                                          text=True, timeout=10, check=False).stdout.strip() or None
    except OSError:
        info["git_head"] = None
    # The .git that travels with a working tree can be older than the files that ran, so
    # the code measured is identified by the SHA-256 of its own sources too.
    import hashlib
    sources = [Path(__file__), *sorted((ROOT / "vllm_admission" / "plugin" / "runner").glob("*.py")),
               ROOT / "vllm_admission" / "plugin" / "state_copy.py"]
    info["source_sha256"] = {str(f.relative_to(ROOT)): hashlib.sha256(f.read_bytes()).hexdigest()
                             for f in sources if f.exists()}
    return info


# -- Triton set-up ------------------------------------------------------------------
def ensure_packaging() -> str | None:
    """Three Mamba2 kernel files import ``packaging.version``; where ``packaging`` is missing,
    the copy the kernel tree carries (``<tree>/fallback``) goes at the end of ``sys.path``."""
    import importlib.util

    found = importlib.util.find_spec("packaging")
    if found is not None and found.origin is not None:         # a real package, not a bare folder
        return None                                            # (the repository has a packaging/)
    spec = importlib.util.find_spec("vllm")
    fallback = Path(spec.origin).resolve().parents[1] / "fallback" if spec and spec.origin else None
    if fallback is None or not (fallback / "packaging").is_dir():
        return None
    sys.path.append(str(fallback))
    return str(fallback)


def import_kernels() -> None:
    """Import the kernel modules (so that the autotune and interpreter patches see them) and
    check that they come from the kernel tree, not from an installed vLLM."""
    import importlib

    for name in (f"{FLA_OPS}.chunk", f"{FLA_OPS}.index", f"{MAMBA_OPS}.ssd_combined", f"{MAMBA_OPS}.ssd_checkpoint"):
        importlib.import_module(name)
    import vllm

    if not getattr(vllm, "KERNEL_TREE", False):
        log(f"note: vllm comes from {vllm.__file__}, not from the kernel tree")


def kernel_modules() -> list:
    return [m for n, m in sorted(sys.modules.items())
            if m is not None and n.startswith((FLA_OPS, MAMBA_OPS))]


def autotuners() -> dict[str, object]:
    """Every autotuned kernel in the kernel modules (unwrapping ``triton.heuristics``)."""
    from triton.runtime.autotuner import Autotuner

    found = {}
    for module in kernel_modules():
        for attr, value in vars(module).items():
            fn, depth = value, 0
            while fn is not None and not isinstance(fn, Autotuner) and depth < 4:
                fn, depth = getattr(fn, "fn", None), depth + 1
            if isinstance(fn, Autotuner):
                found[f"{module.__name__.rsplit('.', 1)[-1]}.{attr}"] = fn
    return found


def force_first_valid_config() -> None:
    """Each autotuned kernel runs the first of its configs that launches (no benchmarking),
    as vLLM's ``VLLM_TRITON_FORCE_FIRST_CONFIG`` does; kept per kernel once chosen."""
    from triton.runtime.autotuner import Autotuner

    errors: list[type] = []
    for module, name in (("triton.runtime.errors", "OutOfResources"), ("triton.runtime.errors", "PTXASError"),
                         ("triton.compiler.errors", "CompileTimeAssertionFailure")):
        with contextlib.suppress(ImportError, AttributeError):
            errors.append(getattr(__import__(module, fromlist=[name]), name))
    bad_config = tuple(errors)
    original = Autotuner.run
    if getattr(original, "_first_config", False):
        return
    full: dict[int, list] = {}

    def run(self, *args, **kwargs):
        configs = full.setdefault(id(self), list(self.configs))
        if not hasattr(self, "_all_configs"):
            self._all_configs = len(configs)
        if len(configs) <= 1:
            return original(self, *args, **kwargs)
        last = None
        for config in configs:
            self.configs = [config]
            try:
                result = original(self, *args, **kwargs)
            except bad_config as exc:
                last = exc
                continue
            full[id(self)] = [config]
            self.best_config = config
            return result
        self.configs = configs
        raise RuntimeError(f"no config of {len(configs)} launches") from last

    run._first_config = True
    Autotuner.run = run


def chosen_configs() -> dict[str, dict]:
    """Per autotuned kernel: how many configs it has, the config per tuned key (``full``) and
    the one its last launch used; kernels never launched are left out."""
    out = {}
    for name, tuner in autotuners().items():
        best = getattr(tuner, "best_config", None)
        if best is None:
            continue
        entry = {"configs": getattr(tuner, "_all_configs", len(tuner.configs)), "last_used": str(best)}
        cache = getattr(tuner, "cache", None) or {}
        if cache:
            entry["tuned"] = {str(k): str(v) for k, v in cache.items()}
        out[name] = entry
    return out


def interpreter_shims() -> None:
    """What Triton's interpreter needs to run these kernels on a CPU (found by running them,
    as ``tests/fla_interpreter.py`` and ``tests/ssd_store_interpreter.py`` describe); the kernel
    sources are not changed. Only under ``TRITON_INTERPRET=1``.

    * module-level aliases of Triton builtins (FLA's ``op.py``: ``exp = tl.exp``) are looked up
      on ``tl`` at call time, because the interpreter patches ``tl``'s attributes, not the aliases;
    * ``chunk_delta_h``'s loop variable must be a tensor (it calls ``.to`` on it);
    * ``tl.dot`` of bfloat16 blocks: the interpreter keeps bf16 as raw bits and multiplies those;
      they are widened to float32 first (exact);
    * masks that arrive as int32 are passed as bool to the masked loads and stores.
    """
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as interp

    for module in kernel_modules():
        for name, value in list(vars(module).items()):
            if not tl.core.is_builtin(value):
                continue
            for ns in (tl, tl.math):
                attr = next((a for a, v in vars(ns).items() if v is value), None)
                if attr is not None:
                    setattr(module, name, lambda *a, _ns=ns, _attr=attr, **k: getattr(_ns, _attr)(*a, **k))
                    break
    delta_h = sys.modules[f"{FLA_OPS}.chunk_delta_h"]
    delta_h.range = lambda *a: (interp._implicit_cvt(i) for i in builtins.range(*(int(x) for x in a)))

    builder = interp.InterpreterBuilder
    if getattr(builder.create_dot, "_widened", False):
        return
    dot, load, store = builder.create_dot, builder.create_masked_load, builder.create_masked_store

    def widen(x):
        if x.dtype != tl.bfloat16:
            return x
        return interp.TensorHandle((x.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    def as_bool(mask):
        return mask if mask.data.dtype == bool else interp.TensorHandle(mask.data != 0, mask.dtype)

    def create_dot(self, a, b, *rest):
        return dot(self, widen(a), widen(b), *rest)

    create_dot._widened = True
    builder.create_dot = create_dot
    builder.create_masked_load = lambda self, ptrs, mask, *a: load(self, ptrs, as_bool(mask), *a)
    builder.create_masked_store = lambda self, ptrs, value, mask, *a: store(self, ptrs, value, as_bool(mask), *a)


# -- helpers ------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cu_seqlens(lengths: list[int]) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def even_offsets(length: int, k: int, block: int) -> list[int]:
    """``k`` checkpoint offsets, multiples of ``block``, spread evenly inside ``(0, length)``."""
    slots = (length - 1) // block                   # multiples of block strictly inside
    if k > slots:
        raise ValueError(f"cannot place {k} checkpoints at multiples of {block} inside {length} tokens")
    return [round((j + 1) * (slots + 1) / (k + 1)) * block for j in range(k)]


def compare(got: torch.Tensor, ref: torch.Tensor) -> dict:
    """Max absolute and relative (to ``ref``'s largest magnitude) error, and bit identity."""
    g, r = got.detach().float().cpu(), ref.detach().float().cpu()
    err = (g - r).abs().max().item() if g.numel() else 0.0
    scale = r.abs().max().item() if r.numel() else 0.0
    return {"bit_identical": bool(got.dtype == ref.dtype and torch.equal(got.cpu(), ref.cpu())),
            "max_abs_err": err, "max_rel_err": err / scale if scale else err, "ref_absmax": scale,
            "shape": list(got.shape)}


def bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in bf16 steps between two bf16 tensors."""
    def ordered(t: torch.Tensor) -> torch.Tensor:
        bits = t.contiguous().view(torch.int16).to(torch.int32)
        mag = bits & 0x7FFF
        return torch.where(bits < 0, -mag, mag)

    return int((ordered(a.cpu()) - ordered(b.cpu())).abs().max().item()) if a.numel() else 0


def truncate_bf16(x: torch.Tensor) -> torch.Tensor:
    """float32 -> bfloat16 by dropping the low 16 bits (the interpreter's conversion)."""
    return (x.float().contiguous().view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)


def time_variants(variants: dict[str, Callable[[], object]], device: torch.device, *, repeats: int,
                  warmup: int) -> dict:
    """Median milliseconds per variant; variants interleaved, the order rotated every repeat."""
    names = list(variants)
    t0 = time.perf_counter()
    for _ in range(warmup):
        for name in names:
            variants[name]()
    sync(device)
    warm_s = time.perf_counter() - t0
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                sync(device)
                start.record()
                variants[name]()
                end.record()
                end.synchronize()
                samples[name].append(start.elapsed_time(end))
            else:
                t = time.perf_counter()
                variants[name]()
                samples[name].append((time.perf_counter() - t) * 1e3)
    return {"median_ms": {n: statistics.median(v) for n, v in samples.items()},
            "samples_ms": samples, "warmup_s": warm_s, "repeats": repeats}


def print_table(title: str, rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n{title}", flush=True)
    for r in [header, *rows]:
        print("  " + "  ".join(str(c).rjust(w) for c, w in zip(r, widths, strict=True)), flush=True)
    print(flush=True)


def overhead_rows(med: dict[str, float], names: list[str]) -> list[list[str]]:
    """Table rows: the baseline, then each named variant's median (ms), its ratio to the
    baseline and the time it adds."""
    base = med["baseline"]
    return [["baseline", f"{base:.3f}", "1.000", "-"],
            *([n, f"{med[n]:.3f}", f"{med[n] / base:.3f}", f"{med[n] - base:+.3f}"] for n in names)]


def inpass_split_summary(med: dict[str, float], k: int) -> dict[str, float]:
    """With ``k`` checkpoints per sequence: what in-pass and split each add to the baseline
    (ms) and their ratios to it."""
    base = med["baseline"]
    return {"inpass_overhead_ms": med[f"inpass_{k}"] - base, "split_overhead_ms": med[f"split_{k}"] - base,
            "inpass_ratio": med[f"inpass_{k}"] / base, "split_ratio": med[f"split_{k}"] / base}


def inpass_vs_split(variants: dict, ks: list[int], rows_by_k: dict, running: torch.Tensor, ssm: torch.Tensor,
                    device: torch.device, *, bf16_steps: bool) -> dict:
    """Run each in-pass and split variant once more from a zeroed cache and compare the SSM
    states they leave: per checkpoint (``j``-th of every sequence) and the final (running) rows.
    Split mode carries the state through the cache between rounds (rounded to its dtype),
    in-pass keeps the kernel's float32 state, so later checkpoints may differ by a rounding."""
    out = {}
    for k in ks:
        ssm.zero_()
        variants[f"inpass_{k}"]()
        sync(device)
        a = ssm.clone()
        ssm.zero_()
        variants[f"split_{k}"]()
        sync(device)
        b = ssm.clone()
        per = []
        for j in range(k):
            rows = [row[j] for row in rows_by_k[k]]
            c = compare(a[rows], b[rows])
            if bf16_steps:
                c["max_bf16_steps"] = bf16_ulps(a[rows], b[rows])
            per.append(c)
        final = compare(a[running], b[running])
        if bf16_steps:
            final["max_bf16_steps"] = bf16_ulps(a[running], b[running])
        out[k] = {"checkpoints": per, "final": final}
        log(f"  in-pass vs split, {k} checkpoints: max rel err per checkpoint "
            f"{' '.join(format(c['max_rel_err'], '.2e') for c in per)}, final {final['max_rel_err']:.2e}")
    return out


# -- Gated DeltaNet ------------------------------------------------------------------
def gdn_inputs(shape: GDNShape, lengths: list[int], device: torch.device, seed: int) -> dict:
    """Inputs of the chunk rule as vLLM's ``fused_post_conv_prep`` hands them over: q and k
    l2-normalised bf16, v bf16, g (log decay) and beta float32; plus the conv input."""
    gen = torch.Generator(device=device).manual_seed(seed)
    t = sum(lengths)

    def rnd(*s, dtype=torch.float32):
        return torch.randn(*s, generator=gen, device=device, dtype=torch.float32).to(dtype)

    bf = torch.bfloat16
    q = torch.nn.functional.normalize(rnd(1, t, shape.hk, shape.dk), dim=-1).to(bf)
    k = torch.nn.functional.normalize(rnd(1, t, shape.hk, shape.dk), dim=-1).to(bf)
    v = rnd(1, t, shape.hv, shape.dv, dtype=bf)
    g = torch.nn.functional.logsigmoid(rnd(1, t, shape.hv) + 3.0)
    beta = torch.sigmoid(rnd(1, t, shape.hv))
    x = rnd(t, shape.conv_dim, dtype=bf)
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta, "x": x}


def take_tokens(inp: dict, idx: torch.Tensor) -> dict:
    out = {n: inp[n][:, idx].contiguous() for n in ("q", "k", "v", "g", "beta")}
    out["x"] = inp["x"][idx].contiguous()
    return out


def gdn_check(args: argparse.Namespace, device: torch.device) -> dict:
    from vllm.third_party.flash_linear_attention.ops.chunk import chunk_gated_delta_rule

    from vllm_admission.plugin.runner import gdn_chunk_capture as cap

    shape = SMALL_GDN if args.small else QWEN3_NEXT
    if args.small:
        lengths, has_init, offsets = [256, 200], [False, True], [[64, 192], [128]]
    else:
        lengths, has_init = [1000, 700, 1300, 130], [False, True, True, False]
        offsets = [[64, 576], [192, 640], [576, 1152], []]
    n = len(lengths)
    inp = gdn_inputs(shape, lengths, device, args.seed)
    cu_host = cu_seqlens(lengths)
    cu = torch.tensor(cu_host, dtype=torch.int32, device=device)
    gen = torch.Generator(device=device).manual_seed(args.seed + 1)
    init = (torch.randn(n, shape.hv, shape.dv, shape.dk, generator=gen, device=device) * 0.1).to(torch.bfloat16)
    init[~torch.tensor(has_init, device=device)] = 0                      # as vLLM zeroes them
    qkvgb = [inp[k] for k in ("q", "k", "v", "g", "beta")]
    rule = {"cu_seqlens": cu, "output_final_state": True, "use_qk_l2norm_in_kernel": False}

    log("gdn_check: vLLM's chunk_gated_delta_rule and chunk_gated_delta_rule_with_states")
    o_vllm, final_vllm = chunk_gated_delta_rule(*qkvgb, initial_state=init.clone(), **rule)
    ours = cap.chunk_gated_delta_rule_with_states(*qkvgb, initial_state=init.clone(), **rule)
    sync(device)
    result: dict = {"shape": asdict(shape), "lengths": lengths, "has_initial_state": has_init,
                    "offsets": offsets, "o": compare(ours.o, o_vllm),
                    "final_state": compare(ours.final_state, final_vllm)}

    log("gdn_check: checkpoint rows from h against split mode (prefix runs)")
    rows = [[n + 1 + 8 * i + j for j in range(len(o))] for i, o in enumerate(offsets)]
    blocks = n + 1 + 8 * n
    plan = cap.plan_chunk_captures(cu_host, offsets, rows, conv_width=shape.width)
    ssm = torch.zeros(blocks, shape.hv, shape.dv, shape.dk, dtype=torch.bfloat16, device=device)
    conv_sd = torch.zeros(blocks, shape.width - 1, shape.conv_dim, dtype=torch.bfloat16, device=device)
    cap.write_chunk_checkpoints(plan, ours.h, inp["x"], ssm_state=ssm, conv_state=conv_sd, conv_state_dim_first=False)
    conv_ds = torch.zeros(blocks, shape.width - 1, shape.conv_dim, dtype=torch.bfloat16, device=device)
    ssm2 = torch.zeros_like(ssm)
    cap.write_chunk_checkpoints(plan, ours.h, inp["x"], ssm_state=ssm2, conv_state=conv_ds.transpose(1, 2),
                                conv_state_dim_first=True)

    # split mode: every checkpoint's prefix (sequence i's first p tokens) as its own sequence
    which = [(i, p) for i, offs in enumerate(offsets) for p in offs]
    idx = torch.cat([torch.arange(cu_host[i], cu_host[i] + p) for i, p in which]).to(device)
    pre = take_tokens(inp, idx)
    pre_cu = torch.tensor(cu_seqlens([p for _, p in which]), dtype=torch.int32, device=device)
    seq = torch.tensor([i for i, _ in which], device=device)
    _, final_prefix = chunk_gated_delta_rule(*[pre[k] for k in ("q", "k", "v", "g", "beta")],
                                             initial_state=init[seq].clone(), **{**rule, "cu_seqlens": pre_cu})
    sync(device)
    flat_rows = list(plan.rows)
    got = ssm[flat_rows]
    split_state = final_prefix.to(torch.bfloat16)                      # what split mode stores
    ckpt = compare(got, split_state)
    ckpt["max_bf16_steps"] = bf16_ulps(got, split_state)
    ckpt["h_written_exactly"] = bool(torch.equal(got, ours.h[0, list(plan.h_index)]))
    ckpt["other_rows_untouched"] = bool(ssm[[r for r in range(blocks) if r not in flat_rows]].abs().sum() == 0)
    ckpt["dim_first_layout_same_ssm"] = bool(torch.equal(ssm, ssm2))
    if INTERPRET:          # the interpreter truncates float32 -> bf16 where a GPU rounds to nearest
        ckpt["bit_identical_to_truncated_prefix"] = bool(torch.equal(got.cpu(), truncate_bf16(final_prefix).cpu()))
    result["checkpoint_ssm"] = ckpt
    history = torch.stack([inp["x"][end - shape.width + 1:end] for end in plan.token_end])  # [n, w-1, dim]
    result["checkpoint_conv"] = {"sd_layout_equal": bool(torch.equal(conv_sd[flat_rows], history)),
                                 "ds_layout_equal": bool(torch.equal(conv_ds[flat_rows], history))}
    result["passed"] = bool(
        result["o"]["bit_identical"] and result["final_state"]["bit_identical"]
        and ckpt["max_bf16_steps"] <= 1 and ckpt["h_written_exactly"] and ckpt["other_rows_untouched"]
        and ckpt["dim_first_layout_same_ssm"] and ckpt.get("bit_identical_to_truncated_prefix", True)
        and result["checkpoint_conv"]["sd_layout_equal"] and result["checkpoint_conv"]["ds_layout_equal"])
    return result


def gdn_time(args: argparse.Namespace, device: torch.device) -> dict:
    from vllm.third_party.flash_linear_attention.ops.chunk import chunk_gated_delta_rule
    from vllm.third_party.flash_linear_attention.ops.index import prepare_chunk_indices, prepare_chunk_offsets

    from vllm_admission.plugin.runner import gdn_chunk_capture as cap

    shape = SMALL_GDN if args.small else QWEN3_NEXT
    block = 64 if args.small else QWEN3_NEXT_BLOCK
    batches = [[256, 256]] if args.small else [[8192] * 4, [32768]]
    ks = [1, 3] if args.small else [1, 4]
    out: dict = {"shape": asdict(shape), "block": block, "checkpoints_per_sequence": ks, "ssm_dtype": "bfloat16",
                 "batches": []}
    for lengths in batches:
        label = f"{len(lengths)}x{lengths[0]}"
        log(f"gdn_time {label}: preparing")
        n = len(lengths)
        inp = gdn_inputs(shape, lengths, device, args.seed)
        x = inp["x"]
        num_ckpt = n * max(ks)
        blocks = n * (max(ks) + 2) + 1
        ssm = torch.zeros(blocks, shape.hv, shape.dv, shape.dk, dtype=torch.bfloat16, device=device)
        conv = torch.zeros(blocks, shape.width - 1, shape.conv_dim, dtype=torch.bfloat16, device=device)
        running = torch.arange(n, device=device)
        has_init = torch.zeros(n, dtype=torch.bool, device=device)   # fresh prompts, no prefix hit

        def meta_for(lens: list[int]):
            host = torch.tensor(cu_seqlens(lens), dtype=torch.int32)
            return (host.to(device), prepare_chunk_indices(host, cap.CHUNK_SIZE).to(device),
                    prepare_chunk_offsets(host, cap.CHUNK_SIZE).to(device))

        cu, ci, co = meta_for(lengths)
        qkvgb = [inp[k] for k in ("q", "k", "v", "g", "beta")]

        def baseline():
            init = ssm[running]
            init[~has_init] = 0                            # as vLLM does: rows without a prefix hit
            _, final = chunk_gated_delta_rule(*qkvgb, initial_state=init, output_final_state=True, cu_seqlens=cu,
                                              chunk_indices=ci, chunk_offsets=co, use_qk_l2norm_in_kernel=False)
            ssm[running] = final.to(ssm.dtype)

        def states_only():
            # in-pass without its checkpoint writes: what keeping h and calling vLLM's stages
            # one by one costs by itself
            init = ssm[running]
            init[~has_init] = 0
            res = cap.chunk_gated_delta_rule_with_states(*qkvgb, initial_state=init, cu_seqlens=cu,
                                                         chunk_indices=ci, chunk_offsets=co)
            ssm[running] = res.final_state.to(ssm.dtype)

        variants: dict[str, Callable[[], None]] = {"baseline": baseline, "states_only": states_only}
        rows_by_k = {}
        for k in ks:
            offs = [even_offsets(L, k, block) for L in lengths]
            rows = [[n + 1 + i * k + j for j in range(k)] for i in range(n)]
            rows_by_k[k] = rows
            plan = cap.plan_chunk_captures(cu_seqlens(lengths), offs, rows, conv_width=shape.width)

            def inpass(plan=plan):
                init = ssm[running]
                init[~has_init] = 0
                res = cap.chunk_gated_delta_rule_with_states(*qkvgb, initial_state=init, cu_seqlens=cu,
                                                             chunk_indices=ci, chunk_offsets=co)
                ssm[running] = res.final_state.to(ssm.dtype)
                cap.write_chunk_checkpoints(plan, res.h, x, ssm_state=ssm, conv_state=conv,
                                            conv_state_dim_first=False)

            # split mode: round r holds segment r of every sequence; it reads the state the
            # previous round left in its checkpoint block and writes its own end state into the
            # next one (align mode: the running state moves block to block between steps)
            starts = cu_seqlens(lengths)
            bounds = [[0, *o, L] for o, L in zip(offs, lengths, strict=True)]
            rounds = []
            for r in range(k + 1):
                seg = [(starts[i] + bounds[i][r], starts[i] + bounds[i][r + 1]) for i in range(n)]
                idx = torch.cat([torch.arange(a, b) for a, b in seg]).to(device)
                pieces = take_tokens(inp, idx)
                rcu, rci, rco = meta_for([b - a for a, b in seg])
                src = running if r == 0 else torch.tensor([rows[i][r - 1] for i in range(n)], device=device)
                dst = running if r == k else torch.tensor([rows[i][r] for i in range(n)], device=device)
                rounds.append(([pieces[c] for c in ("q", "k", "v", "g", "beta")], rcu, rci, rco, src, dst, r == 0))

            def split(rounds=rounds):
                for parts, rcu, rci, rco, src, dst, first in rounds:
                    init = ssm[src]
                    if first:
                        init[~has_init] = 0
                    _, final = chunk_gated_delta_rule(*parts, initial_state=init, output_final_state=True,
                                                      cu_seqlens=rcu, chunk_indices=rci, chunk_offsets=rco,
                                                      use_qk_l2norm_in_kernel=False)
                    ssm[dst] = final.to(ssm.dtype)

            variants[f"inpass_{k}"] = inpass
            variants[f"split_{k}"] = split
        log(f"gdn_time {label}: {len(variants)} variants, warmup {args.warmup}, repeats {args.repeats}")
        timing = time_variants(variants, device, repeats=args.repeats, warmup=args.warmup)
        med = timing["median_ms"]
        base = med["baseline"]
        so = med["states_only"]
        rows_out = overhead_rows(med, ["states_only", *(f"{kind}_{k}" for k in ks for kind in ("inpass", "split"))])
        summary = {"states_only_ratio": so / base,
                   **{k: {**inpass_split_summary(med, k), "checkpoint_write_ms": med[f"inpass_{k}"] - so}
                      for k in ks}}
        print_table(f"GDN one layer ({shape.hk}/{shape.hv} heads, {shape.dk}x{shape.dv}), batch {label} tokens, "
                    f"checkpoints at multiples of {block}", rows_out,
                    ["variant", "median ms", "x baseline", "overhead ms"])
        agree = inpass_vs_split(variants, ks, rows_by_k, running, ssm, device, bf16_steps=True)
        out["batches"].append({"lengths": lengths, "checkpoint_blocks": num_ckpt, **timing, "inpass_vs_split": agree,
                               "ratio_to_baseline": {n_: v / base for n_, v in med.items()}, "by_checkpoints": summary})
        del inp, x, ssm, conv, variants
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


# -- state copy -----------------------------------------------------------------------
def layer_states(num_blocks: int, conv_dim: int, width: int, ssm_shape: tuple[int, ...], ssm_dtype: torch.dtype,
                 device: torch.device, *, dim_first: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One layer's page buffer and its conv and SSM views (:func:`layer_views`)."""
    esize = torch.empty((), dtype=ssm_dtype).element_size()
    page = (width - 1) * conv_dim * 2 + math.prod(ssm_shape) * esize
    raw = torch.empty(num_blocks * page, dtype=torch.uint8, device=device)
    return raw, layer_views(raw, num_blocks, conv_dim, width, ssm_shape, ssm_dtype, dim_first)


def layer_views(raw: torch.Tensor, blocks: int, conv_dim: int, width: int, ssm_shape: tuple[int, ...],
                ssm_dtype: torch.dtype, dim_first: bool) -> list[torch.Tensor]:
    """The conv and SSM views of a page buffer, as vLLM lays a MambaSpec page out: per block
    the conv state stored ``[width - 1, dim]`` (read transposed with ``dim_first``), then the
    SSM state."""
    conv_bytes = (width - 1) * conv_dim * 2
    esize = torch.empty((), dtype=ssm_dtype).element_size()
    page = raw.numel() // blocks
    conv = torch.as_strided(raw.view(torch.bfloat16), (blocks, width - 1, conv_dim), (page // 2, conv_dim, 1))
    if dim_first:
        conv = conv.transpose(1, 2)
    inner = [math.prod(ssm_shape[i + 1:]) for i in range(len(ssm_shape))]
    ssm = torch.as_strided(raw[conv_bytes:].view(ssm_dtype), (blocks, *ssm_shape), (page // esize, *inner))
    return [conv, ssm]


def _pinless():
    """Under the interpreter (no GPU) ``pin_memory`` cannot work; the row copy's index upload
    is then a plain copy."""
    class Ctx:
        def __enter__(self):
            self.saved = torch.Tensor.pin_memory
            if not torch.cuda.is_available():
                torch.Tensor.pin_memory = lambda t, *a, **k: t
        def __exit__(self, *exc):
            torch.Tensor.pin_memory = self.saved
    return Ctx()


def triton_copier(tensors: list[torch.Tensor]):
    """The one-launch Triton row copy: ``StateRowCopier(backend="triton")`` on CUDA; under the
    interpreter on a CPU (where the public API picks torch) the same kernel object directly."""
    from vllm_admission.plugin import state_copy as sc

    if tensors[0].device.type == "cuda":
        return sc.StateRowCopier(tensors, backend="triton").copy
    launch = sc._TritonRowCopy(tensors)

    def copy(src, dst):
        with _pinless():
            launch(list(src), list(dst))
    return copy


def copy_check(args: argparse.Namespace, device: torch.device) -> dict:
    from vllm_admission.plugin.state_copy import copy_state_rows

    blocks, conv_dim, width = 16, 96 if args.small else 1536, 4
    ssm_shapes = [((2, 16, 16), torch.bfloat16), ((2, 16, 16), torch.float32), ((4, 8, 32), torch.bfloat16)]
    src, dst = [1, 4, 7, 2], [9, 3, 12, 15]
    result = {"blocks": blocks, "src": src, "dst": dst, "cases": {}}
    ok = True
    for dim_first in (False, True):
        raws, tensors = [], []
        for ssm_shape, dt in ssm_shapes:
            raw, views = layer_states(blocks, conv_dim, width, ssm_shape, dt, device, dim_first=dim_first)
            raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, device=device))
            raws.append(raw)
            tensors += views
        ref_raws = [r.clone() for r in raws]
        ref_views = []
        for (ssm_shape, dt), raw in zip(ssm_shapes, ref_raws, strict=True):
            ref_views += layer_views(raw, blocks, conv_dim, width, ssm_shape, dt, dim_first)
        s_t = torch.tensor(src, device=device)
        d_t = torch.tensor(dst, device=device)
        for t in ref_views:
            t.index_copy_(0, d_t, t.index_select(0, s_t))
        for how in ("triton", "copy_state_rows"):
            work = [r.clone() for r in raws]
            views = []
            for (ssm_shape, dt), raw in zip(ssm_shapes, work, strict=True):
                views += layer_views(raw, blocks, conv_dim, width, ssm_shape, dt, dim_first)
            if how == "triton":
                triton_copier(views)(src, dst)
            else:
                copy_state_rows(views, src, dst)          # auto: Triton on CUDA, row copies on CPU
            sync(device)
            equal = all(torch.equal(a, b) for a, b in zip(work, ref_raws, strict=True))
            changed = any(not torch.equal(a, b) for a, b in zip(work, raws, strict=True))
            result["cases"][f"{'ds' if dim_first else 'sd'}_{how}"] = {"equal_to_index_copy": equal,
                                                                         "rows_changed": changed}
            ok &= equal and changed
    result["passed"] = bool(ok)
    return result


def copy_time(args: argparse.Namespace, device: torch.device) -> dict:
    from vllm_admission.plugin.state_copy import StateRowCopier, copy_state_rows

    shape = SMALL_GDN if args.small else QWEN3_NEXT
    layers = 2 if args.small else QWEN3_NEXT_GDN_LAYERS
    blocks = 16 if args.small else 256
    pair_counts = [1, 4] if args.small else [1, 8, 64]
    ssm_shape = (shape.hv, shape.dv, shape.dk)
    tensors: list[torch.Tensor] = []
    for _ in range(layers):
        raw, views = layer_states(blocks, shape.conv_dim, shape.width, ssm_shape, torch.bfloat16, device,
                                  dim_first=True)
        raw.zero_()
        tensors += views
    row_bytes = sum(t[0].numel() * t.element_size() for t in tensors)
    log(f"copy_time: {layers} layers x (conv + SSM), {row_bytes / 2**20:.2f} MiB per block row, {blocks} blocks")
    triton_copy = triton_copier(tensors)
    torch_copier = StateRowCopier(tensors, backend="torch")
    out: dict = {"layers": layers, "blocks": blocks, "bytes_per_block_row": row_bytes,
                 "conv_shape": [shape.conv_dim, shape.width - 1], "ssm_shape": list(ssm_shape), "dtype": "bfloat16",
                 "by_pairs": {}}
    gen = torch.Generator().manual_seed(args.seed)
    table = []
    for n in pair_counts:
        perm = torch.randperm(blocks, generator=gen).tolist()
        src, dst = perm[:n], perm[n:2 * n]

        def index_copy_loop(src=src, dst=dst):
            s = torch.tensor(src, device=device)
            d = torch.tensor(dst, device=device)
            for t in tensors:
                t.index_copy_(0, d, t.index_select(0, s))

        variants = {"triton_copier": lambda src=src, dst=dst: triton_copy(src, dst),
                    "index_copy_loop": index_copy_loop,
                    "torch_backend": lambda src=src, dst=dst: torch_copier.copy(src, dst)}
        if device.type == "cuda":
            variants["copy_state_rows_unbound"] = lambda src=src, dst=dst: copy_state_rows(tensors, src, dst)
        timing = time_variants(variants, device, repeats=args.repeats, warmup=args.warmup)
        moved = 2 * n * row_bytes                                   # read + written
        gbps = {k: moved / (v * 1e-3) / 1e9 for k, v in timing["median_ms"].items()}
        out["by_pairs"][n] = {**timing, "bytes_moved": moved, "gb_per_s": gbps,
                              "speedup_vs_index_copy_loop": {k: timing["median_ms"]["index_copy_loop"] / v
                                                             for k, v in timing["median_ms"].items()}}
        for k, v in timing["median_ms"].items():
            table.append([str(n), k, f"{v:.3f}", f"{gbps[k]:.1f}"])
    print_table(f"State copy over {layers} GDN layers ({row_bytes / 2**20:.2f} MiB per block row)", table,
                ["pairs", "variant", "median ms", "GB/s"])
    return out


# -- Mamba2 -------------------------------------------------------------------------
def mamba_inputs(shape: Mamba2Shape, lengths: list[int], device: torch.device, seed: int) -> dict:
    gen = torch.Generator(device=device).manual_seed(seed)
    t = sum(lengths)

    def rnd(*s, dtype=torch.bfloat16):
        return torch.randn(*s, generator=gen, device=device, dtype=torch.float32).to(dtype)

    cpu = torch.Generator().manual_seed(seed)
    return {"x": rnd(t, shape.heads, shape.head_dim), "dt": rnd(t, shape.heads),
            "B": rnd(t, shape.groups, shape.state), "C": rnd(t, shape.groups, shape.state),
            "A": -torch.rand(shape.heads, generator=cpu).to(device) - 0.1,
            "D": torch.randn(shape.heads, generator=cpu).to(device),
            "dt_bias": torch.randn(shape.heads, generator=cpu).to(device),
            "xbc": rnd(t, shape.conv_dim)}                             # pre-conv input, [T, dim]


def mamba_layout_tensors(layout, device: torch.device) -> dict:
    return {"cu_chunk_seqlens": torch.tensor(layout.cu_chunk_seqlen, dtype=torch.int32, device=device),
            "seq_idx": torch.tensor(layout.seq_idx, dtype=torch.int32, device=device),
            "last_chunk_indices": torch.tensor(layout.last_chunk_indices, dtype=torch.int32, device=device)}


def mamba_scan(inp: dict, shape: Mamba2Shape, lengths: list[int], layout, device, *, init, intermediate: bool,
               state_dtype: torch.dtype, out: torch.Tensor | None = None, take: torch.Tensor | None = None):
    """vLLM's ``mamba_chunk_scan_combined_varlen`` as ``mamba_mixer2.py`` calls it for a prefill."""
    from vllm.model_executor.layers.mamba.ops.ssd_combined import mamba_chunk_scan_combined_varlen

    def part(t):
        return t if take is None else t.index_select(0, take).contiguous()

    x = part(inp["x"])
    out = torch.empty_like(x) if out is None else out
    qsl = torch.tensor(cu_seqlens(lengths), dtype=torch.int32, device=device)
    states = mamba_chunk_scan_combined_varlen(
        x, part(inp["dt"]), inp["A"], part(inp["B"]), part(inp["C"]), shape.chunk, cu_seqlens=qsl,
        out=out, D=inp["D"], z=None, dt_bias=inp["dt_bias"], initial_states=init, dt_softplus=True,
        dt_limit=(0.0, float("inf")), return_intermediate_states=intermediate, state_dtype=state_dtype,
        **mamba_layout_tensors(layout, device))
    return out, states


def mamba2_check(args: argparse.Namespace, device: torch.device) -> dict:
    from vllm_admission.plugin.runner.inpass_runner import _multi_checkpoint_metadata
    from vllm_admission.plugin.runner.mamba2_export import (
        checkpoint_chunk_layout,
        checkpoint_entries,
        store_checkpoints,
        store_checkpoints_triton,
    )

    shape = SMALL_MAMBA if args.small else NEMOTRON_NANO
    state_dtype = NEMOTRON_NANO_SSM_DTYPE
    if args.small:
        lengths, computed, has_init, offsets = [160, 200], [0, 40], [False, True], [[64], [48, 136]]
    else:
        lengths, computed, has_init = [700, 1500, 400], [0, 192, 64], [False, True, True]
        offsets = [[300], [320, 1000], []]
    n = len(lengths)
    inp = mamba_inputs(shape, lengths, device, args.seed)
    gen = torch.Generator(device=device).manual_seed(args.seed + 2)
    init = torch.randn(n, shape.heads, shape.head_dim, shape.state, generator=gen, device=device) * 0.1
    init[~torch.tensor(has_init, device=device)] = 0
    result: dict = {"shape": asdict(shape), "lengths": lengths, "computed": computed, "offsets": offsets,
                    "state_dtype": str(state_dtype)}

    log("mamba2_check: scan with a chunk end at every checkpoint, and the plain scan")
    layout = checkpoint_chunk_layout(shape.chunk, computed, lengths, offsets)
    out_ck, states = mamba_scan(inp, shape, lengths, layout, device, init=init, intermediate=True,
                                state_dtype=state_dtype)
    plain = checkpoint_chunk_layout(shape.chunk, computed, lengths, [[]] * n)
    out_plain, final_plain = mamba_scan(inp, shape, lengths, plain, device, init=init, intermediate=False,
                                        state_dtype=state_dtype)
    final_ck = states[list(layout.last_chunk_indices)]
    result["final_state_vs_plain_layout"] = compare(final_ck, final_plain)
    result["output_vs_plain_layout"] = compare(out_ck, out_plain)

    log("mamba2_check: split mode (a scan over each checkpoint's prefix alone)")
    which = [(i, p) for i, offs in enumerate(offsets) for p in offs]
    starts = cu_seqlens(lengths)
    idx = torch.cat([torch.arange(starts[i], starts[i] + p) for i, p in which]).to(device)
    pre_len = [p for _, p in which]
    pre_layout = checkpoint_chunk_layout(shape.chunk, [computed[i] for i, _ in which], pre_len, [[]] * len(which))
    seq = torch.tensor([i for i, _ in which], device=device)
    _, final_prefix = mamba_scan(inp, shape, pre_len, pre_layout, device, init=init[seq].contiguous(),
                                 intermediate=False, state_dtype=state_dtype, take=idx)
    ck_chunks = [c for row in layout.checkpoint_chunks for c in row]
    split = compare(states[ck_chunks], final_prefix)
    tol = 1e-3 * max(1.0, split["ref_absmax"])
    split["tolerance_abs"] = tol
    result["checkpoint_state_vs_split"] = split

    log("mamba2_check: vLLM's Triton store_prefill_checkpoint against the torch store")
    blocks = n + 2 + sum(len(o) for o in offsets) + 2
    dst_blocks = [[n + 2 + 2 * i + j for j in range(len(o))] for i, o in enumerate(offsets)]
    rows, offs, dst, chunks = checkpoint_entries(layout, offsets, dst_blocks)
    meta_cls = _multi_checkpoint_metadata()

    def meta_on(dev):
        return meta_cls(checkpoint_offsets=torch.tensor(offs, dtype=torch.int32, device=dev),
                        state_indices=torch.tensor(dst, dtype=torch.int64, device=dev), offsets=list(offs),
                        prefill_rows=list(rows))

    width1 = shape.width - 1
    x = inp["xbc"].t()                                              # [dim, T], as mamba_mixer2 passes it
    qsl = torch.tensor(starts, dtype=torch.int32, device=device)
    conv = torch.zeros(blocks, width1, shape.conv_dim, dtype=torch.bfloat16, device=device)   # "SD" storage
    ssm = torch.zeros(blocks, shape.heads, shape.head_dim, shape.state, dtype=state_dtype, device=device)
    conv_cpu, ssm_cpu = conv.cpu(), ssm.cpu()
    chunk_idx = torch.tensor(chunks, dtype=torch.int64)
    store_checkpoints_triton(meta_on(device), chunk_idx.to(device), x, conv.transpose(1, 2), states, ssm, qsl,
                             state_len=width1)
    store_checkpoints(meta_on("cpu"), chunk_idx, x.cpu(), conv_cpu.transpose(1, 2), states.cpu(), ssm_cpu, qsl.cpu(),
                      state_len=width1)
    sync(device)
    direct = all(torch.equal(conv[b].t(), x[:, starts[r] + o - width1:starts[r] + o]) and torch.equal(ssm[b], states[c])
                 for r, o, b, c in zip(rows, offs, dst, chunks, strict=True))
    untouched = [b for b in range(blocks) if b not in dst]
    result["store"] = {"entries": len(dst), "conv_equal_torch": bool(torch.equal(conv.cpu(), conv_cpu)),
                       "ssm_equal_torch": bool(torch.equal(ssm.cpu(), ssm_cpu)), "rows_as_expected": bool(direct),
                       "other_rows_untouched": bool(conv[untouched].abs().sum() == 0
                                                    and ssm[untouched].abs().sum() == 0)}
    st = result["store"]
    result["passed"] = bool(split["max_abs_err"] <= tol and st["conv_equal_torch"] and st["ssm_equal_torch"]
                            and st["rows_as_expected"] and st["other_rows_untouched"]
                            and result["final_state_vs_plain_layout"]["max_abs_err"]
                            <= 1e-3 * max(1.0, result["final_state_vs_plain_layout"]["ref_absmax"]))
    return result


def mamba2_time(args: argparse.Namespace, device: torch.device) -> dict:
    from vllm_admission.plugin.runner.inpass_runner import _multi_checkpoint_metadata
    from vllm_admission.plugin.runner.mamba2_export import (
        checkpoint_chunk_layout,
        checkpoint_entries,
        store_checkpoints_triton,
    )

    shape = SMALL_MAMBA if args.small else NEMOTRON_NANO
    state_dtype = NEMOTRON_NANO_SSM_DTYPE
    block = 48 if args.small else NEMOTRON_NANO_BLOCK
    batches = [[256, 256]] if args.small else [[8192] * 4, [32768]]
    ks = [1, 3]
    out: dict = {"shape": asdict(shape), "block": block, "checkpoints_per_sequence": ks,
                 "ssm_dtype": str(state_dtype), "batches": []}
    meta_cls = _multi_checkpoint_metadata()
    width1 = shape.width - 1
    for lengths in batches:
        label = f"{len(lengths)}x{lengths[0]}"
        log(f"mamba2_time {label}: preparing")
        n = len(lengths)
        inp = mamba_inputs(shape, lengths, device, args.seed)
        x = inp["xbc"].t()
        blocks = n * (max(ks) + 2) + 1
        ssm = torch.zeros(blocks, shape.heads, shape.head_dim, shape.state, dtype=state_dtype, device=device)
        conv = torch.zeros(blocks, width1, shape.conv_dim, dtype=torch.bfloat16, device=device).transpose(1, 2)
        running = torch.arange(n, device=device)
        has_init = torch.zeros(n, dtype=torch.bool, device=device)
        qsl = torch.tensor(cu_seqlens(lengths), dtype=torch.int32, device=device)
        y = torch.empty_like(inp["x"])
        zeros = [0] * n
        plain = mamba_layout_tensors(checkpoint_chunk_layout(shape.chunk, zeros, lengths, [[]] * n), device)

        def scan(layout_t, *, init, intermediate, parts=None, lens_qsl=qsl, y=y):
            from vllm.model_executor.layers.mamba.ops.ssd_combined import mamba_chunk_scan_combined_varlen

            p = parts or inp
            return mamba_chunk_scan_combined_varlen(
                p["x"], p["dt"], inp["A"], p["B"], p["C"], shape.chunk, cu_seqlens=lens_qsl, out=y, D=inp["D"],
                z=None, dt_bias=inp["dt_bias"], initial_states=init, dt_softplus=True, dt_limit=(0.0, float("inf")),
                return_intermediate_states=intermediate, state_dtype=state_dtype, **layout_t)

        def initial(src, mask):
            return torch.where(mask[:, None, None, None], ssm[src], 0)

        def baseline():
            final = scan(plain, init=initial(running, has_init), intermediate=False)
            ssm[running] = final

        variants: dict[str, Callable[[], None]] = {"baseline": baseline}
        rows_by_k = {}
        for k in ks:
            offs = [even_offsets(L, k, block) for L in lengths]
            dst_blocks = [[n + 1 + i * k + j for j in range(k)] for i in range(n)]
            rows_by_k[k] = dst_blocks
            layout = checkpoint_chunk_layout(shape.chunk, zeros, lengths, offs)
            lt = mamba_layout_tensors(layout, device)
            rows, eoffs, dst, chunks = checkpoint_entries(layout, offs, dst_blocks)
            ck_meta = meta_cls(checkpoint_offsets=torch.tensor(eoffs, dtype=torch.int32, device=device),
                            state_indices=torch.tensor(dst, dtype=torch.int64, device=device), offsets=list(eoffs),
                            prefill_rows=list(rows))
            chunk_idx = torch.tensor(chunks, dtype=torch.int64, device=device)
            last = lt["last_chunk_indices"]

            def inpass(lt=lt, ck_meta=ck_meta, chunk_idx=chunk_idx, last=last):
                states = scan(lt, init=initial(running, has_init), intermediate=True)
                store_checkpoints_triton(ck_meta, chunk_idx, x, conv, states, ssm, qsl, state_len=width1)
                ssm[running] = states[last]

            def scan_only(lt=lt, last=last):
                # in-pass without its checkpoint store: the chunk layout with an end at every
                # checkpoint, and the chunk states returned
                states = scan(lt, init=initial(running, has_init), intermediate=True)
                ssm[running] = states[last]

            starts = cu_seqlens(lengths)
            bounds = [[0, *o, L] for o, L in zip(offs, lengths, strict=True)]
            rounds = []
            for r in range(k + 1):
                seg = [(starts[i] + bounds[i][r], starts[i] + bounds[i][r + 1]) for i in range(n)]
                seg_len = [b - a for a, b in seg]
                idx = torch.cat([torch.arange(a, b) for a, b in seg]).to(device)
                parts = {c: inp[c].index_select(0, idx).contiguous() for c in ("x", "dt", "B", "C")}
                rl = mamba_layout_tensors(checkpoint_chunk_layout(
                    shape.chunk, [bounds[i][r] for i in range(n)], seg_len, [[]] * n), device)
                src = running if r == 0 else torch.tensor([dst_blocks[i][r - 1] for i in range(n)], device=device)
                dst_r = running if r == k else torch.tensor([dst_blocks[i][r] for i in range(n)], device=device)
                mask = has_init if r == 0 else torch.ones(n, dtype=torch.bool, device=device)
                rq = torch.tensor(cu_seqlens(seg_len), dtype=torch.int32, device=device)
                rounds.append((parts, rl, src, dst_r, mask, rq, torch.empty_like(parts["x"])))

            def split(rounds=rounds):
                for parts, rl, src, dst_r, mask, rq, ry in rounds:
                    final = scan(rl, init=initial(src, mask), intermediate=False, parts=parts, lens_qsl=rq, y=ry)
                    ssm[dst_r] = final

            variants[f"inpass_{k}"] = inpass
            variants[f"scan_only_{k}"] = scan_only
            variants[f"split_{k}"] = split
        log(f"mamba2_time {label}: {len(variants)} variants, warmup {args.warmup}, repeats {args.repeats}")
        timing = time_variants(variants, device, repeats=args.repeats, warmup=args.warmup)
        med = timing["median_ms"]
        base = med["baseline"]
        table = overhead_rows(med, [f"{kind}_{k}" for k in ks for kind in ("scan_only", "inpass", "split")])
        summary = {k: {**inpass_split_summary(med, k), "store_ms": med[f"inpass_{k}"] - med[f"scan_only_{k}"]}
                   for k in ks}
        print_table(f"Mamba2 one layer SSD scan ({shape.heads} heads x {shape.head_dim}, state {shape.state}, "
                    f"chunk {shape.chunk}), batch {label}, checkpoints at multiples of {block}", table,
                    ["variant", "median ms", "x baseline", "overhead ms"])
        agree = inpass_vs_split(variants, ks, rows_by_k, running, ssm, device, bf16_steps=False)
        out["batches"].append({"lengths": lengths, **timing, "inpass_vs_split": agree,
                               "ratio_to_baseline": {n_: v / base for n_, v in med.items()}, "by_checkpoints": summary})
        del inp, x, ssm, conv, variants, y
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


# -- main ---------------------------------------------------------------------------
def key_figures(result: dict) -> str:
    """The figures of a check worth a log line (the JSON has them all)."""
    out = []
    items = list(result.items())
    for name, value in list(items):
        if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            items += [(f"{name}.{k}", v) for k, v in value.items()]      # one level down (copy_check)
    for name, value in items:
        if not isinstance(value, dict):
            continue
        picked = {k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in value.items()
                  if k in ("bit_identical", "max_rel_err", "max_bf16_steps", "max_abs_err", "tolerance_abs")
                  or (isinstance(v, bool) and k not in ("bit_identical",))}
        if picked:
            out.append(f"{name} {picked}")
    return "; ".join(out)


PARTS: dict[str, tuple[str, Callable]] = {
    "gdn_check": ("correctness", gdn_check),
    "copy_check": ("correctness", copy_check),
    "mamba2_check": ("correctness", mamba2_check),
    "gdn_time": ("timing", gdn_time),
    "mamba2_time": ("timing", mamba2_time),
    "copy_time": ("timing", copy_time),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="write every figure here (rewritten after each part)")
    ap.add_argument("--small", action="store_true", help="tiny shapes and one repeat (for TRITON_INTERPRET=1 on a CPU)")
    ap.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    ap.add_argument("--repeats", type=int, help="timed repeats per variant (default 15; 1 with --small)")
    ap.add_argument("--warmup", type=int, help="untimed runs per variant first (default 2; 0 with --small)")
    ap.add_argument("--autotune", choices=["first", "full"], default="first",
                    help="first: each autotuned kernel runs its first valid config (default); full: tune as vLLM "
                         "does (several more minutes of compilation)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.small else 15
    if args.warmup is None:
        args.warmup = 0 if args.small else 2

    if torch.cuda.is_available() and not INTERPRET:
        device = torch.device("cuda", torch.cuda.current_device())
    elif INTERPRET:
        device = torch.device("cpu")
    else:
        print("no CUDA device: run on a GPU, or with TRITON_INTERPRET=1 (and --small) on a CPU", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    data: dict = {"meta": {"argv": sys.argv, "torch": torch.__version__, "device": str(device)},
                  "models": MODELS, "autotune": "first" if INTERPRET else args.autotune,
                  "correctness": {}, "timing": {}, "errors": {}, "part_seconds": {}, "part_peak_gib": {}}
    try:
        packaging_fallback = ensure_packaging()
        import_kernels()
        if args.autotune == "first" or INTERPRET:
            force_first_valid_config()
        if INTERPRET:
            interpreter_shims()
        data["meta"] = {**meta(args, device), "packaging_fallback": packaging_fallback}
    except Exception as exc:  # noqa: BLE001 - nothing can run; say why in the JSON too
        traceback.print_exc()
        data["errors"]["setup"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        write_json(args.json, data)
        return 1
    log(f"device {data['meta'].get('device_name', device)}, torch {torch.__version__}, "
        f"triton {data['meta']['triton']}, autotune {data['autotune']}, parts {' '.join(args.parts)}")
    write_json(args.json, data)
    for name in args.parts:
        section, fn = PARTS[name]
        log(f"== {name}")
        t0 = time.perf_counter()
        try:
            with torch.inference_mode():
                data[section][name] = fn(args, device)
            if section == "correctness":
                log(f"{name}: {'PASS' if data[section][name]['passed'] else 'FAIL'} {key_figures(data[section][name])}")
        except Exception as exc:  # noqa: BLE001 - a failing part is recorded, the others still run
            traceback.print_exc()
            sys.stderr.flush()
            data["errors"][name] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
            log(f"{name}: ERROR {type(exc).__name__}: {exc}")
        data["part_seconds"][name] = round(time.perf_counter() - t0, 2)
        if device.type == "cuda":
            data["part_peak_gib"][name] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
            torch.cuda.reset_peak_memory_stats(device)
            torch.cuda.empty_cache()
        data["kernel_configs"] = chosen_configs()
        write_json(args.json, data)
    checks = {k: v.get("passed") for k, v in data["correctness"].items()}
    data["summary"] = {"checks": checks, "all_checks_passed": bool(checks) and all(checks.values()),
                       "errors": sorted(data["errors"]), "total_seconds": round(time.perf_counter() - START, 1)}
    write_json(args.json, data)
    log(f"done: checks {checks}, errors {sorted(data['errors']) or 'none'}")
    ok = not data["errors"] and all(checks.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
