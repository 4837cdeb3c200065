"""``auto`` on sampled shadows against ``auto`` on full shadows (docs/results.md section 5.5).

For each trace, model and capacity of the ``auto`` study (``auto_study.py``), one
worker process runs, one after the other so that their times compare:

* stock ``vllm`` + ``lru``;
* ``auto`` + ``auto`` on full shadows (``shadow_rate=1``, every request on
  eight shadow caches of the full size);
* ``auto`` + ``auto`` on sampled shadows (the default: the rate chosen from the
  trace, ``core/adaptive.py``);
* the fixed pair the sampled run ended on, alone (the pair ``auto`` serves:
  the cost target is "at most 1.5x the fixed pair it serves").

It writes ``docs/results/auto-sampled/results.json`` and prints one markdown
table per trace and model: hit rates, the difference sampled − full, the rate
chosen, and the simulated run's wall time as ratios (sampled / full, sampled /
the fixed pair, full / the fixed pair).

Usage: ``python simulations/sampled_auto_study.py [--traces mooncake,synthetic,mooncake-synthetic]
[--models qwen3-next,nemotron-3-nano] [--jobs 2] [--tables]``. About 15 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from auto_study import MODELS, TRACES  # noqa: E402  (the same traces, models and capacities)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results" / "auto-sampled"


def run_cell(trace_name: str, model_name: str, cap: str) -> dict:
    """The four runs of one cell, in this process."""
    from vllm_admission.core.costs import load_model
    from vllm_admission.core.geometry import block_geometry, parse_bytes
    from vllm_admission.core.traces import load_trace
    from vllm_admission.sim.simulator import SimulationSettings, cache_requests, simulate

    path, _ = TRACES[trace_name]
    costs = load_model(MODELS[model_name])
    trace = load_trace(path)
    capacity = parse_bytes(cap)
    requests = cache_requests(trace, block_geometry(costs, capacity).block_size)

    def run(admission: str, eviction: str, **kw) -> dict:
        r = simulate(trace, costs, SimulationSettings.of(admission, eviction, capacity_bytes=capacity, **kw),
                     requests=requests)
        return {"hit": r.token_hit_rate, "flops_saved": r.flops_saved_fraction,
                "wall_s": r.wall_seconds, "final": r.final_policy,
                "switches": len(r.policy_switches), "rate": r.shadow_rate,
                "handover": r.shadow_handover, "requests": r.requests}

    stock = run("vllm", "lru")
    full = run("auto", "auto", shadow_rate=1.0)
    sampled = run("auto", "auto")
    adm, ev = sampled["final"].split("+")
    served = run(adm, ev)
    return {"trace": trace_name, "model": model_name, "capacity": cap, "stock": stock,
            "full": full, "sampled": sampled, "served": served}


def table(rows: list[dict]) -> str:
    lines = ["| capacity | stock | auto, full shadows | auto, sampled | sampled − full | rate "
             "| handover at | sampled − stock | wall: sampled / full | sampled / pair served "
             "| full / pair served | pair served (sampled) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        st, fu, sa, se = r["stock"], r["full"], r["sampled"], r["served"]
        handover = "–" if sa["handover"] is None else f"{sa['handover'] + 1:,}"
        lines.append(
            f"| {r['capacity']} | {100 * st['hit']:.2f} | {100 * fu['hit']:.2f} | "
            f"{100 * sa['hit']:.2f} | {100 * (sa['hit'] - fu['hit']):+.2f} | {sa['rate']:.3f} | "
            f"{handover} | "
            f"{100 * (sa['hit'] - st['hit']):+.2f} | {sa['wall_s'] / fu['wall_s']:.2f} | "
            f"{sa['wall_s'] / se['wall_s']:.2f}x | {fu['wall_s'] / se['wall_s']:.1f}x | "
            f"{sa['final']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--tables", action="store_true", help="reprint the tables of the file written")
    args = ap.parse_args(argv)
    out = OUT / "results.json"
    if args.tables:
        rows = json.loads(out.read_text())
    else:
        cells = [(t, m, c) for t in args.traces.split(",") for m in args.models.split(",")
                 for c in TRACES[t][1]]
        with ProcessPoolExecutor(args.jobs) as pool:
            rows = list(pool.map(run_cell, *zip(*cells, strict=True)))
        OUT.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rows, indent=1))
    for t in dict.fromkeys(r["trace"] for r in rows):
        for m in dict.fromkeys(r["model"] for r in rows if r["trace"] == t):
            print(f"\n{t}, {m}:\n")
            print(table([r for r in rows if r["trace"] == t and r["model"] == m]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
