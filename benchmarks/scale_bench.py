"""Simulator time and memory as the trace grows: 10k, 100k and 1M requests.

The long traces are the Mooncake conversation trace repeated with its private
content renamed (``core/traces/resample.py``), streamed into the simulator
(``sim.simulator.stream_cache_requests``): no list of requests is ever built.
Each (pair, length) runs in a fresh Python process, so that its peak resident
memory is its own. Qwen3-Next, 64 GiB (5,140 blocks), as ``simulator_bench.py``.

Reported per case: requests, token hit rate, the run's wall and CPU seconds, peak
RSS of the process, and, per pair, the ratios of the longest run to the shortest
(time, and peak memory).

Targets (issue 35): the 1M-request run takes at most 110x the 10k one, and its
peak memory stays bounded by the cache's capacity, not the trace's length.

Usage: ``python benchmarks/scale_bench.py [--lengths 10000,100000,1000000]
[--pairs vllm+lru,last+reuse,auto+auto] [--out FILE]`` (about 40 minutes for the
three lengths on 2 cores; ``--one PAIR N`` runs one case here and prints its row).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
MODEL = "qwen3-next-80b-a3b"
CAPACITY = "64GiB"
LENGTHS = (10_000, 100_000, 1_000_000)
PAIRS = ("vllm+lru", "last+reuse", "auto+auto")


def run_case(pair: str, n: int) -> dict:
    """One case, in this process."""
    from vllm_admission.core.costs import load_model
    from vllm_admission.core.geometry import block_geometry, parse_bytes
    from vllm_admission.core.traces import load_trace
    from vllm_admission.core.traces.resample import resample
    from vllm_admission.sim.simulator import SimulationSettings, simulate, stream_cache_requests

    admission, eviction = pair.split("+")
    costs = load_model(MODEL)
    source = load_trace(str(TRACE))
    capacity = parse_bytes(CAPACITY)
    block_size = block_geometry(costs, capacity).block_size
    stream = stream_cache_requests(resample(source, n), block_size)
    r = simulate(source, costs, SimulationSettings.of(admission, eviction, capacity_bytes=capacity),
                 requests=stream)
    return {"pair": pair, "requests": r.requests, "token_hit_rate": r.token_hit_rate,
            "wall_s": r.wall_seconds, "cpu_s": r.cpu_seconds, "shadow_rate": r.shadow_rate,
            "final_policy": r.final_policy,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    ap.add_argument("--pairs", default=",".join(PAIRS))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "scale.json"))
    ap.add_argument("--one", nargs=2, metavar=("PAIR", "N"), help="run one case here, print its row")
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(run_case(args.one[0], int(args.one[1]))))
        return 0
    if not TRACE.exists():
        print(f"scale_bench: {TRACE} not found; skipping", file=sys.stderr)
        return 0
    lengths = [int(x) for x in args.lengths.split(",")]
    rows = []
    for pair in args.pairs.split(","):
        for n in lengths:
            out = subprocess.run([sys.executable, __file__, "--one", pair, str(n)],
                                 capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(f"{pair:12s} {row['requests']:>9,d} requests  {row['wall_s']:8.1f} s  "
                  f"{row['peak_rss_mib']:7.1f} MiB  hit {100 * row['token_hit_rate']:.2f} %",
                  flush=True)
        mine = [r for r in rows if r["pair"] == pair]
        if len(mine) > 1:
            lo, hi = mine[0], mine[-1]
            print(f"{pair}: {hi['requests'] // lo['requests']}x the requests: "
                  f"{hi['wall_s'] / lo['wall_s']:.1f}x the time, "
                  f"{hi['peak_rss_mib'] / lo['peak_rss_mib']:.2f}x the peak memory", flush=True)
    Path(args.out).write_text(json.dumps({"model": MODEL, "capacity": CAPACITY, "rows": rows},
                                         indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
