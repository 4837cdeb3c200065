"""``make bench``: every benchmark, one after the other.

* ``simulator_bench.py``: simulator speed and memory on the full Mooncake trace;
* ``scheduler_overhead.py``: the plugin's scheduler overhead against stock vLLM;
* ``inpass_engine_bench.py``: time to first token, ``inpass`` against ``split``
  checkpoints, on the CPU engine, for the tiny Gated DeltaNet model and the tiny
  Mamba2 model (about 5 minutes each).

* ``gpu_inpass_bench.py``: the in-pass capture and the state copy op against split mode,
  on a CUDA device only, with vLLM's kernel files gathered by ``gpu/make_kernel_tree.py``.

The plugin benchmarks need vLLM (skipped with a message when it is not importable).

Results land in ``benchmarks/results/``; ``docs/benchmarks.md`` records them.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    rc = subprocess.call([sys.executable, str(HERE / "simulator_bench.py")])
    overhead = HERE / "scheduler_overhead.py"
    if not overhead.exists():
        print("scheduler_overhead.py not present; skipping the plugin benchmark")
    elif importlib.util.find_spec("vllm") is None:
        print("vLLM is not installed; skipping the plugin scheduler-overhead benchmark")
    else:
        rc = subprocess.call([sys.executable, str(overhead)]) or rc
        rc = subprocess.call([sys.executable, str(overhead), "--async-scheduling"]) or rc
        for arch in ("qwen3-next", "nemotron-h"):
            rc = subprocess.call([sys.executable, str(HERE / "inpass_engine_bench.py"), "--arch", arch]) or rc
    if not _cuda():
        print("no CUDA device; skipping gpu_inpass_bench.py (docs/benchmarks.md has an H200 run)")
    elif importlib.util.find_spec("vllm") is not None:
        rc = subprocess.call([sys.executable, str(HERE / "gpu" / "make_kernel_tree.py")]) or rc
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), str(HERE.parent / ".gpu" / "kernels")]))
        rc = subprocess.call([sys.executable, str(HERE / "gpu_inpass_bench.py"), "--json",
                              str(HERE / "results" / "gpu" / "latest.json")], env=env) or rc
    return rc


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
