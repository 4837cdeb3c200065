"""Per-request equivalence of two simulator trees (speed work must not change results).

Runs :func:`vllm_admission.sim.simulator.simulate` with ``per_request=True`` on a fixed
set of cases and writes one JSON file per case, every record field except the timings
(``wall_seconds``, ``cpu_seconds``). Run it once per tree, then compare the folders
byte for byte (``diff -r``)::

    PYTHONPATH=/path/to/main python benchmarks/sim_equivalence.py /tmp/ref
    PYTHONPATH=. python benchmarks/sim_equivalence.py /tmp/new
    diff -r /tmp/ref /tmp/new && echo identical

Cases: the Mooncake conversation trace with Qwen3-Next at 64 and 256 GiB, every
admission (vllm, last, marconi, dense) with every eviction (lru, flop tuned, lfu,
reuse, belady), flop at alpha 0.5 and with the paper grid, auto+auto; the synthetic
trace at 1, 4 and 16 GiB (every pair, auto+auto, vllm+auto, auto+lru); Nemotron-3-Nano
on both traces. ``--only A,B`` / ``--skip A,B`` keep the cases whose name contains one
of the words; ``--checkpoint inpass`` runs every case in that checkpoint mode (the
default, ``split``, passes no option, so a tree from before the mode runs too). Needs
``../shared`` (the trace and model configs) beside the checkout.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vllm_admission.core.costs import load_model
from vllm_admission.core.geometry import parse_bytes
from vllm_admission.core.traces import load_trace
from vllm_admission.sim.simulator import SimulationSettings, simulate

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
MOON = str(SHARED / "traces" / "mooncake" / "conversation_trace.jsonl")
NEMO = str(SHARED / "model_configs" / "nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json")
QWEN = "qwen3-next-80b-a3b"
ADMISSIONS = ("vllm", "last", "marconi", "dense")
EVICTIONS = ("lru", "flop", "lfu", "reuse", "belady")


def cases() -> list[tuple]:
    """``(name, trace, model, capacity, admission, eviction, extra simulate options)``."""
    out = []
    for cap in ("64GiB", "256GiB"):
        for a in ADMISSIONS:
            for e in EVICTIONS:
                out.append((f"moon-qwen-{cap}-{a}-{e}", MOON, QWEN, cap, a, e, {}))
        out.append((f"moon-qwen-{cap}-vllm-flop05", MOON, QWEN, cap, "vllm", "flop", {"alpha": 0.5}))
    out.append(("moon-qwen-64GiB-vllm-flop-paper", MOON, QWEN, "64GiB", "vllm", "flop",
                {"tune_grid": "paper"}))
    for cap in ("1GiB", "4GiB", "16GiB"):
        for a in ADMISSIONS:
            for e in EVICTIONS:
                out.append((f"syn-qwen-{cap}-{a}-{e}", "synthetic", QWEN, cap, a, e, {}))
        for a, e in (("auto", "auto"), ("vllm", "auto"), ("auto", "lru")):
            out.append((f"syn-qwen-{cap}-{a}-{e}", "synthetic", QWEN, cap, a, e, {}))
    for a, e in (("vllm", "lru"), ("vllm", "flop"), ("marconi", "lfu"), ("last", "reuse"),
                 ("auto", "auto")):
        out.append((f"syn-nemo-4GiB-{a}-{e}", "synthetic", NEMO, "4GiB", a, e, {}))
    for a, e in (("vllm", "lru"), ("vllm", "flop"), ("marconi", "lfu"), ("last", "reuse"),
                 ("vllm", "belady"), ("auto", "auto")):
        out.append((f"moon-nemo-64GiB-{a}-{e}", MOON, NEMO, "64GiB", a, e, {}))
    out.append(("moon-qwen-64GiB-auto-auto", MOON, QWEN, "64GiB", "auto", "auto", {}))
    out.append(("moon-qwen-256GiB-auto-auto", MOON, QWEN, "256GiB", "auto", "auto", {}))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--only", default="", help="comma list: keep names containing one of these")
    ap.add_argument("--skip", default="", help="comma list: drop names containing one of these")
    ap.add_argument("--checkpoint", default="split", help="checkpoint mode (split, inpass)")
    args = ap.parse_args(argv)
    outdir = Path(args.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    only = [w for w in args.only.split(",") if w]
    skip = [w for w in args.skip.split(",") if w]
    traces: dict = {}
    models: dict = {}
    for name, trace, model, cap, adm, ev, extra in cases():
        if (only and not any(w in name for w in only)) or any(w in name for w in skip):
            continue
        if trace not in traces:
            traces[trace] = load_trace(trace)
        if model not in models:
            models[model] = load_model(model)
        if args.checkpoint != "split":
            extra = {**extra, "checkpoint": args.checkpoint}
        r = simulate(traces[trace], models[model], SimulationSettings.of(
            adm, ev, capacity_bytes=parse_bytes(cap), per_request=True, **extra))
        rec = r.to_record()
        cpu = rec.pop("cpu_seconds")
        del rec["wall_seconds"]
        (outdir / f"{name}.json").write_text(json.dumps(rec, sort_keys=True))
        print(f"{name:45s} cpu {cpu:7.2f} s  hit {r.token_hit_rate:.4%}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
