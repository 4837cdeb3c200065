"""The GPU machine's engine tree (``benchmarks/gpu/make_engine_tree.py``), checked here.

A fresh import trace of the ``vllm.LLM`` path on the CPU engine (its own process), then the
pack built from it (downloads into ``out/gpu-tree/dl``, once): every vLLM module the path
imported is in the pack, byte for byte the sdist's file, unless it is compiled; the pack
carries a CPython 3.12 x86-64 wheel for every other distribution the path imported that the
GPU machine lacks (and that vLLM does not import only when present), one version each; the
pack is under its size limit.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

import make_engine_tree as tree  # noqa: E402


def test_the_pack_carries_what_the_device_lacks_and_nothing_optional():
    trace = {"distributions": {"PyYAML": "6.0", "pydantic_core": "2.5", "ray": "2.9",
                               "Torch": "2.13", "msgspec": "0.22"}}
    device = {tree.normalize(n) for n in ("pyyaml", "torch")}
    assert tree.to_carry(trace, device) == {"pydantic_core": "2.5", "msgspec": "0.22"}


def test_the_device_list_holds_the_gpu_stack():
    device = tree.device_packages()
    assert {"torch", "triton", "transformers", "numpy"} <= device
    assert "vllm" not in device and "pydantic" not in device


@pytest.fixture(scope="module")
def built(tiny_model_of, tmp_path_factory):
    pytest.importorskip("vllm")
    out = tmp_path_factory.mktemp("engine_tree")
    trace_path = out / "trace.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu/trace_llm_imports.py"),
                    "--out", str(trace_path), "--model", str(tiny_model_of("qwen3-next"))],
                   check=True, cwd=ROOT)
    trace = json.loads(trace_path.read_text())
    manifest = tree.build(trace, out)
    print(f"engine tree: {manifest['pack_bytes'] / 2**20:.1f} MiB "
          f"(limit {tree.LIMIT_BYTES / 2**20:.0f} MiB)")
    with tarfile.open(out / tree.PACK) as tf:
        members = {m.name: m for m in tf.getmembers()}
        sha = {name: hashlib.sha256(tf.extractfile(m).read()).hexdigest()
               for name, m in members.items()}
    return trace, manifest, sha, out


@pytest.mark.engine
def test_every_traced_vllm_module_is_in_the_tree(built):
    trace, manifest, sha, _ = built
    pure = [m["name"] for m in trace["vllm_modules"] if not m["compiled"]]
    assert len(pure) > 500
    missing = []
    for name in pure:
        rel = "site/" + name.replace(".", "/")
        if f"{rel}.py" not in sha and f"{rel}/__init__.py" not in sha:
            missing.append(name)
    assert missing == []
    # Which compiled modules the trace sees depends on the CPU (vLLM's AVX2 and AVX-512
    # libraries load without a ``vllm._C`` entry in ``sys.modules``); none of them travels.
    compiled = [m["name"] for m in trace["vllm_modules"] if m["compiled"]]
    assert compiled == manifest["compiled_modules"]
    assert not any(name.endswith((".so", ".pyd")) for name in sha)


@pytest.mark.engine
def test_the_tree_is_the_sdists_files_byte_for_byte(built):
    _, manifest, sha, _ = built
    sdist = tree.DEFAULT_DL / manifest["sdist"]["file"]
    assert hashlib.sha256(sdist.read_bytes()).hexdigest() == manifest["sdist"]["sha256"]
    want = {f"site/{rel}": hashlib.sha256(data).hexdigest()
            for rel, data in tree.sdist_files(sdist).items()}
    generated = set(tree.generated_files(manifest["vllm_version"]))
    got = {name: digest for name, digest in sha.items()
           if name.startswith("site/") and name not in generated}
    assert got == want
    assert generated <= set(sha)
    listed = {e["path"]: e["sha256"] for e in manifest["files"]}
    assert {k: v for k, v in listed.items()
            if k.startswith("site/") and k not in generated} == want
    made = {e["path"] for e in manifest["files"] if e["source"].startswith("generated")}
    assert made == generated


@pytest.mark.engine
def test_the_wheels_cover_what_the_device_lacks_one_version_each(built):
    trace, manifest, sha, _ = built
    device = tree.device_packages()
    needed = {tree.normalize(n) for n in trace["distributions"]} - device - tree.OPTIONAL_NAMES
    wheels = [name.removeprefix("wheels/") for name in sha if name.startswith("wheels/")]
    carried = [tree.normalize(w.split("-")[0]) for w in wheels]
    assert sorted(carried) == sorted(needed)  # every one, and one version each
    for w in wheels:
        python, abi, platform = w.removesuffix(".whl").split("-")[-3:]
        assert platform == "any" or "x86_64" in platform, w
        assert any(_runs_on_cpython_312(tag, abi) for tag in python.split(".")), w
    assert {tree.normalize(n) for n in manifest["optional_left_out"]} <= tree.OPTIONAL_NAMES


def _runs_on_cpython_312(python_tag: str, abi: str) -> bool:
    if python_tag in ("py3", "py2.py3"):
        return True
    if not python_tag.startswith("cp3"):
        return False
    minor = int(python_tag[3:])
    return minor == 12 or (abi == "abi3" and minor <= 12)


@pytest.mark.engine
def test_the_pack_is_under_its_limit(built):
    _, manifest, _, _ = built
    assert 0 < manifest["pack_bytes"] <= tree.LIMIT_BYTES


_PLATFORM_PROBE = """
import importlib.metadata as md, json, sys, torch
import vllm
eps = [e for e in md.entry_points(group="vllm.platform_plugins") if e.name == "cuda_tree"]
hook = eps[0].load()
here = hook()
import vllm.platforms.cuda as cuda  # imports with the stand-in for its compiled library
assert cuda.CudaPlatform.device_type == "cuda"
torch.cuda.is_available = lambda: True
torch.version.cuda = torch.version.cuda or "13.0"
answer = hook()
ops = [f"{ns}.{name}" for ns, names in (("_moe_C", ("topk_softmax", "moe_align_block_size",
       "moe_sum")), ("_C", ("silu_and_mul", "relu_squared"))) for name in names
       if hasattr(getattr(torch.ops, ns), name)]
print(json.dumps({"file": vllm.__file__, "version": md.version("vllm"), "here": here,
                  "cuda": answer, "ops": ops,
                  "flash_attn": sys.modules["vllm.vllm_flash_attn"].is_fa_version_supported(2)}))
"""


@pytest.mark.engine
def test_the_tree_chooses_cuda_through_vllms_platform_plugin_group(built, tmp_path):
    """Unpacked, the tree's ``vllm`` shadows the CPU build here, its generated metadata names
    the release, vLLM's CUDA platform module imports, and the tree's plugin in vLLM's
    ``vllm.platform_plugins`` group answers CUDA exactly where torch sees a CUDA device."""
    *_, out = built
    with tarfile.open(out / tree.PACK) as tf:
        tf.extractall(tmp_path, filter="data")
    site = tmp_path / "site"
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "PATH": "/usr/bin:/bin"}
    probe = subprocess.run([sys.executable, "-c", _PLATFORM_PROBE], capture_output=True,
                           text=True, env=env, cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr[-2000:]
    got = json.loads(probe.stdout.strip().splitlines()[-1])
    assert got["file"].startswith(str(site))
    assert got["version"] == tree.VERSION
    assert got["here"] is None  # this machine has no CUDA device
    assert got["cuda"] == "vllm.platforms.cuda.CudaPlatform"
    # Answering CUDA, it installed the stand-ins the tree's vLLM needs (it has no compiled op).
    assert got["ops"] == ["_moe_C.topk_softmax", "_moe_C.moe_align_block_size",
                          "_moe_C.moe_sum", "_C.silu_and_mul", "_C.relu_squared"]
    assert got["flash_attn"] is False
