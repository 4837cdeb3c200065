"""``auto`` with a margin over stock and ``written`` among its candidates, on every cell of
the ``auto`` study (split, in-pass and on the default sampled shadows), the serving-settings
study, the retention study and the two-tier study (``docs/results.md`` section 5.6).

The setting an operator can leave on: ``VLLM_ADMISSION_AUTO_MARGIN=0.3`` and
``VLLM_ADMISSION_AUTO_ADMISSIONS=last,vllm,marconi,dense,written`` (``block`` joins under a
hash unit finer than the block, as it does by default). Each cell runs ``auto`` + ``auto``
only, with the shadows its study ran (full in the ``auto``, in-pass, serving-settings and
retention studies, the default sampled ones in the sampled-shadow and two-tier studies);
stock and the default
``auto`` are read from those studies' own results (``docs/results/auto``,
``docs/results/serving-settings``, ``docs/results/retention``, ``docs/results/host-tier``,
``docs/results/auto-sampled``),
so run those first.

Writes ``docs/results/auto-margin/results.json`` (one row per cell) and prints the tables.

Run: ``python simulations/auto_margin_study.py --jobs 2`` (about 40 minutes on 2 cores);
``--tables`` reprints them from the file. Deterministic but for wall times.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import auto_study
import host_tier_study
import serving_settings_study as settings_study

from vllm_admission.core.adaptive import AUTO
from vllm_admission.core.geometry import parse_bytes
from vllm_admission.sim.sweep import SweepSpec, run_sweep

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results" / "auto-margin"
MARGIN = 0.3
#: --studies name -> the study named in the rows.
STUDIES = {"auto": "auto", "serving-settings": "serving settings", "retention": "retention",
           "two-tiers": "two tiers", "inpass": "in-pass", "sampled": "sampled shadows"}
ADMISSIONS = ("last", "vllm", "marconi", "dense", "written")


def cells() -> list[dict]:
    """Every cell: where its stock and default ``auto`` runs are, and the sweep settings."""
    out = []
    for trace, (path, caps) in auto_study.TRACES.items():
        for model_key, model in auto_study.MODELS.items():
            out.append({"study": "auto", "trace": trace, "model": model_key, "setting": "",
                        "path": path, "model_name": model, "caps": caps, "unit": None,
                        "block": None, "spec": 0,
                        "baseline": ROOT / "docs" / "results" / "auto" / f"{trace}-{model_key}"})
    for trace in ("synthetic", "mooncake"):
        for model_key, model in settings_study.MODELS.items():
            for name, (unit, block, spec) in settings_study.SETTINGS.items():
                out.append({"study": "serving settings", "trace": trace, "model": model_key,
                            "setting": name,
                            "path": str(settings_study.MOONCAKE) if trace == "mooncake" else "synthetic",
                            "model_name": model, "caps": settings_study.CAPACITIES[trace, model_key],
                            "unit": unit, "block": block, "spec": spec,
                            "baseline": settings_study.ROOT / "docs" / "results" / "serving-settings"
                            / f"{trace}-{model_key}-{name}"})
    retention = ROOT / "docs" / "results" / "retention"
    for folder in sorted(retention.iterdir()):
        doc = json.loads((folder / "results.json").read_text())
        caps = sorted({r["capacity_bytes"] for r in doc["runs"] if r["admission"] == AUTO})
        if not caps:
            continue   # an operator's fixed pair, no auto run
        trace, model_key = folder.name.rsplit("-", 2)[0], folder.name.rsplit("-", 2)[1]
        interval = doc["retention_interval"]
        out.append({"study": "retention", "trace": trace, "model": model_key,
                    "setting": f"retention {'none' if interval is None else interval}",
                    "path": str(settings_study.MOONCAKE) if trace == "mooncake" else "synthetic",
                    "model_name": settings_study.MODELS[model_key], "caps": caps, "unit": None,
                    "block": None, "spec": 0, "retention": interval, "shadow_rate": 1.0,
                    "runs": doc["runs"]})
    for path in sorted((ROOT / "docs" / "results" / "host-tier").glob("*.json")):
        doc = json.loads(path.read_text())
        if path.name.startswith("policies-") or "runs" not in doc:
            continue   # the host-policy study: no auto run
        model_key = next(k for k in host_tier_study.MODELS if path.stem.startswith(k))
        trace = path.stem[len(model_key) + 1:]
        for host in sorted({r["host_bytes_asked"] for r in doc["runs"]}):
            runs = [r for r in doc["runs"] if r["host_bytes_asked"] == host]
            out.append({"study": "two tiers", "trace": trace, "model": model_key,
                        "setting": f"host {host_tier_study._label(host)}",  # noqa: SLF001
                        "path": str(host_tier_study.TRACES[trace]),
                        "model_name": host_tier_study.MODELS[model_key],
                        "caps": sorted({r["capacity_bytes"] for r in runs}), "unit": None,
                        "block": None, "spec": 0, "host": host, "shadow_rate": None,
                        "runs": runs})
    for trace in ("mooncake", "synthetic"):
        for model_key, model in auto_study.MODELS.items():
            path, caps = auto_study.TRACES[trace]
            out.append({"study": "in-pass", "trace": trace, "model": model_key, "setting": "in-pass",
                        "path": path, "model_name": model, "caps": caps, "unit": None,
                        "block": None, "spec": 0, "checkpoint": "inpass",
                        "baseline": ROOT / "docs" / "results" / "auto" / f"{trace}-{model_key}-inpass"})
    sampled = json.loads((ROOT / "docs" / "results" / "auto-sampled" / "results.json").read_text())
    for trace, (path, caps) in auto_study.TRACES.items():
        for model_key, model in auto_study.MODELS.items():
            mine = [r for r in sampled if (r["trace"], r["model"]) == (trace, model_key)]
            runs = [{"admission": a, "eviction": e, "capacity_bytes": parse_bytes(r["capacity"]),
                     "token_hit_rate": r[k]["hit"]}
                    for r in mine for (a, e, k) in (("vllm", "lru", "stock"), (AUTO, AUTO, "sampled"))]
            out.append({"study": "sampled shadows", "trace": trace, "model": model_key,
                        "setting": "sampled", "path": path, "model_name": model, "caps": caps,
                        "unit": None, "block": None, "spec": 0, "shadow_rate": None, "runs": runs})
    return out


def run_cell(cell: dict, jobs: int) -> list[dict]:
    """The cell's rows: per capacity, stock, the default ``auto`` and ``auto`` with the margin."""
    base = cell.get("runs") or json.loads((Path(cell["baseline"]) / "results.json").read_text())["runs"]
    by = {(r["admission"], r["eviction"], r["capacity_bytes"]): r for r in base}
    admissions = ADMISSIONS + (("block",) if cell["unit"] else ())
    caps = tuple(c if isinstance(c, int) else parse_bytes(c) for c in cell["caps"])
    spec = SweepSpec(trace=cell["path"], model=cell["model_name"], capacities=caps,
                     admissions=(AUTO,), evictions=(AUTO,), chunk_size=8192,
                     hash_block_size=cell["unit"], block_size=cell["block"],
                     num_speculative_tokens=cell["spec"], checkpoint=cell.get("checkpoint", "split"),
                     retention_interval=cell.get("retention", 0),
                     host_bytes=cell.get("host", 0),
                     shadow_rate=cell.get("shadow_rate", 1.0),
                     auto_margin=MARGIN, auto_admissions=admissions)
    rows = []
    for r in run_sweep(spec, jobs=jobs, progress=False)["runs"]:
        cap = r["capacity_bytes"]
        stock, default = by[("vllm", "lru", cap)], by[(AUTO, AUTO, cap)]
        rows.append({k: cell[k] for k in ("study", "trace", "model", "setting")} | {
            "capacity_bytes": cap, "stock": stock["token_hit_rate"],
            "auto": default["token_hit_rate"], "auto_margin": r["token_hit_rate"],
            "final_policy": r["final_policy"], "switches": len(r["policy_switches"]),
            "wall_seconds": r["wall_seconds"]})
    return rows


def _cap(n: int) -> str:
    return f"{n / (1 << 40):g} TiB" if n >= 1 << 40 else f"{n / (1 << 30):g} GiB"


def tables(rows: list[dict]) -> str:
    """Markdown: one table per study, a line per trace, model and setting."""
    out = []
    for study in dict.fromkeys(r["study"] for r in rows):
        out += [f"\n**{study} study** (token hit rate %, stock / default `auto` / `auto` with the "
                f"margin):\n",
                "| trace, model, setting | capacities | stock | `auto` | `auto`, margin 0.3 "
                "| margin − stock, worst |",
                "|---|---|---|---|---|---|"]
        groups: dict[tuple, list[dict]] = {}
        for r in rows:
            if r["study"] == study:
                groups.setdefault((r["trace"], r["model"], r["setting"]), []).append(r)
        for (trace, model, setting), rs in groups.items():
            rs.sort(key=lambda r: r["capacity_bytes"])
            stock, auto, margin = (" / ".join(f"{100 * r[k]:.2f}" for r in rs)
                                   for k in ("stock", "auto", "auto_margin"))
            worst = min(100 * (r["auto_margin"] - r["stock"]) for r in rs)
            out.append(f"| {trace}, {model}{', ' + setting if setting else ''} | "
                       f"{' / '.join(_cap(r['capacity_bytes']) for r in rs)} | {stock} | "
                       f"{auto} | {margin} | {worst:+.2f} |")
    below = [r for r in rows if r["auto_margin"] - r["stock"] < -0.001]
    out.append(f"\n{len(rows)} cells; `auto` with the margin below stock by more than 0.1 "
               f"points in {sum(r['auto_margin'] - r['stock'] < -0.001 for r in rows)}: "
               + (", ".join(f"{r['trace']} {r['model']} {r['setting']} {_cap(r['capacity_bytes'])} "
                            f"{100 * (r['auto_margin'] - r['stock']):+.2f}" for r in below) or "none"))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--tables", action="store_true", help="reprint the tables from the file")
    ap.add_argument("--studies", default=",".join(STUDIES),
                    help=f"comma list of {', '.join(STUDIES)}: run these, keep the file's "
                         f"rows of the others")
    args = ap.parse_args(argv)
    path = OUT / "results.json"
    chosen = {STUDIES[k] for k in args.studies.split(",") if k in STUDIES}
    if len(chosen) != len(args.studies.split(",")):
        ap.error(f"--studies takes names from {', '.join(STUDIES)}")
    if args.tables:
        rows = json.loads(path.read_text())["rows"]
    else:
        if not settings_study.MOONCAKE.exists():
            print(f"mooncake trace not found at {settings_study.MOONCAKE}", file=sys.stderr)
            return 2
        kept = json.loads(path.read_text())["rows"] if path.exists() else []
        rows = [r for r in kept if r["study"] not in chosen]
        for cell in cells():
            if cell["study"] not in chosen:
                continue
            rows += run_cell(cell, args.jobs)
            print(f"{cell['trace']} {cell['model']} {cell['setting']}: done", flush=True)
        OUT.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"margin": MARGIN, "admissions": list(ADMISSIONS),
                                    "shadow_rate": 1.0, "rows": rows}, indent=1) + "\n")
        print(f"wrote {path}")
    print(tables(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
