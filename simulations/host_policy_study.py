"""Policies in both tiers: host eviction and per-tier admission on the Mooncake trace (issue 33).

Two questions, each on Qwen3-Next-80B-A3B and Nemotron-3-Nano-30B-A3B, the whole Mooncake
conversation trace, GPU 32 / 128 GiB with host 256 GiB / 1 TiB (vLLM's
``OffloadingConnector``):

* **Host eviction.** Stock vLLM (``vllm`` + ``lru``) and ``auto`` + ``auto`` with each host
  policy: vLLM's ``lru`` (the connector's default) and the project's ``lfu``, ``reuse``,
  ``s3fifo``, ``mix`` (``--host-policy``; the plugin loads them into vLLM's manager).
* **Per-tier admission.** ``vllm`` + ``lru``, ``marconi`` + ``lru`` and ``auto`` + ``auto``
  with no host admission (the host gets what the GPU keeps), ``last`` and ``dense``
  (``--host-admission``: the states that policy keeps go to the host only).

The baseline of both is stock vLLM + OffloadingConnector with its ``lru`` host policy at the
same GPU and host bytes. Writes ``docs/results/host-tier/policies-<model>.json`` and prints
the tables ``docs/results.md`` quotes.

Run: ``make study-host-policies`` or ``python simulations/host_policy_study.py --jobs 2``.
Deterministic: the same inputs give the same numbers (wall times aside).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from host_tier_study import MODELS, ROOT, TRACES, _label

from vllm_admission.core.cache.host import host_policy_names
from vllm_admission.core.geometry import parse_bytes
from vllm_admission.sim.sweep import SweepSpec, run_sweep

TRACE = TRACES["mooncake"]
GPU = ("32GiB", "128GiB")
HOST = ("256GiB", "1TiB")
STOCK = ("vllm", "lru")
AUTO = ("auto", "auto")
#: Host admission settings of the second part (None: the host gets what the GPU keeps).
HOST_ADMISSIONS = (None, "last", "dense")
ADMISSION_PAIRS = (("marconi", "lru"), AUTO)


def sweep(model: str, host: int, *, pairs: tuple, host_policy: str = "lru",
          host_admission: str | None = None, jobs: int) -> list[dict]:
    spec = SweepSpec(trace=str(TRACE), model=model, capacities=tuple(parse_bytes(c) for c in GPU),
                     admissions=(STOCK[0],), evictions=(STOCK[1],), pairs=pairs, chunk_size=8192,
                     host_bytes=host, host_policy=host_policy, host_admission=host_admission)
    runs = run_sweep(spec, jobs=jobs, progress=False)["runs"]
    for r in runs:
        r["host_bytes_asked"] = host
        r["host_policy"] = host_policy
        r["host_admission"] = host_admission
    return runs


def _row_key(r: dict) -> tuple[int, int]:
    return r["capacity_bytes"], r["host_bytes_asked"]


def eviction_table(runs: list[dict]) -> str:
    """Hit rate by host policy, stock and ``auto``; the baseline is stock with ``lru``."""
    policies = host_policy_names()
    base = {_row_key(r): r["token_hit_rate"] for r in runs
            if (r["admission"], r["eviction"]) == STOCK and r["host_policy"] == "lru"}
    head = " | ".join(f"{p}" for p in policies)
    lines = [f"| GPU | host | pair | {head} |", "|---|---|---|" + "---|" * len(policies)]
    for cap, host in sorted(base):
        for pair in (STOCK, AUTO):
            cells = []
            for p in policies:
                (r,) = [r for r in runs if _row_key(r) == (cap, host) and r["host_policy"] == p
                        and (r["admission"], r["eviction"]) == pair]
                cells.append(f"{100 * r['token_hit_rate']:.2f}")
            lines.append(f"| {_label(cap)} | {_label(host)} | {pair[0]}+{pair[1]} | "
                         + " | ".join(cells) + " |")
    return "\n".join(lines)


def admission_table(runs: list[dict]) -> str:
    """Hit rate by host admission for each pair, and the best against stock + offloading."""
    base = {_row_key(r): r["token_hit_rate"] for r in runs
            if (r["admission"], r["eviction"]) == STOCK and r["host_admission"] is None}
    names = ["none" if h is None else h for h in HOST_ADMISSIONS]
    lines = ["| GPU | host | pair | " + " | ".join(f"host adm. {n}" for n in names)
             + " | best / stock + offloading |",
             "|---|---|---|" + "---|" * len(names) + "---|"]
    for cap, host in sorted(base):
        for pair in (STOCK, *ADMISSION_PAIRS):
            rates = []
            for h in HOST_ADMISSIONS:
                (r,) = [r for r in runs if _row_key(r) == (cap, host) and r["host_admission"] == h
                        and (r["admission"], r["eviction"]) == pair]
                rates.append(r["token_hit_rate"])
            best = max(rates)
            lines.append(f"| {_label(cap)} | {_label(host)} | {pair[0]}+{pair[1]} | "
                         + " | ".join(f"{100 * x:.2f}" for x in rates)
                         + f" | {best / base[(cap, host)]:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "host-tier"))
    args = ap.parse_args(argv)
    if not TRACE.exists():
        print(f"mooncake trace not found at {TRACE}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for key in args.models.split(","):
        model = MODELS[key]
        evict, admit = [], []
        for host in (parse_bytes(h) for h in HOST):
            for policy in host_policy_names():
                evict += sweep(model, host, pairs=(AUTO,), host_policy=policy, jobs=args.jobs)
            for host_admission in HOST_ADMISSIONS:
                admit += sweep(model, host, pairs=ADMISSION_PAIRS, host_admission=host_admission,
                               jobs=args.jobs)
        record = {"model": model, "trace": "mooncake", "gpu": GPU, "host": HOST,
                  "host_policies": host_policy_names(), "host_admissions": HOST_ADMISSIONS,
                  "eviction_runs": evict, "admission_runs": admit}
        path = out / f"policies-{key}.json"
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"\n## {key}: host eviction (token hit rate %)\n")
        print(eviction_table(evict))
        print(f"\n## {key}: per-tier admission (token hit rate %)\n")
        print(admission_table(admit))
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
