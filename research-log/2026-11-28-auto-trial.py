"""Trial: auto+auto (and with --stock, vllm+lru) on study cells; prints token hit rates.

With the fork patch applied to a checkout: ``AUTO_TRIAL=2 AUTO_GUARD=0 python
research-log/2026-11-28-auto-trial.py moon-q held-n mtp-q`` (groups: GROUPS below).
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "simulations"))
import auto_study as au
import serving_settings_study as ss

from vllm_admission.core.geometry import parse_bytes
from vllm_admission.sim.sweep import SweepSpec, run_sweep

MOON = str(ss.MOONCAKE)
HELD = au.TRACES["mooncake-synthetic"][0]
Q, N = ss.MODELS["qwen3next"], ss.MODELS["nemotron3nano"]
GROUPS = {
      "mtp-q": ("synthetic", Q, ("2GiB", "4GiB", "8GiB"), 1),
      "mtp-n": ("synthetic", N, ("1GiB", "2GiB", "4GiB"), 1),
      "syn-q": ("synthetic", Q, ("2GiB", "4GiB", "8GiB"), 0),
      "syn-n": ("synthetic", N, ("1GiB", "2GiB", "4GiB"), 0),
      "moon-q": (MOON, Q, ("64GiB", "128GiB"), 0),
      "moon-q-mtp": (MOON, Q, ("64GiB", "128GiB"), 1),
      "moon-n": (MOON, N, ("32GiB", "64GiB"), 0),
      "held-q": (HELD, au.MODELS["qwen3-next"], ("32GiB", "64GiB", "128GiB"), 0),
      "held-n": (HELD, au.MODELS["nemotron-3-nano"], ("32GiB", "64GiB", "128GiB"), 0),
}
pairs = (("auto", "auto"),) if "--stock" not in sys.argv else (("vllm", "lru"), ("auto", "auto"))
if __name__ == "__main__":
  for g in [a for a in sys.argv[1:] if not a.startswith("--")]:
      trace, model, caps, k = GROUPS[g]
      t = time.time()
      spec = SweepSpec(trace=trace, model=model, capacities=tuple(parse_bytes(c) for c in caps),
                       admissions=(), evictions=(), pairs=pairs, chunk_size=8192,
                       num_speculative_tokens=k, shadow_rate=1.0)
      doc = run_sweep(spec, jobs=2, progress=False)
      rows = sorted(doc["runs"], key=lambda r: (r["capacity_bytes"], r["admission"]))
      print(g, " / ".join(f"{r['admission']}@{r['capacity_bytes']>>30}G={100*r['token_hit_rate']:.2f}"
                          f"(sw{len(r['policy_switches'])})" for r in rows),
            f"[{time.time()-t:.0f}s]", flush=True)
