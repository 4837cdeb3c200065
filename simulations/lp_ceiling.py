"""The ceiling of the headroom table (results section 8): the optimum of the pool bound's
linear programme, solved with HiGHS (:func:`~vllm_admission.core.bounds.lp_bound`), beside
the pool bound's subgradient value, on the Mooncake conversation trace.

Writes ``docs/results/headroom/lp.json`` and prints the table ``docs/results.md`` section 8
quotes. Run: ``python simulations/lp_ceiling.py`` (about 3 minutes and 3 GB on one core
with the default window of 10 slots per capacity row). Deterministic but for wall times.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from headroom import MODELS, MOONCAKE, ROOT  # the headroom study's trace and models (results 8)

from vllm_admission.core.costs import load_model
from vllm_admission.core.geometry import parse_bytes
from vllm_admission.core.traces import load_trace
from vllm_admission.sim.simulation_settings import SimulationSettings
from vllm_admission.sim.simulator import cache_layout, cache_requests, lp_bound_of, pool_bound_of

CELLS = (("Qwen3-Next", "64GiB"), ("Qwen3-Next", "128GiB"), ("Qwen3-Next", "256GiB"),
         ("Nemotron-3-Nano", "64GiB"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=int, default=10, help="service slots per capacity row")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "headroom" / "lp.json"))
    args = ap.parse_args(argv)
    if not MOONCAKE.exists():
        print(f"mooncake trace not found at {MOONCAKE}", file=sys.stderr)
        return 2
    trace = load_trace(str(MOONCAKE))
    rows = []
    for label, cap in CELLS:
        costs = load_model(MODELS[label])
        _, layout = cache_layout(costs, SimulationSettings.of("vllm", "lru",
                                                           capacity_bytes=parse_bytes(cap)))
        reqs = cache_requests(trace, layout.pool.block_size)
        pool = pool_bound_of(reqs, layout)
        t0 = time.perf_counter()
        lp = lp_bound_of(reqs, layout, window=args.window)
        rows.append({"model": label, "capacity": cap, "window": args.window,
                     "lp_bound": lp.token_hit_rate, "pool_bound": pool.token_hit_rate,
                     "infinite_bound": lp.infinite_hit_tokens / lp.prompt_tokens,
                     "variables": lp.variables, "nonzeros": lp.nonzeros,
                     "seconds": round(time.perf_counter() - t0, 1)})
        print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"trace": "mooncake/conversation_trace.jsonl", "rows": rows},
                              indent=2) + "\n")
    print("| model | capacity | LP optimum (HiGHS) | pool bound (subgradient) | infinite-capacity bound |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['capacity']} | {100 * r['lp_bound']:.2f} | "
              f"{100 * r['pool_bound']:.2f} | {100 * r['infinite_bound']:.2f} |")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
