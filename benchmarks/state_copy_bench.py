"""The in-pass checkpoint copy op (``vllm_admission/plugin/state_copy.py``): time per call.

One step's copies for ``K`` requests that reach a checkpoint: every Gated
DeltaNet layer's conv-state and SSM-state row of the working block to the
checkpoint block. Shapes are Qwen3-Next-80B-A3B's (``core/model_configs``:
36 GDN layers of 48; conv state ``[8192, 3]`` bf16, SSM state ``[32, 128, 128]``
float32: 2.05 MiB per layer and block, 73.7 MiB per request), laid out as vLLM
lays them (views into one raw page buffer per layer, conv transposed).

The copier is bound to the tensors once, as a model runner binds it. Backends compared in one
run: ``torch`` (row copies on CPU, a gather and a scatter per tensor on CUDA) and, on CUDA,
``triton`` (one launch for all tensors and pairs). Reports the median time per call and the
bandwidth (bytes read + written). On CPU the layer count is cut (``--layers``) so that the pool
fits in memory.

    python benchmarks/state_copy_bench.py [--layers 36] [--k 1 8 32] [--out results/state_copy.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vllm_admission.plugin.state_copy import StateRowCopier  # noqa: E402

HERE = Path(__file__).resolve().parent
CONV_DIM, KERNEL = 8192, 4           # 2 * 16 key heads * 128 + 32 value heads * 128
HEADS, HEAD_V, HEAD_K = 32, 128, 128


def layer_states(num_blocks: int, device: str) -> list[torch.Tensor]:
    """One layer's conv and SSM state views into a shared page buffer."""
    conv_bytes = CONV_DIM * (KERNEL - 1) * 2
    ssm_bytes = HEADS * HEAD_V * HEAD_K * 4
    page = conv_bytes + ssm_bytes
    raw = torch.zeros(num_blocks * page, dtype=torch.int8, device=device)
    conv = torch.as_strided(raw.view(torch.bfloat16), (num_blocks, KERNEL - 1, CONV_DIM),
                            (page // 2, CONV_DIM, 1)).transpose(1, 2)
    ssm = torch.as_strided(raw[conv_bytes:].view(torch.float32), (num_blocks, HEADS, HEAD_V, HEAD_K),
                           (page // 4, HEAD_V * HEAD_K, HEAD_K, 1))
    return [conv, ssm]


def time_call(fn, device: str, reps: int) -> float:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=None,
                    help="GDN layers (default: 36 on CUDA, 4 on CPU)")
    ap.add_argument("--k", type=int, nargs="+", default=[1, 8, 32], help="checkpoints per step")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "state_copy.json")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    layers = args.layers or (36 if device == "cuda" else 4)
    num_blocks = 2 * max(args.k) + 1
    tensors = [t for _ in range(layers) for t in layer_states(num_blocks, device)]
    row_bytes = sum(t[0].numel() * t.element_size() for t in tensors)
    backends = ["torch", "triton"] if device == "cuda" else ["torch"]
    rows = []
    print(f"device {device} ({torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}), "
          f"{layers} GDN layers, {row_bytes / 2**20:.1f} MiB of state per request")
    for k in args.k:
        src, dst = list(range(k)), list(range(k, 2 * k))
        for backend in backends:
            copier = StateRowCopier(tensors, backend=backend)   # bound once, as a runner does
            t = time_call(lambda c=copier, s=src, d=dst: c.copy(s, d), device, args.reps)
            gbps = 2 * k * row_bytes / t / 1e9
            rows.append({"device": device, "layers": layers, "checkpoints": k, "backend": backend,
                         "ms": round(t * 1e3, 4), "GB_per_s": round(gbps, 1)})
            print(f"  K={k:3d} {backend:6s} {t * 1e3:9.3f} ms  {gbps:8.1f} GB/s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
