"""How far every policy is from the best possible: the pool bound beside the policies.

For the Mooncake conversation trace with Qwen3-Next-80B-A3B and Nemotron-3-Nano-30B-A3B at
64, 128 and 256 GiB: the token hit rate of stock vLLM (``vllm`` + ``lru``), of fixed pairs,
of ``auto`` + ``auto``, of the offline pairs with Bélády's eviction (``belady``: the next
use known), the infinite-capacity bound, and :func:`~vllm_admission.core.bounds.pool_bound`,
an upper bound on any admission and eviction policy in that pool (its derivation is the
module's docstring). Writes ``docs/results/headroom/headroom.json`` and prints the table
``docs/results.md`` quotes.

Run: ``python simulations/headroom.py --jobs 2`` (about 10 minutes on 2 cores, most of it
``auto``). Deterministic but for wall times.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vllm_admission.core.costs import load_model
from vllm_admission.core.geometry import parse_bytes
from vllm_admission.core.traces import load_trace
from vllm_admission.sim.simulation_settings import SimulationSettings
from vllm_admission.sim.simulator import cache_layout, cache_requests, pool_bound_of
from vllm_admission.sim.sweep import SweepSpec, run_sweep

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
MOONCAKE = SHARED / "traces" / "mooncake" / "conversation_trace.jsonl"
MODELS = {
    "Qwen3-Next": "qwen3-next-80b-a3b",
    "Nemotron-3-Nano": str(SHARED / "model_configs" / "nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json"),
}
CAPACITIES = ("64GiB", "128GiB", "256GiB")
PAIRS = (("vllm", "lru"), ("last", "lru"), ("marconi", "flop"), ("dense", "lru"),
         ("vllm", "reuse"), ("auto", "auto"), ("vllm", "belady"), ("marconi", "belady"),
         ("last", "belady"), ("dense", "belady"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "headroom" / "headroom.json"))
    args = ap.parse_args(argv)
    if not MOONCAKE.exists():
        print(f"mooncake trace not found at {MOONCAKE}", file=sys.stderr)
        return 2
    trace = load_trace(str(MOONCAKE))
    rows = []
    for label, model in MODELS.items():
        costs = load_model(model)
        spec = SweepSpec(trace=str(MOONCAKE), model=model,
                         capacities=tuple(parse_bytes(c) for c in CAPACITIES),
                         admissions=(), evictions=(), pairs=PAIRS, chunk_size=8192)
        doc = run_sweep(spec, jobs=args.jobs, progress=False)
        for cap in CAPACITIES:
            nbytes = parse_bytes(cap)
            _, layout = cache_layout(costs, SimulationSettings.of("vllm", "lru",
                                                               capacity_bytes=nbytes))
            bound = pool_bound_of(cache_requests(trace, layout.pool.block_size), layout)
            runs = {f"{r['admission']}+{r['eviction']}": r["token_hit_rate"]
                    for r in doc["runs"] if r["capacity_bytes"] == nbytes}
            rows.append({"model": label, "capacity": cap, "num_blocks": layout.pool.num_blocks,
                         "block_size": layout.pool.block_size, "runs": runs,
                         "pool_bound": bound.token_hit_rate,
                         "infinite_bound": bound.infinite_hit_tokens / bound.prompt_tokens})
            print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"trace": "mooncake/conversation_trace.jsonl", "rows": rows},
                              indent=2) + "\n")
    online = [f"{a}+{e}" for a, e in PAIRS if e != "belady"]
    offline = [f"{a}+{e}" for a, e in PAIRS if e == "belady"]
    print("| model | capacity | " + " | ".join(online + offline)
          + " | pool bound | infinite-capacity bound |")
    print("|" + "---|" * (4 + len(PAIRS)))
    for row in rows:
        cells = [f"{100 * row['runs'][p]:.2f}" for p in online + offline]
        print(f"| {row['model']} | {row['capacity']} | " + " | ".join(cells)
              + f" | {100 * row['pool_bound']:.2f} | {100 * row['infinite_bound']:.2f} |")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
