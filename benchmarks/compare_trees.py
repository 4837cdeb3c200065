"""Simulator speed of two source trees, as paired ratios measured in one run.

For a redesign that must not slow the simulator down. Two measures:

* **CPU seconds** (default): each round runs every case once per tree, alternating the
  trees, each run in a fresh process; the ratio ``new / ref`` of the median CPU seconds
  of the simulated run per case. On the shared machines here load moves it by a few
  per cent from run to run.
* **Instructions** (``--instructions``): each case runs once per tree under Valgrind's
  callgrind, with instrumentation switched on around the simulated run alone
  (``simulator_bench.py --one CASE --callgrind``); the ratio of executed instructions
  does not depend on load (``PYTHONHASHSEED=0`` pins the dict layouts). It does not see
  cache misses or branch mispredictions, so it complements the seconds rather than
  replacing them. A run takes about 50 times its native time.

Both trees run the same harness, this tree's ``benchmarks/simulator_bench.py``, with the
tree under test first on ``PYTHONPATH``: only the package differs. The hit rates of the
two trees must agree (checked, not timed).

Usage::

    python benchmarks/compare_trees.py --ref /path/to/old/checkout [--new .] \\
        [--cases "vllm+lru,marconi+lru"] [--rounds 5] [--instructions] [--out FILE]

Exit code 1 if a case's hit rate differs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_CASES = ("vllm+lru", "marconi+lru", "dense+lru", "vllm+flop (alpha fixed 0.5)")


def run_once(tree: Path, case: str, *, instructions: bool = False) -> dict:
    """One ``simulator_bench.py --one case`` run of ``tree``'s package in a fresh
    process; with ``instructions``, under callgrind, adding ``"instructions"`` (the
    simulated run's executed instructions) to the row.

    Raises:
        RuntimeError: callgrind's output had no instruction count.
    """
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0")
    cmd = [sys.executable, str(HERE / "simulator_bench.py"), "--one", case]
    if instructions:
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
               "--callgrind-out-file=/dev/null", *cmd, "--callgrind"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    if instructions:
        found = re.search(r"Collected\s*:\s*(\d+)", out.stderr)
        if not found:
            raise RuntimeError(f"no instruction count in callgrind's output for {case!r}")
        row["instructions"] = int(found.group(1))
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", required=True, type=Path, help="the reference checkout")
    ap.add_argument("--new", default=HERE.parent, type=Path, help="the tree under test (this one)")
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES), help="comma list of case names")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--instructions", action="store_true",
                    help="count executed instructions under callgrind (one round) instead of timing")
    ap.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    if args.instructions:
        missing = [tool for tool in ("valgrind", "callgrind_control") if not shutil.which(tool)]
        if missing:
            ap.error(f"--instructions needs Valgrind; not found: {', '.join(missing)}")
        args.rounds = 1  # deterministic: one run per tree
    trees = {"ref": args.ref.resolve(), "new": args.new.resolve()}
    for label, tree in trees.items():
        if not (tree / "vllm_admission").is_dir():
            ap.error(f"--{label} {tree}: no vllm_admission package there")
    rows, mismatch = [], False
    measure, unit = ("instructions", "G instr") if args.instructions else ("cpu_s", "s")
    scale = 1e-9 if args.instructions else 1.0
    for case in (c for c in args.cases.split(",") if c):
        got: dict[str, list[float]] = {"ref": [], "new": []}
        hit: dict[str, float] = {}
        for _ in range(args.rounds):
            for label, tree in trees.items():
                r = run_once(tree, case, instructions=args.instructions)
                got[label].append(r[measure])
                hit[label] = r["token_hit_rate"]
        ref, new = statistics.median(got["ref"]), statistics.median(got["new"])
        same = hit["ref"] == hit["new"]
        mismatch |= not same
        rows.append({"case": case, "measure": measure, "rounds": args.rounds,
                     f"ref_{measure}": ref, f"new_{measure}": new, "ratio": new / ref,
                     "hit_rate": hit["new"], "same_hit_rate": same})
        print(f"{case:<32} ref {ref * scale:6.2f} {unit}  new {new * scale:6.2f} {unit}  "
              f"new/ref {new / ref:5.3f}  "
              f"hit {hit['new']:.4%}{'' if same else '  HIT RATE DIFFERS: ' + str(hit['ref'])}",
              flush=True)
    if args.out:
        args.out.write_text(json.dumps({"ref": str(trees["ref"]), "new": str(trees["new"]),
                                        "rows": rows}, indent=1) + "\n")
    return 1 if mismatch else 0


if __name__ == "__main__":
    sys.exit(main())
