"""Policy study on the Mooncake conversation trace (the simulator issue's study).

Replays the whole trace (12,031 requests) for two real hybrid models,
Qwen3-Next-80B-A3B (Gated DeltaNet + attention) and Nemotron-3-Nano-30B-A3B
(Mamba2 + attention + MoE), at KV cache capacities from heavy pressure to
none, for every admission x eviction pair. Writes, per model,
``docs/results/<model>/results.json`` and ``hit_rate.png``, and prints the
tables that ``docs/results.md`` quotes.

Run: ``make study`` (about 15 minutes on 2 cores), or
``python simulations/mooncake_study.py --jobs 2 [--models qwen3-next]``.
Deterministic: the same inputs give the same numbers (wall times aside).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vllm_admission.core.geometry import parse_bytes
from vllm_admission.sim.report import format_table, write_results
from vllm_admission.sim.sweep import SweepSpec, run_sweep

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
TRACE = SHARED / "traces" / "mooncake" / "conversation_trace.jsonl"

MODELS = {
    "qwen3-next": "qwen3-next-80b-a3b",
    "nemotron-3-nano": str(SHARED / "model_configs" / "nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json"),
}
CAPACITIES = ("32GiB", "64GiB", "128GiB", "256GiB", "512GiB", "1TiB", "4TiB")
ADMISSIONS = ("last", "vllm", "marconi", "dense")
EVICTIONS = ("lru", "flop", "belady")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "docs" / "results"))
    args = ap.parse_args(argv)
    if not TRACE.exists():
        print(f"mooncake trace not found at {TRACE}", file=sys.stderr)
        return 2
    for key in args.models.split(","):
        spec = SweepSpec(trace=str(TRACE), model=MODELS[key],
                         capacities=tuple(parse_bytes(c) for c in CAPACITIES),
                         admissions=ADMISSIONS, evictions=EVICTIONS, chunk_size=8192)
        doc = run_sweep(spec, jobs=args.jobs, progress=True)
        doc["trace"] = "mooncake/conversation_trace.jsonl"
        print(f"\n## {doc['model']}\n")
        print(format_table(doc))
        res, png = write_results(doc, Path(args.out) / key)
        print(f"wrote {res} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
