"""Trial: ``auto`` + ``auto`` (and with ``--stock``, ``vllm`` + ``lru``) on study cells, full
shadows; prints token hit rates and the switch count, and writes each group's runs with their
switch records to ``/tmp/trial-<tag>-<group>.json``.

Groups: ``GROUPS`` below (the cells where ``auto`` lost to stock, and those whose gains the
issue keeps). Options: ``--tag=NAME`` names the output files; ``--written`` registers the
scratch admission ``written`` (every state the engine writes, the junction a chunk stop) as a
fifth ``auto`` candidate (2026-11-29). With ``2026-11-29-auto-margin.patch`` applied,
``--margin=M`` sets ``SweepSpec.auto_margin``.

    python research-log/2026-11-29-auto-trial.py held-n moon-q --stock --tag=main
"""
import json
import runpy
import sys
import time
from pathlib import Path

from vllm_admission.core.geometry import parse_bytes
from vllm_admission.sim.sweep import SweepSpec, run_sweep

HERE = Path(__file__).resolve().parent
# The 2026-11-28 runner's groups, extended: one definition of the cells both days ran.
_EARLIER = runpy.run_path(str(HERE / "2026-11-28-auto-trial.py"))
MOON, HELD, Q, N = (_EARLIER[k] for k in ("MOON", "HELD", "Q", "N"))
au = _EARLIER["au"]
#: group -> (trace, model, capacities, MTP draft tokens[, prefix match unit])
GROUPS = {
    **_EARLIER["GROUPS"],
    "mtp2-n": ("synthetic", N, ("1GiB", "2GiB", "4GiB"), 2),
    "u16-q": ("synthetic", Q, ("2GiB", "4GiB", "8GiB"), 0, 16),
    "u16-n": ("synthetic", N, ("1GiB", "2GiB", "4GiB"), 0, 16),
    "u16-n-mtp": ("synthetic", N, ("1GiB", "2GiB", "4GiB"), 1, 16),
    "moon-q": (MOON, Q, ("64GiB", "128GiB", "256GiB"), 0),   # 256 GiB added
    "held-q-big": (HELD, au.MODELS["qwen3-next"], ("256GiB", "512GiB"), 0),
    "held-n-big": (HELD, au.MODELS["nemotron-3-nano"], ("256GiB", "512GiB"), 0),
}


def register_written() -> None:
    from vllm_admission.core.admission import CheckpointKind, register_admission
    from vllm_admission.core.admission.policies import AdmissionPolicy

    @register_admission
    class Written(AdmissionPolicy):
        name = "written"
        summary = "every state the engine writes, the junction a chunk stop (trial)"
        auto_candidate = True
        admitted = frozenset(CheckpointKind)

        def junction(self, probe):
            return probe.junction


def main(argv: list[str]) -> None:
    opts = {a.split("=")[0]: a.partition("=")[2] for a in argv if a.startswith("--")}
    if "--written" in opts:
        register_written()
    pairs = (("vllm", "lru"), ("auto", "auto")) if "--stock" in opts else (("auto", "auto"),)
    extra = {"auto_margin": float(opts["--margin"])} if "--margin" in opts else {}
    tag = opts.get("--tag") or "trial"
    for g in [a for a in argv if not a.startswith("--")]:
        trace, model, caps, k, *unit = GROUPS[g]
        t = time.time()
        spec = SweepSpec(trace=trace, model=model, capacities=tuple(parse_bytes(c) for c in caps),
                         admissions=(), evictions=(), pairs=pairs, chunk_size=8192,
                         num_speculative_tokens=k, shadow_rate=1.0,
                         hash_block_size=unit[0] if unit else None, **extra)
        doc = run_sweep(spec, jobs=2, progress=False)
        rows = sorted(doc["runs"], key=lambda r: (r["capacity_bytes"], r["admission"]))
        Path(f"/tmp/trial-{tag}-{g}.json").write_text(json.dumps(rows, default=str))
        print(tag, g, " / ".join(f"{r['admission']}@{r['capacity_bytes'] >> 30}G="
                                 f"{100 * r['token_hit_rate']:.2f}(sw{len(r['policy_switches'])})"
                                 for r in rows), f"[{time.time() - t:.0f}s]", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
