"""Build the engine tree: what a lent GPU machine lacks to import vLLM's engine, in one pack.

The GPU machine has torch, Triton, transformers and about 200 other distributions
(``benchmarks/gpu/device_packages.txt``) but no vLLM, and cannot reach a package index.
This script writes, into an ignored folder (default ``.gpu/engine``):

* ``engine-tree.tar.gz``, the pack that travels (at most 60 MiB, checked):

  - ``site/vllm/``: every file of the ``vllm`` package in vLLM's PyPI sdist
    (``vllm-0.32.0.tar.gz``, checked against PyPI's SHA-256), byte for byte, and
    ``site/LICENSE`` (vLLM's, Apache-2.0);
  - ``wheels/``: a CPython 3.12 manylinux (or pure-Python) wheel, at the version
    installed here, of every distribution that the ``vllm.LLM`` path imports on vLLM's CPU
    engine here (``trace_llm_imports.py``) and that the GPU machine does not have, except
    those vLLM imports only when present (:data:`OPTIONAL`); one version each;
  - ``trace.json``: the import trace the pack was built from;

* ``MANIFEST.json`` (beside the pack and inside it): per file, its path in the pack,
  source, SHA-256 and size; the vLLM modules the trace found compiled (vLLM's extension
  modules, which cannot travel: a GPU run takes vLLM's non-compiled paths or a stand-in).

On the GPU machine (``carry: [".gpu/engine"]``)::

    mkdir -p /tmp/engine && tar xzf .gpu/engine/engine-tree.tar.gz -C /tmp/engine &&
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/engine/site \\
        /tmp/engine/wheels/*.whl && export PYTHONPATH=/tmp/engine/site:$PWD

vLLM 0.32.0, not 0.33: it is the release every engine test here runs (so the trace and the
tree are the same code), and both releases pin a newer torch (2.13) than the GPU machine's
2.11, so neither suits it better.

    python benchmarks/gpu/make_engine_tree.py [--out .gpu/engine] [--trace FILE]

Without ``--trace`` it runs ``trace_llm_imports.py`` first (one CPU engine start). Downloads
(the sdist, about 45 MB, and the wheels) are kept in ``out/gpu-tree/dl``. Prints the pack's
size.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from compat import download_sdist  # noqa: E402

VERSION = "0.32.0"
DEFAULT_OUT = ROOT / ".gpu" / "engine"
DEFAULT_DL = ROOT / "out" / "gpu-tree" / "dl"
DEVICE_PACKAGES = Path(__file__).with_name("device_packages.txt")
PACK = "engine-tree.tar.gz"
MANIFEST = "MANIFEST.json"
#: The pack's size limit: 64 MiB travel with the working tree, the project's own files included.
LIMIT_BYTES = 60 * 2**20

#: Imported on the CPU engine here only because they are installed: vLLM imports each
#: inside ``try``/``except ImportError`` (the files named), so the pack leaves them out.
OPTIONAL: dict[str, str] = {
    "ray": "vllm/v1/executor/ray_utils.py",
    "boto3": "vllm/transformers_utils/s3_utils.py",
    "botocore": "vllm/transformers_utils/s3_utils.py (through boto3)",
    "s3transfer": "vllm/transformers_utils/s3_utils.py (through boto3)",
    "jmespath": "vllm/transformers_utils/s3_utils.py (through boto3)",
}

#: The platforms ``pip download`` may take a binary wheel for: glibc 2.17 to 2.39 (the GPU
#: machine's Python 3.12.3 image has glibc 2.39; the device tool's notes: pip matches each
#: tag exactly, so every one is named).
_PLATFORMS = (*(f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)), "manylinux2014_x86_64",
              "manylinux1_x86_64")
_FIXED_MTIME = 1_700_000_000  # the pack's entries carry one date, so the pack is reproducible


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them (``PyYAML`` -> ``pyyaml``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def device_packages(path: Path = DEVICE_PACKAGES) -> set[str]:
    """The GPU machine's distributions (normalized names) from ``device_packages.txt``."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return {normalize(line) for line in lines if line and not line.startswith("#")}


def to_carry(trace: dict, device: set[str]) -> dict[str, str]:
    """``{distribution: version}`` the pack must hold: traced, not on the device, not optional."""
    optional = {normalize(n) for n in OPTIONAL}
    return {name: ver for name, ver in trace["distributions"].items()
            if normalize(name) not in device and normalize(name) not in optional}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sdist_files(sdist: Path) -> dict[str, bytes]:
    """``{path inside the package: bytes}`` of every file of ``vllm/`` in the sdist, and
    ``LICENSE`` (the sdist's top-level licence)."""
    out: dict[str, bytes] = {}
    with tarfile.open(sdist) as tf:
        for member in tf.getmembers():
            if not member.isfile():
                continue
            parts = member.name.split("/", 1)
            if len(parts) != 2:
                continue
            rel = parts[1]
            if rel.startswith("vllm/") or rel == "LICENSE":
                fh = tf.extractfile(member)
                assert fh is not None
                out[rel] = fh.read()
    return out


def download_wheels(carry: dict[str, str], dl: Path) -> dict[str, Path]:
    """One CPython 3.12 x86-64 wheel per distribution of ``carry`` (``pip download``,
    cached in ``dl``). Raises SystemExit naming any that has no such wheel."""
    dl.mkdir(parents=True, exist_ok=True)

    def cached() -> dict[str, Path]:
        found = {}
        for whl in dl.glob("*.whl"):
            name, ver = whl.name.split("-")[:2]
            found[(normalize(name), ver)] = whl
        return found

    missing = [f"{n}=={v}" for n, v in carry.items() if (normalize(n), v) not in cached()]
    base = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
            "--python-version", "3.12", "--implementation", "cp", "-d", str(dl)]
    base += [arg for p in _PLATFORMS for arg in ("--platform", p)]
    if missing and subprocess.run(base + missing).returncode != 0:
        failed = [req for req in missing if subprocess.run(base + [req]).returncode != 0]
        if failed:
            raise SystemExit(f"make_engine_tree: no CPython 3.12 x86-64 wheel for {failed}")
    have = cached()
    return {n: have[(normalize(n), v)] for n, v in carry.items()}


def build(trace: dict, out: Path, dl: Path = DEFAULT_DL, version: str = VERSION) -> dict:
    """Write the pack and the manifest into ``out``; return the manifest.

    Raises:
        SystemExit: the trace is of another vLLM release than ``version``, a wheel is
            missing from the index, or the pack is over :data:`LIMIT_BYTES`.
    """
    if not str(trace["vllm_version"]).startswith(version):
        raise SystemExit(f"make_engine_tree: the trace is of vLLM {trace['vllm_version']}, "
                         f"the tree is {version}")
    sdist = download_sdist(version, dl)
    sdist_sha = _sha256(sdist.read_bytes())
    files = sdist_files(sdist)
    carry = to_carry(trace, device_packages())
    wheels = download_wheels(carry, dl / "wheels")
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    payload: list[tuple[str, bytes]] = []
    for rel in sorted(files):
        data = files[rel]
        payload.append((f"site/{rel}", data))
        entries.append({"path": f"site/{rel}", "source": f"{sdist.name} ({sdist_sha[:16]})",
                        "sha256": _sha256(data), "size": len(data)})
    for name in sorted(wheels, key=str.lower):
        data = wheels[name].read_bytes()
        path = f"wheels/{wheels[name].name}"
        payload.append((path, data))
        entries.append({"path": path, "source": f"PyPI {name}=={carry[name]}",
                        "sha256": _sha256(data), "size": len(data)})
    manifest = {
        "vllm_version": version,
        "sdist": {"file": sdist.name, "sha256": sdist_sha},
        "distributions": carry,
        "optional_left_out": {n: v for n, v in trace["distributions"].items()
                              if normalize(n) in {normalize(o) for o in OPTIONAL}},
        "compiled_modules": [m["name"] for m in trace["vllm_modules"] if m["compiled"]],
        "files": entries,
    }
    text = json.dumps(manifest, indent=1).encode()
    payload += [(MANIFEST, text), ("trace.json", json.dumps(trace, indent=1).encode())]
    pack = out / PACK
    with tarfile.open(pack, "w:gz", compresslevel=9) as tf:
        for path, data in payload:
            info = tarfile.TarInfo(path)
            info.size, info.mtime, info.mode = len(data), _FIXED_MTIME, 0o644
            tf.addfile(info, io.BytesIO(data))
    (out / MANIFEST).write_bytes(text)
    size = pack.stat().st_size
    manifest["pack_bytes"] = size
    if size > LIMIT_BYTES:
        raise SystemExit(f"make_engine_tree: {pack} is {size / 2**20:.1f} MiB, over the "
                         f"{LIMIT_BYTES / 2**20:.0f} MiB limit")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the pack")
    ap.add_argument("--trace", type=Path,
                    help="a trace_llm_imports.py JSON (default: trace now, one engine start)")
    ap.add_argument("--dl", type=Path, default=DEFAULT_DL, help="download cache")
    args = ap.parse_args(argv)
    if args.trace is None:
        args.trace = Path(tempfile.mkdtemp(prefix="engine_trace_")) / "trace.json"
        subprocess.run([sys.executable, str(Path(__file__).with_name("trace_llm_imports.py")),
                        "--out", str(args.trace)], check=True)
    manifest = build(json.loads(args.trace.read_text()), args.out, args.dl)
    n_wheels = sum(e["path"].startswith("wheels/") for e in manifest["files"])
    print(f"engine tree: {args.out / PACK}, {manifest['pack_bytes'] / 2**20:.1f} MiB "
          f"(limit {LIMIT_BYTES / 2**20:.0f}): vLLM {manifest['vllm_version']} "
          f"({len(manifest['files']) - n_wheels} files), {n_wheels} wheels; "
          f"{len(manifest['compiled_modules'])} compiled vLLM modules not carried")
    return 0


if __name__ == "__main__":
    sys.exit(main())
