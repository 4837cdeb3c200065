"""The fleet study (docs/results.md section 10): routers over replicas of the cache.

The Mooncake conversation trace at its own arrival times, through 4, 8 and 16 replicas of
64 and 128 GiB each, Qwen3-Next and Nemotron-3-Nano, stock's pair (``vllm`` + ``lru``) and
``auto`` + ``auto`` on every replica, behind each routing policy (``round_robin``,
``least_loaded``, ``kv_prefix``: Dynamo's cost on the attention-KV overlap, ``hybrid``: the
same cost on the hybrid hit). Each replica prefills at 40 % of an H100's BF16 peak. Writes
``docs/results/fleet/fleet.json`` and prints one table per model: fleet token hit rate, load
spread (the busiest replica's prefill seconds over the mean) and time to first token, and
``hybrid`` over ``kv_prefix``.

Usage: ``python simulations/fleet_study.py [--jobs 2] [--replicas 4,8,16]`` (about 8 minutes
on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from headroom import MODELS, MOONCAKE, ROOT

from vllm_admission.core.costs import load_model
from vllm_admission.core.geometry import block_geometry, parse_bytes
from vllm_admission.core.routing import ROUTERS
from vllm_admission.core.traces import load_trace
from vllm_admission.sim.fleet import FleetSettings, simulate_fleet
from vllm_admission.sim.simulation_settings import SimulationSettings
from vllm_admission.sim.simulator import cache_requests

CAPACITIES = ("64GiB", "128GiB")
PAIRS = (("vllm", "lru"), ("auto", "auto"))

_STATE: dict = {}


def _run(model: str, capacity: str, pair: tuple[str, str], replicas: int) -> list[dict]:
    """Every router on one cell (one process: the trace and requests loaded once)."""
    if _STATE.get("model") != model:
        _STATE.update(model=model, costs=load_model(MODELS[model]),
                      trace=_STATE.get("trace") or load_trace(str(MOONCAKE)), requests={})
    costs, trace = _STATE["costs"], _STATE["trace"]
    cap = parse_bytes(capacity)
    block = block_geometry(costs, cap).block_size
    if block not in _STATE["requests"]:
        _STATE["requests"][block] = cache_requests(trace, block)
    settings = SimulationSettings.of(*pair, capacity_bytes=cap)
    out = []
    for router in ROUTERS:
        res = simulate_fleet(trace, costs, settings, FleetSettings(replicas, router),
                             requests=_STATE["requests"][block])
        out.append({"model": model, "capacity": capacity, "pair": "+".join(pair), **res.to_record()})
    return out


def table(records: list[dict], model: str) -> str:
    lines = [f"**{model}** (token hit rate % / load spread / TTFT P50, P99 s)", "",
             "| replicas x capacity | pair | " + " | ".join(f"`{r}`" for r in ROUTERS)
             + " | `hybrid` / `kv_prefix` |", "|---|---|" + "---|" * (len(ROUTERS) + 1)]
    cells: dict = {}
    for r in records:
        if r["model"] == model:
            cells.setdefault((r["replicas"], r["capacity"], r["pair"]), {})[r["router"]] = r
    for (n, cap, pair), by in sorted(cells.items(), key=lambda kv: (kv[0][0], parse_bytes(kv[0][1]), kv[0][2])):
        row = [f"{n} x {cap.replace('GiB', ' GiB')}", f"`{pair}`"]
        for router in ROUTERS:
            r = by[router]
            row.append(f"{100 * r['token_hit_rate']:.2f} / {r['load_spread']:.2f} / "
                       f"{r['ttft_p50_s']:.2f}, {r['ttft_p99_s']:.1f}")
        kv, hy = by["kv_prefix"]["token_hit_rate"], by["hybrid"]["token_hit_rate"]
        row.append(f"{hy / kv:.3f}x" if kv else "–")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--replicas", default="4,8,16")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "fleet" / "fleet.json"))
    args = ap.parse_args(argv)
    if not MOONCAKE.exists():
        print(f"mooncake trace not found at {MOONCAKE}", file=sys.stderr)
        return 1
    replicas = [int(n) for n in args.replicas.split(",")]
    cells = [(m, c, p, n) for m in MODELS for n in replicas for c in CAPACITIES for p in PAIRS]
    records: list[dict] = []
    with ProcessPoolExecutor(args.jobs) as ex:
        for out in ex.map(_run, *zip(*cells, strict=True)):
            records += out
            print(f"{out[0]['model']} {out[0]['replicas']} x {out[0]['capacity']} {out[0]['pair']}: "
                  + ", ".join(f"{r['router']} {100 * r['token_hit_rate']:.2f}" for r in out), flush=True)
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"trace": str(MOONCAKE.name), "records": records}, indent=1))
    for model in MODELS:
        print(table(records, model), "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
