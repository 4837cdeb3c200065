"""``auto`` against stock vLLM, every fixed engine-runnable pair and Bélády (docs/results.md section 5).

For each trace and model, one sweep runs ``auto`` + ``auto`` and every fixed
pair an engine can run (admissions ``last``, ``vllm``, ``marconi``, ``dense`` x
every engine eviction policy: ``lru``, ``flop`` tuned online, ``lfu``, ``reuse``), plus ``vllm`` + ``belady``
(the offline reference), at the trace's capacities. It writes
``docs/results/auto/<trace>-<model>/results.json`` and ``hit_rate.png`` and
prints one markdown table per sweep: stock (``vllm`` + ``lru``), the best fixed
pair, ``auto`` with its prefill FLOPs saved, the ratio to stock, the distance
to the best fixed pair, the pair it ended on, its switches, and the share of
the stock-to-Bélády gap it closed.

Usage: ``python simulations/auto_study.py [--traces mooncake,synthetic,mooncake-synthetic]
[--models qwen3-next,nemotron-3-nano] [--jobs 2] [--tables] [--auto-only]``
(``--tables`` reprints the tables from the files already written; ``--auto-only``
runs ``auto`` again and keeps the fixed pairs of the file already written). The Mooncake sweeps take
about 20 minutes per model on 2 cores; the synthetic ones about 2.

``--checkpoint inpass`` runs ``auto`` with states captured inside the pass (where it starts
as ``dense``, ``core/adaptive.py``) into ``<trace>-<model>-inpass/``, beside the fixed pairs and
the reference of the ``split`` study already written: a fixed pair admits the same states
in both modes, only the chunking differs (docs/results.md section 5.3 gives the check).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vllm_admission.core.adaptive import AUTO
from vllm_admission.core.cache import CHECKPOINT_MODES
from vllm_admission.core.eviction import ENGINE_EVICTION_POLICIES
from vllm_admission.core.geometry import parse_bytes
from vllm_admission.sim.report import write_results
from vllm_admission.sim.sweep import SweepSpec, run_sweep

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

MODELS = {
    "qwen3-next": "qwen3-next-80b-a3b",
    "nemotron-3-nano": str(SHARED / "model_configs" / "nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json"),
}
TRACES = {
    "mooncake": (str(SHARED / "traces" / "mooncake" / "conversation_trace.jsonl"),
                 ("32GiB", "64GiB", "128GiB", "256GiB", "512GiB", "1TiB", "4TiB")),
    "synthetic": ("synthetic", ("2GiB", "4GiB", "8GiB", "16GiB", "64GiB")),
    # Held out: no policy or parameter of this project was chosen on it (docs/results.md 5.4).
    "mooncake-synthetic": (str(ROOT / "simulations" / "traces" / "mooncake-synthetic" / "synthetic_trace.jsonl"),
                           ("32GiB", "64GiB", "128GiB", "256GiB", "512GiB")),
}
FIXED_ADMISSIONS = ("last", "vllm", "marconi", "dense")
FIXED_EVICTIONS = ENGINE_EVICTION_POLICIES
STOCK = ("vllm", "lru")
REFERENCE = ("vllm", "belady")


def sweeps(trace: str, model: str, checkpoint: str = "split") -> list[SweepSpec]:
    """The sweeps of one trace and model: ``auto``, the fixed grid, the reference."""
    path, caps = TRACES[trace]
    common = dict(trace=path, model=MODELS[model], capacities=tuple(parse_bytes(c) for c in caps),
                  chunk_size=8192, checkpoint=checkpoint)
    # Full shadows: the figures of docs/results.md section 5 (section 5.5 compares the
    # default, sampled shadows, sampled_auto_study.py).
    return [SweepSpec(admissions=(AUTO,), evictions=(AUTO,), shadow_rate=1.0, **common),
            SweepSpec(admissions=FIXED_ADMISSIONS, evictions=FIXED_EVICTIONS, **common),
            SweepSpec(admissions=(REFERENCE[0],), evictions=(REFERENCE[1],), **common)]


def _gib(n: int) -> str:
    return f"{n / (1 << 40):g} TiB" if n >= 1 << 40 else f"{n / (1 << 30):g} GiB"


def table(doc: dict) -> str:
    """The markdown table of one sweep document (runs of every pair, bound)."""
    by = {}
    for r in doc["runs"]:
        by[(r["admission"], r["eviction"], r["capacity_bytes"])] = r
    lines = ["| capacity | stock `vllm`+`lru` | best fixed pair | `auto`+`auto` | auto: FLOPs saved "
             "| auto / stock | auto − best | final pair | switches | gap to Bélády closed |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for cap in sorted({r["capacity_bytes"] for r in doc["runs"]}):
        stock = by[(*STOCK, cap)]["token_hit_rate"]
        fixed = [r for (a, e, c), r in by.items() if c == cap and a != AUTO and e != "belady"]
        best = max(fixed, key=lambda r: r["token_hit_rate"])
        auto = by[(AUTO, AUTO, cap)]
        ref = by.get((*REFERENCE, cap))
        gap = ""
        if ref is not None and ref["token_hit_rate"] > max(stock, best["token_hit_rate"]):
            gap = f"{100 * (auto['token_hit_rate'] - stock) / (ref['token_hit_rate'] - stock):.0f} %"
        ratio = auto["token_hit_rate"] / stock if stock else float("inf")
        lines.append(
            f"| {_gib(cap)} | {100 * stock:.2f} | {100 * best['token_hit_rate']:.2f} "
            f"({best['admission']}+{best['eviction']}) | {100 * auto['token_hit_rate']:.2f} | "
            f"{100 * auto['flops_saved_fraction']:.2f} | {ratio:.2f}x | "
            f"{100 * (auto['token_hit_rate'] - best['token_hit_rate']):+.2f} | "
            f"{auto['final_policy']} | {len(auto['policy_switches'])} | {gap or '–'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=",".join(TRACES), help=f"comma list of {', '.join(TRACES)}")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "auto"))
    ap.add_argument("--tables", action="store_true", help="reprint the tables from the files written")
    ap.add_argument("--auto-only", action="store_true",
                    help="run only auto + auto and replace its runs in the results.json already written "
                         "(the fixed pairs and the reference are kept)")
    ap.add_argument("--checkpoint", choices=CHECKPOINT_MODES, default="split",
                    help="checkpoint mode of the auto runs; inpass writes <trace>-<model>-inpass/ "
                         "beside the split study's fixed pairs (implies --auto-only)")
    args = ap.parse_args(argv)
    if args.checkpoint != "split":
        args.auto_only = True
    for trace in args.traces.split(","):
        for model in args.models.split(","):
            if trace not in TRACES or model not in MODELS:
                ap.error(f"unknown trace or model {trace!r}, {model!r}")
            base = out = Path(args.out) / f"{trace}-{model}"
            if args.checkpoint != "split":
                out = Path(args.out) / f"{trace}-{model}-{args.checkpoint}"
            if args.tables:
                doc = json.loads((out / "results.json").read_text())
            else:
                if not Path(TRACES[trace][0]).exists() and trace != "synthetic":
                    print(f"{trace}: trace not found at {TRACES[trace][0]}", file=sys.stderr)
                    return 2
                if args.auto_only:
                    if not (base / "results.json").exists():
                        ap.error(f"--auto-only needs {base / 'results.json'}: run the full study first")
                    doc = json.loads((base / "results.json").read_text())
                    fresh = run_sweep(sweeps(trace, model, args.checkpoint)[0], jobs=args.jobs,
                                      progress=True)
                    doc["runs"] = [r for r in doc["runs"] if AUTO not in (r["admission"], r["eviction"])]
                    doc["runs"] += fresh["runs"]
                    if args.checkpoint != "split":
                        # Each run record keeps its own mode; the plot's title names auto's.
                        doc["checkpoint"] = args.checkpoint
                else:
                    docs = [run_sweep(s, jobs=args.jobs, progress=True) for s in sweeps(trace, model)]
                    doc = {**docs[0], "runs": [r for d in docs for r in d["runs"]]}
                if trace == "mooncake":
                    doc["trace"] = "mooncake/conversation_trace.jsonl"
                elif trace == "mooncake-synthetic":
                    doc["trace"] = "simulations/traces/mooncake-synthetic/synthetic_trace.jsonl"
                res, png = write_results(doc, out)
                print(f"wrote {res} and {png}")
            print(f"\n### {trace}, {doc['model']}\n")
            print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
