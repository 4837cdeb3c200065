"""The learned eviction policy on the Mooncake conversation trace: its hit rate beside
stock's (``vllm`` + ``lru``) and ``vllm`` + ``belady`` (results 8), its simulator time
beside ``lru``'s in the same run, and a feature ablation (each feature hidden from the
model in turn, Qwen3-Next at 64 GiB).

Writes ``docs/results/learned/learned.json`` and prints the tables ``docs/results.md``
section 9 quotes. Run: ``python simulations/learned_study.py`` (about 10 minutes on 2
cores; ``--no-ablation`` about 3). Deterministic but for wall times.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from headroom import CAPACITIES, MODELS, MOONCAKE, ROOT  # the headroom study's cells (results 8)

from vllm_admission.core.costs import load_model
from vllm_admission.core.eviction import EVICTION_POLICIES
from vllm_admission.core.eviction.learned import LearnedEviction
from vllm_admission.core.eviction.learning import FEATURES, LightGBMTrainer, Predictor
from vllm_admission.core.geometry import parse_bytes
from vllm_admission.core.traces import load_trace
from vllm_admission.sim.simulation_settings import SimulationSettings
from vllm_admission.sim.simulator import simulate


class _Hidden:
    """A predictor that sees column ``j`` as unknown (NaN)."""

    def __init__(self, model: Predictor, j: int) -> None:
        self.model, self.j = model, j

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        rows = rows.copy()
        rows[:, self.j] = np.nan
        return self.model(rows)


class _HidingTrainer(LightGBMTrainer):
    """Fits and predicts with feature ``j`` hidden (inline, for a fair wall time)."""

    def __init__(self, j: int) -> None:
        super().__init__(background=False)
        self.j = j

    def fit(self, x: np.ndarray, y: np.ndarray) -> Predictor:
        x = x.copy()
        x[:, self.j] = np.nan
        return _Hidden(super().fit(x, y), self.j)


def _run(trace: Any, costs: Any, eviction: str, capacity: str) -> tuple[float, float]:
    settings = SimulationSettings.of("vllm", eviction,
                                  capacity_bytes=parse_bytes(capacity), chunk_size=8192)
    t0 = time.process_time()
    result = simulate(trace, costs, settings)
    return result.token_hit_rate, time.process_time() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-ablation", action="store_true", help="skip the feature ablation")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "learned" / "learned.json"))
    args = ap.parse_args(argv)
    if not MOONCAKE.exists():
        print(f"mooncake trace not found at {MOONCAKE}", file=sys.stderr)
        return 2
    trace = load_trace(str(MOONCAKE))
    rows = []
    for label, model in MODELS.items():
        costs = load_model(model)
        for cap in CAPACITIES:
            row: dict[str, Any] = {"model": label, "capacity": cap}
            for ev in ("lru", "learned"):
                hit, cpu = _run(trace, costs, ev, cap)
                row[ev] = hit
                row[f"{ev}_cpu_s"] = round(cpu, 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    ablation = []
    if not args.no_ablation:
        costs = load_model(MODELS["Qwen3-Next"])
        for j, name in enumerate(FEATURES):
            cls = type(f"Hide{j}", (LearnedEviction,), {
                "name": f"learned-without-{name}", "summary": f"learned, {name} hidden",
                "__init__": lambda self, _j=j: LearnedEviction.__init__(self, trainer=_HidingTrainer(_j))})
            EVICTION_POLICIES.register(cls)
            hit, _ = _run(trace, costs, cls.name, "64GiB")
            ablation.append({"hidden": name, "token_hit_rate": hit})
            print(json.dumps(ablation[-1]), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"trace": "mooncake/conversation_trace.jsonl", "admission": "vllm",
                               "rows": rows, "ablation_qwen3_next_64GiB": ablation}, indent=2) + "\n")
    print("| model | capacity | stock `vllm`+`lru` | `vllm`+`learned` | ratio | CPU s lru / learned |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['capacity']} | {100 * r['lru']:.2f} % | {100 * r['learned']:.2f} % | "
              f"{r['learned'] / r['lru']:.2f}x | {r['lru_cpu_s']} / {r['learned_cpu_s']} |")
    if ablation:
        full = next(r["learned"] for r in rows if r["model"] == "Qwen3-Next" and r["capacity"] == "64GiB")
        print("| feature hidden | hit rate | change (points) |")
        print("|---|---|---|")
        for a in ablation:
            print(f"| {a['hidden']} | {100 * a['token_hit_rate']:.2f} % | "
                  f"{100 * (a['token_hit_rate'] - full):+.2f} |")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
