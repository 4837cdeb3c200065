"""CPU cost of capturing GDN states inside the pass (``plugin/runner/gdn_capture.py``).

One prefill of ``--seqs`` sequences x ``--tokens`` tokens through one GDN layer with the tiny
model's shapes (``out/tiny-model/config.json``), single pass (no checkpoint: one round, the
same kernel calls as vLLM's CPU path) against the segmented run with 1 and 3 checkpoints per
sequence (evenly spaced, block-aligned). The variants are interleaved in each repeat; the
medians and their ratios to the single pass are printed (and written as JSON with ``--json``).

    PYTHONPATH=. python benchmarks/gdn_capture_bench.py [--seqs 4] [--tokens 2048] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from vllm_admission.plugin.runner.gdn_capture import (
    GDNCoreParams,
    gdn_ops_available,
    gdn_prefill_with_capture,
)
from vllm_admission.plugin.state_copy import StateRowCopier

CONFIG = Path(__file__).resolve().parents[1] / "out" / "tiny-model" / "config.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--block", type=int, default=128, help="checkpoint offsets are multiples of this")
    ap.add_argument("--checkpoints", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if not gdn_ops_available():
        print("vLLM's CPU GDN kernels are not available", file=sys.stderr)
        return 1

    cfg = json.loads(CONFIG.read_text())
    hk, dk = cfg["linear_num_key_heads"], cfg["linear_key_head_dim"]
    hv, dv = cfg["linear_num_value_heads"], cfg["linear_value_head_dim"]
    width = cfg["linear_conv_kernel_dim"]
    conv_dim = 2 * hk * dk + hv * dv
    bf = torch.bfloat16
    params = GDNCoreParams(A_log=torch.randn(hv) * 0.5, dt_bias=(torch.randn(hv) * 0.5).to(bf),
                           conv_weight=(torch.randn(conv_dim, 1, width) * 0.5).to(bf),
                           conv_bias=(torch.randn(conv_dim) * 0.1).to(bf), activation="silu",
                           num_k_heads=hk, num_v_heads=hv, head_k_dim=dk, head_v_dim=dv)
    n, L = args.seqs, args.tokens
    total = n * L
    mixed_qkv = torch.randn(total, conv_dim).to(bf)
    a = torch.randn(total, hv).to(bf)
    b = torch.randn(total, hv).to(bf)
    num_blocks = n * (1 + max(args.checkpoints)) + 1
    conv = torch.zeros(num_blocks, width - 1, conv_dim, dtype=bf)
    ssm = torch.zeros(num_blocks, hv, dv, dk, dtype=bf)
    copier = StateRowCopier([conv, ssm])
    qsl = torch.arange(0, total + 1, L, dtype=torch.int32)
    rows = list(range(n))

    def plan(k: int):
        # k evenly spaced block-aligned offsets strictly inside each chunk.
        offs = sorted({max(args.block, (L * (j + 1) // (k + 1)) // args.block * args.block)
                       for j in range(k)})
        if len(offs) != k or offs[-1] >= L:
            raise SystemExit(f"cannot place {k} checkpoints in {L} tokens at block {args.block}")
        dst = [[n + i * k + j for j in range(k)] for i in range(n)]
        return [offs] * n, dst

    variants = {0: ([[]] * n, [[]] * n), **{k: plan(k) for k in args.checkpoints}}
    times: dict[int, list[float]] = {k: [] for k in variants}

    def run(k: int) -> float:
        offs, dst = variants[k]
        t0 = time.perf_counter()
        gdn_prefill_with_capture(params, mixed_qkv, a, b, conv_state=conv, ssm_state=ssm,
                                 query_start_loc=qsl, state_indices=rows, has_initial_state=[False] * n,
                                 checkpoint_offsets=offs, checkpoint_rows=dst, copier=copier)
        return time.perf_counter() - t0

    for k in variants:          # warm-up
        run(k)
    for _ in range(args.repeats):
        for k in variants:
            times[k].append(run(k))

    base = statistics.median(times[0])
    result = {"seqs": n, "tokens_per_seq": L, "block": args.block, "repeats": args.repeats,
              "threads": torch.get_num_threads(), "offsets": {k: variants[k][0][0] for k in variants},
              "median_s": {k: statistics.median(v) for k, v in times.items()},
              "ratio_to_single": {k: statistics.median(v) / base for k, v in times.items()},
              # Each repeat runs every variant back to back: the median of those ratios
              # is steadier than the ratio of medians on a shared machine.
              "paired_ratio": {k: statistics.median(x / y for x, y in zip(v, times[0], strict=True))
                               for k, v in times.items()},
              "all_s": times}
    print(f"{n} sequences x {L} tokens, {args.repeats} repeats, {torch.get_num_threads()} threads")
    for k in variants:
        print(f"  {k} checkpoints/seq (offsets {variants[k][0][0]}): median "
              f"{result['median_s'][k] * 1e3:8.1f} ms  x{result['ratio_to_single'][k]:.3f} "
              f"(paired x{result['paired_ratio'][k]:.3f})  "
              f"(min {min(times[k]) * 1e3:.1f}, max {max(times[k]) * 1e3:.1f})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
