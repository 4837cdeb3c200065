"""Simulator speed and memory on the full Mooncake conversation trace.

Each case runs in a fresh Python process so that its peak resident memory is
its own. A case loads the trace, re-blocks it for Qwen3-Next (block size 544),
then times one simulated run at 64 GiB (5,140 blocks: almost every block is
evicted once). Reported per case: wall and CPU seconds of the run alone, the
load + re-block time, and peak RSS of the whole process.

Usage: ``python benchmarks/simulator_bench.py [--repeat N] [--cases A,B] [--out FILE]``.

``--one CASE`` runs one case in this process and prints its row as JSON (the fresh
process per case above; ``compare_trees.py`` uses it too); with ``--callgrind`` as well,
Valgrind's callgrind instrumentation (started with ``--instr-atstart=no``) is switched
on around the simulated run alone, so that the instruction count it reports is the
run's, without the trace load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
MODEL = "qwen3-next-80b-a3b"
CAPACITY = "64GiB"
CASES = {
    "vllm+lru": ("vllm", "lru", {}),
    "vllm+flop (alpha tuned; coarse grid)": ("vllm", "flop", {}),
    "vllm+flop (alpha tuned; paper grid)": ("vllm", "flop", {"tune_grid": "paper"}),
    "vllm+flop (alpha fixed 0.5)": ("vllm", "flop", {"alpha": 0.5}),
    "marconi+lru": ("marconi", "lru", {}),
    "dense+lru": ("dense", "lru", {}),
    "vllm+belady": ("vllm", "belady", {}),
    "auto+auto (8 shadow caches at first)": ("auto", "auto", {}),
    "vllm+lru with a 1 TiB host tier": ("vllm", "lru", {"host_bytes": 1 << 40}),
    "last+lru with a 1 TiB host tier": ("last", "lru", {"host_bytes": 1 << 40}),
}


def run_case(name: str, around=contextlib.nullcontext) -> dict:
    """Run one case in this process and return its measurements.

    ``around``: a context-manager factory entered around the simulated run alone
    (not the trace load), e.g. :func:`callgrind_window`.
    """
    from vllm_admission.core.costs import load_model
    from vllm_admission.core.geometry import block_geometry, parse_bytes
    from vllm_admission.core.traces import load_trace
    from vllm_admission.sim.simulator import SimulationSettings, cache_requests, simulate

    admission, eviction, extra = CASES[name]
    t0 = time.perf_counter()
    costs = load_model(MODEL)
    trace = load_trace(str(TRACE))
    geo = block_geometry(costs, parse_bytes(CAPACITY))
    requests = cache_requests(trace, geo.block_size)
    load_s = time.perf_counter() - t0
    with around():
        r = simulate(trace, costs, SimulationSettings.of(admission, eviction,
                                                         capacity_bytes=parse_bytes(CAPACITY), **extra),
                     requests=requests)
    return {"case": name, "requests": r.requests, "evictions": r.evictions,
            "token_hit_rate": r.token_hit_rate, "wall_s": r.wall_seconds, "cpu_s": r.cpu_seconds,
            "load_s": load_s, "alpha": r.alpha, "final_policy": r.final_policy,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


@contextlib.contextmanager
def callgrind_window():
    """Switch callgrind's instrumentation on for the block (``callgrind_control -i``
    on this process). Only meaningful under ``valgrind --tool=callgrind
    --instr-atstart=no``.

    Raises:
        RuntimeError: ``callgrind_control`` failed (not running under callgrind?).
    """
    def toggle(state: str) -> None:
        done = subprocess.run(["callgrind_control", "-i", state, str(os.getpid())],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"callgrind_control -i {state} failed: {done.stderr.strip()}")
    toggle("on")
    try:
        yield
    finally:
        toggle("off")


def run_child(name: str) -> dict:
    """:func:`run_case` of ``name`` in a fresh process."""
    out = subprocess.run([sys.executable, __file__, "--one", name], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per case (median reported)")
    ap.add_argument("--cases", default=",".join(CASES), help="comma list of case names")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "simulator.json"))
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--callgrind", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(run_case(args.one, callgrind_window if args.callgrind
                                  else contextlib.nullcontext)))
        return 0
    if not TRACE.exists():
        print(f"Mooncake trace not found at {TRACE}; skipping the simulator benchmark")
        return 0
    names = [n for n in args.cases.split(",") if n]
    rows = []
    for name in names:
        runs = [run_child(name) for _ in range(args.repeat)]
        row = dict(runs[0])
        for key in ("wall_s", "cpu_s", "load_s", "peak_rss_mib"):
            row[key] = statistics.median(r[key] for r in runs)
        row["repeats"] = len(runs)
        rows.append(row)
        print(f"{name:<40} cpu {row['cpu_s']:6.2f} s  wall {row['wall_s']:6.2f} s  "
              f"load {row['load_s']:5.2f} s  peak {row['peak_rss_mib']:6.0f} MiB  "
              f"hit {row['token_hit_rate']:.2%}", flush=True)
    base = next((r for r in rows if r["case"] == "vllm+lru"), None)
    if base:
        for r in rows:
            r["cpu_ratio_to_vllm_lru"] = r["cpu_s"] / base["cpu_s"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"trace": str(TRACE.name), "model": MODEL,
                                          "capacity": CAPACITY,
                                          "date": time.strftime("%Y-%m-%d %H:%M"),
                                          "load_average": os.getloadavg(), "cases": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
