"""Two-tier study: GPU and host memory, stock vLLM + OffloadingConnector against ``auto`` (issue 33).

For each model (Qwen3-Next-80B-A3B, Nemotron-3-Nano-30B-A3B) and trace (the whole Mooncake
conversation trace, the seeded synthetic workload, and that workload again where memory is short: GPU 2 / 4 / 8 GiB
with host 0 / 16 / 64 GiB), every GPU capacity (32 / 64 / 128 GiB)
with every host tier (none / 256 GiB / 1 TiB, vLLM's ``OffloadingConnector`` with its ``lru``
host policy) runs stock vLLM (``vllm`` + ``lru``), ``auto`` + ``auto`` (its shadows run the
host tier too) and, for reference, the best fixed pair of the single-tier study (``last`` +
``lru``). Writes ``docs/results/host-tier/<model>-<trace>.json`` (the runs, each with its
``host_*`` fields) and ``hit_rate_vs_bytes.png`` (hit rate against GPU + host bytes, one line
per policy and host size), and prints the tables ``docs/results.md`` quotes.

Net figures: the prefill time the hits save, at an assumed effective prefill rate
(``--prefill-flops``, default 400 TFLOP/s: an H100 SXM's 989 TFLOP/s dense BF16 at 40 %),
minus the time the host loads take at ``--host-bandwidth`` (default 64 GB/s, PCIe 5.0 x16).

Run: ``make study-host`` or ``python simulations/host_tier_study.py --jobs 2``.
Deterministic: the same inputs give the same numbers (wall times aside).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vllm_admission.core.cache.host import H2D_BYTES_PER_SECOND
from vllm_admission.core.geometry import parse_bytes
from vllm_admission.sim.sweep import SweepSpec, run_sweep

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
TRACES = {"mooncake": SHARED / "traces" / "mooncake" / "conversation_trace.jsonl",
          "synthetic": "synthetic", "synthetic-small": "synthetic"}
MODELS = {
    "qwen3-next": "qwen3-next-80b-a3b",
    "nemotron-3-nano": str(SHARED / "model_configs" / "nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json"),
}
GPU = ("32GiB", "64GiB", "128GiB")
HOST = ("0", "256GiB", "1TiB")
#: Grids other than (GPU, HOST): the synthetic workload fits a 32 GiB GPU, so it is also run
#: where memory is short, as the single-tier demo runs it.
GRIDS = {"synthetic-small": (("2GiB", "4GiB", "8GiB"), ("0", "16GiB", "64GiB"))}
STOCK = ("vllm", "lru")
PAIRS = (("auto", "auto"), ("last", "lru"))
#: Effective prefill FLOP/s the net figures assume.
PREFILL_FLOPS = 400e12


def _label(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return "none" if n == 0 else f"{n} B"


def run_cell(trace: str, model: str, gpu: tuple[str, ...], host: int, jobs: int,
             seed: int) -> tuple[list[dict], dict]:
    spec = SweepSpec(trace=str(trace), model=model, capacities=tuple(parse_bytes(c) for c in gpu),
                     admissions=(STOCK[0],), evictions=(STOCK[1],), pairs=PAIRS,
                     chunk_size=8192, seed=seed, host_bytes=host)
    doc = run_sweep(spec, jobs=jobs, progress=False)
    for r in doc["runs"]:
        r["host_bytes_asked"] = host
    return doc["runs"], doc


def net_seconds(run: dict, prefill_flops: float) -> float:
    """Prefill seconds the hits save at ``prefill_flops`` minus the host loads' seconds."""
    return run["prefill_flops_saved"] / prefill_flops - run.get("host_load_seconds", 0.0)


def table(runs: list[dict], prefill_flops: float) -> str:
    stock = {(r["capacity_bytes"], r["host_bytes_asked"]): r for r in runs
             if (r["admission"], r["eviction"]) == STOCK}
    lines = ["| GPU | host | pair | hit rate % | from host % | vs stock same bytes | "
             "loaded GiB | stored GiB | load s | net prefill s saved |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        base = stock[(r["capacity_bytes"], r["host_bytes_asked"])]
        ratio = r["token_hit_rate"] / base["token_hit_rate"] if base["token_hit_rate"] else 0.0
        share = r.get("host_hit_tokens", 0) / r["prompt_tokens"] if r["prompt_tokens"] else 0.0
        lines.append(
            f"| {_label(r['capacity_bytes'])} | {_label(r['host_bytes_asked'])} | "
            f"{r['admission']}+{r['eviction']} | {100 * r['token_hit_rate']:.2f} | "
            f"{100 * share:.2f} | {ratio:.2f}x | {r.get('host_bytes_loaded', 0) / (1 << 30):,.0f} | "
            f"{r.get('host_bytes_stored', 0) / (1 << 30):,.0f} | {r.get('host_load_seconds', 0.0):.1f} | "
            f"{net_seconds(r, prefill_flops):,.0f} |")
    return "\n".join(lines)


def plot(runs: list[dict], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    pairs = [STOCK, *PAIRS]
    styles = {STOCK: "o-", PAIRS[0]: "s-", PAIRS[1]: "^--"}
    for pair in pairs:
        for host in sorted({r["host_bytes_asked"] for r in runs}):
            pts = sorted((r["capacity_bytes"] + host, 100 * r["token_hit_rate"]) for r in runs
                         if (r["admission"], r["eviction"]) == pair and r["host_bytes_asked"] == host)
            ax.plot([x / (1 << 30) for x, _ in pts], [y for _, y in pts], styles[pair],
                    label=f"{pair[0]}+{pair[1]}, host {_label(host)}", alpha=0.85)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPU + host bytes (GiB; the GPU grows along each line)")
    ax.set_ylabel("token hit rate (%)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}")
    ap.add_argument("--traces", default=",".join(TRACES), help=f"comma list of {', '.join(TRACES)}")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="synthetic workload seed")
    ap.add_argument("--prefill-flops", type=float, default=PREFILL_FLOPS,
                    help="effective prefill FLOP/s for the net figures (default 4e14)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "host-tier"))
    args = ap.parse_args(argv)
    if "mooncake" in args.traces and not TRACES["mooncake"].exists():
        print(f"mooncake trace not found at {TRACES['mooncake']}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for model_key in args.models.split(","):
        for trace_key in args.traces.split(","):
            runs, doc = [], None
            gpu, hosts = GRIDS.get(trace_key, (GPU, HOST))
            for host in hosts:
                cell, doc = run_cell(TRACES[trace_key], MODELS[model_key], gpu, parse_bytes(host),
                                     args.jobs, args.seed)
                runs += cell
            name = f"{model_key}-{trace_key}"
            record = {"model": doc["model"], "trace": trace_key, "gpu": gpu, "host": hosts,
                      "pairs": [list(STOCK), *map(list, PAIRS)], "bound": doc["bound"],
                      "host_bandwidth": H2D_BYTES_PER_SECOND, "prefill_flops": args.prefill_flops,
                      "runs": runs}
            (out / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
            plot(runs, f"{doc['model']}, {trace_key}: two tiers", out / f"{name}.png")
            print(f"\n## {doc['model']}, {trace_key}\n")
            print(table(runs, args.prefill_flops))
            print(f"\nwrote {out / (name + '.json')} and {out / (name + '.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
