"""The simulator's prediction for the in-pass checkpoint mode (docs/checkpoints.md).

For each workload and admission policy, one simulator run in ``split`` checkpoint mode (vLLM
0.32: a prefill chunk ends at every checkpoint) and one in ``inpass`` mode (the states are
captured inside the forward pass; chunks end at the token budget only), at one capacity,
with ``lru`` eviction. Records per run the prefill steps per request (the chunks the core
model cuts; engine steps with prompt tokens when requests run one at a time), the token and
request hit rates, the state checkpoints kept and the evictions.

Workloads: ``synthetic`` (the built-in synthetic workload, default parameters) and
``mooncake`` (the Mooncake conversation trace, 512 tokens per hash id, as the trace gives it).

Usage: ``python simulations/inpass_steps.py [--capacity 128GiB] [--model qwen3-next-80b-a3b]
[--admission vllm,last] [--max-requests K] [--out docs/results/inpass]``. Writes
``<out>/inpass-steps.json`` and prints a markdown table. No engine; a few minutes in all.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vllm_admission.core.cache import CHECKPOINT_MODES  # noqa: E402
from vllm_admission.core.costs import load_model  # noqa: E402
from vllm_admission.core.geometry import parse_bytes  # noqa: E402
from vllm_admission.core.traces import load_trace  # noqa: E402
from vllm_admission.sim.simulator import DEFAULT_CHUNK_SIZE, SimulationSettings, simulate  # noqa: E402

MOONCAKE = ROOT.parent / "shared/traces/mooncake/conversation_trace.jsonl"
WORKLOADS = {"synthetic": "synthetic", "mooncake": str(MOONCAKE)}
FIELDS = ("requests", "prompt_tokens", "hit_tokens", "token_hit_rate", "request_hit_rate",
          "prefill_steps", "state_checkpoints", "evictions", "block_size", "num_blocks")


def run(args: argparse.Namespace) -> dict:
    costs = load_model(args.model)
    capacity = parse_bytes(args.capacity)
    rows = []
    for name, source in WORKLOADS.items():
        trace = load_trace(source, max_requests=args.max_requests)
        for admission in args.admission.split(","):
            for mode in CHECKPOINT_MODES:
                res = simulate(trace, costs, SimulationSettings.of(admission, "lru",
                                                                capacity_bytes=capacity, chunk_size=args.chunk_size,
                                                                checkpoint=mode)).to_record()
                row = {"workload": name, "admission": admission, "eviction": "lru",
                       "checkpoint": mode, **{k: res[k] for k in FIELDS}}
                row["steps_per_request"] = row["prefill_steps"] / row["requests"]
                rows.append(row)
                print(f"{name} {admission} {mode}: {row['steps_per_request']:.3f} steps/request, "
                      f"hit rate {100 * row['token_hit_rate']:.2f}%", flush=True)
    return {"model": costs.name, "capacity": args.capacity, "chunk_size": args.chunk_size,
            "max_requests": args.max_requests, "runs": rows}


def table(doc: dict) -> str:
    out = ["| workload | admission | requests | prefill steps per request, split / inpass | "
           "token hit rate, split / inpass | request hit rate, split / inpass | "
           "states kept, split / inpass |",
           "|---|---|---|---|---|---|---|"]
    runs = {(r["workload"], r["admission"], r["checkpoint"]): r for r in doc["runs"]}
    for (w, a, m), s in runs.items():
        if m != "split":
            continue
        i = runs[(w, a, "inpass")]
        out.append(f"| {w} | {a}+lru | {s['requests']:,} | {s['steps_per_request']:.3f} / "
                   f"{i['steps_per_request']:.3f} | {100 * s['token_hit_rate']:.2f}% / "
                   f"{100 * i['token_hit_rate']:.2f}% | {100 * s['request_hit_rate']:.1f}% / "
                   f"{100 * i['request_hit_rate']:.1f}% | {s['state_checkpoints']:,} / "
                   f"{i['state_checkpoints']:,} |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-next-80b-a3b")
    p.add_argument("--capacity", default="128GiB")
    p.add_argument("--admission", default="vllm,last")
    p.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE)
    p.add_argument("--max-requests", type=int, default=None)
    p.add_argument("--out", default=str(ROOT / "docs/results/inpass"))
    p.add_argument("--table", action="store_true", help="reprint the table of <out>/inpass-steps.json")
    args = p.parse_args()
    path = Path(args.out) / "inpass-steps.json"
    if args.table:
        print(table(json.loads(path.read_text())))
        return 0
    doc = run(args)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(table(doc))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
