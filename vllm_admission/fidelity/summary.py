"""``fidelity.json`` and ``fidelity.png`` on disk, and the text table the CLI prints."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

__all__ = ["format_fidelity", "plot_fidelity", "write_fidelity"]


def plot_fidelity(doc: dict[str, Any], path: str | os.PathLike) -> Path:
    """Scatter per request, simulator (x) against engine (y), one panel per record."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = doc["records"]
    cols = min(4, max(1, len(recs)))
    rows = math.ceil(len(recs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
    for ax, rec in zip(axes.flat, recs, strict=True):
        pr = rec["per_request"]
        pairs = [(s, e) for s, e in zip(pr["simulator"], pr["engine"], strict=True) if s is not None and e is not None]
        xs = [p[0] for p in pairs]
        ys = [p[1] for p in pairs]
        top = max(xs + ys + [1])
        ax.plot([0, top], [0, top], color="0.7", lw=0.8)
        same = [(x, y) for x, y in pairs if x == y]
        diff = [(x, y) for x, y in pairs if x != y]
        if same:
            ax.scatter(*zip(*same, strict=True), s=8, color="tab:blue", label="equal")
        if diff:
            ax.scatter(*zip(*diff, strict=True), s=14, color="tab:red", marker="x", label="differ")
        ax.set_title(f"{rec['admission']}+{rec['eviction']}, {rec['num_blocks']} blocks\n"
                     f"{rec['requests_differing']}/{rec['requests']} differ, "
                     f"{100 * rec['abs_diff_fraction']:.2f}% tokens", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("simulator hit tokens", fontsize=7)
        ax.set_ylabel("engine cached tokens", fontsize=7)
    for ax in list(axes.flat)[len(recs):]:
        ax.axis("off")
    st = doc["settings"]
    what = Path(str(st["trace"])).name
    if st["mode"] == "timed":
        what += f", timed replay (time scale {st['time_scale']:g})"
    else:
        what += ", sequential replay"
    if st.get("ssm_dtype") is not None:
        what += f", SSM state {st['ssm_dtype']}"
    fig.suptitle(f"{what}\nengine cached tokens against the simulator's hit, per request",
                 fontsize=9)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def write_fidelity(doc: dict[str, Any], out_dir: str | os.PathLike) -> tuple[Path, Path]:
    """Write ``fidelity.json`` and ``fidelity.png`` under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    js = out / "fidelity.json"
    js.write_text(json.dumps(doc, indent=1) + "\n")
    return js, plot_fidelity(doc, out / "fidelity.png")


def format_fidelity(doc: dict[str, Any]) -> str:
    """A plain-text table of the records, under a line naming the SSM state dtype when known.

    ``steps eng/sim`` is the total of prefill steps, engine / simulator (``-``
    for a side that did not count them, e.g. a record written before they were).
    """
    st = doc.get("settings", {})
    title = []
    if st.get("ssm_dtype") is not None:
        title = [f"SSM state {st['ssm_dtype']} (engine mamba_ssm_cache_dtype "
                 f"{st.get('mamba_ssm_cache_dtype')})"]
    head = (f"{'admission':<9} {'eviction':<8} {'blocks':>6} {'reqs':>5} {'differ':>6} "
            f"{'diff %':>7} {'engine hit':>10} {'sim hit':>8} {'steps eng/sim':>13} "
            f"{'prefill s':>9} {'vs stock':>8}")
    lines = [*title, head, "-" * len(head)]
    for r in doc["records"]:
        e, s = r["engine"], r["simulator"]
        ratio = e.get("prefill_seconds_vs_stock")
        lines.append(
            f"{r['admission']:<9} {r['eviction']:<8} {r['num_blocks']:>6} {r['requests']:>5} "
            f"{r['requests_differing']:>6} {100 * r['abs_diff_fraction']:>7.3f} "
            f"{100 * e['token_hit_rate']:>9.2f}% {100 * s['token_hit_rate']:>7.2f}% "
            f"{_steps(e.get('prefill_steps'), s.get('prefill_steps')):>13} "
            f"{e['prefill_seconds']:>9.1f} {'-' if ratio is None else f'{ratio:.3f}':>8}")
    return "\n".join(lines)


def _steps(engine: int | None, simulator: int | None) -> str:
    return f"{'-' if engine is None else engine}/{'-' if simulator is None else simulator}"
