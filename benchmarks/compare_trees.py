"""Simulator speed of two source trees, as paired ratios measured in one run.

For a redesign that must not slow the simulator down: each round runs every case once
per tree, alternating the trees, each run in a fresh process
(``simulator_bench.py --one CASE`` with that tree first on ``PYTHONPATH``). The ratio
``new / ref`` of the median CPU seconds per case is what the noisy, shared machines here
can compare; the hit rates of the two trees must also agree (checked, not timed).

Usage::

    python benchmarks/compare_trees.py --ref /path/to/old/checkout [--new .] \\
        [--cases "vllm+lru,marconi+lru"] [--rounds 5] [--out FILE]

Both trees need ``benchmarks/simulator_bench.py``; the run uses this interpreter (the
installed dependencies) for both. Exit code 1 if a case's hit rate differs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_CASES = ("vllm+lru", "marconi+lru", "dense+lru", "vllm+flop (alpha fixed 0.5)")


def run_once(tree: Path, case: str) -> dict:
    """One ``simulator_bench.py --one case`` run of ``tree`` in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, str(tree / "benchmarks" / "simulator_bench.py"),
                          "--one", case], check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", required=True, type=Path, help="the reference checkout")
    ap.add_argument("--new", default=HERE.parent, type=Path, help="the tree under test (this one)")
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES), help="comma list of case names")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    trees = {"ref": args.ref.resolve(), "new": args.new.resolve()}
    for label, tree in trees.items():
        if not (tree / "benchmarks" / "simulator_bench.py").exists():
            ap.error(f"--{label} {tree}: no benchmarks/simulator_bench.py there")
    rows, mismatch = [], False
    for case in (c for c in args.cases.split(",") if c):
        cpu: dict[str, list[float]] = {"ref": [], "new": []}
        hit: dict[str, float] = {}
        for _ in range(args.rounds):
            for label, tree in trees.items():
                r = run_once(tree, case)
                cpu[label].append(r["cpu_s"])
                hit[label] = r["token_hit_rate"]
        ref, new = statistics.median(cpu["ref"]), statistics.median(cpu["new"])
        same = hit["ref"] == hit["new"]
        mismatch |= not same
        rows.append({"case": case, "rounds": args.rounds, "ref_cpu_s": ref, "new_cpu_s": new,
                     "ratio": new / ref, "hit_rate": hit["new"], "same_hit_rate": same})
        print(f"{case:<32} ref {ref:6.2f} s  new {new:6.2f} s  new/ref {new / ref:5.3f}  "
              f"hit {hit['new']:.4%}{'' if same else '  HIT RATE DIFFERS: ' + str(hit['ref'])}",
              flush=True)
    if args.out:
        args.out.write_text(json.dumps({"ref": str(trees["ref"]), "new": str(trees["new"]),
                                        "rows": rows}, indent=1) + "\n")
    return 1 if mismatch else 0


if __name__ == "__main__":
    sys.exit(main())
