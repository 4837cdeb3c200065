"""``vllm_admission.hotpath``: the finder that runs sources instead of extension modules.

Runs on any install (no compiled build needed): a package with a ``.py`` and a stand-in
extension file beside it, in a temporary directory.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types

from vllm_admission import hotpath

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
NAME = "vllm_admission.core.free_blocks"   # a name of COMPILED


def package(tmp_path, ext_age: float):
    """A directory holding ``free_blocks.py`` and a stand-in extension module ``ext_age``
    seconds older than it (negative: newer)."""
    src = tmp_path / "free_blocks.py"
    src.write_text("X = 1\n")
    ext = tmp_path / f"free_blocks{SUFFIX}"
    ext.write_bytes(b"not a real extension module")
    now = src.stat().st_mtime
    os.utime(ext, (now - ext_age, now - ext_age))
    return src


def test_pure_finder_takes_the_source_over_an_extension_module(tmp_path):
    src = package(tmp_path, ext_age=-100)
    spec = hotpath.SourceOnlyFinder().find_spec(NAME, [str(tmp_path)])
    assert spec is not None and spec.origin == str(src)
    assert isinstance(spec.loader, importlib.machinery.SourceFileLoader)


def test_stale_only_finder_leaves_a_fresh_build_alone(tmp_path):
    package(tmp_path, ext_age=-100)
    assert hotpath.SourceOnlyFinder(stale_only=True).find_spec(NAME, [str(tmp_path)]) is None


def test_stale_only_finder_runs_a_source_edited_since_the_build(tmp_path, capsys):
    src = package(tmp_path, ext_age=100)
    spec = hotpath.SourceOnlyFinder(stale_only=True).find_spec(NAME, [str(tmp_path)])
    assert spec is not None and spec.origin == str(src)
    assert "changed since the hot path was compiled" in capsys.readouterr().err


def test_finder_ignores_other_packages_and_uncompiled_modules(tmp_path):
    package(tmp_path, ext_age=100)
    assert hotpath.SourceOnlyFinder().find_spec("free_blocks", [str(tmp_path)]) is None
    stale_only = hotpath.SourceOnlyFinder(stale_only=True)
    assert stale_only.find_spec("vllm_admission.core.run", [str(tmp_path)]) is None


def test_compiled_modules_lists_extension_modules(monkeypatch):
    fake = types.ModuleType("vllm_admission.fake_compiled")
    fake.__file__ = f"/nowhere/fake_compiled{SUFFIX}"
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    assert fake.__name__ in hotpath.compiled_modules()
    assert "vllm_admission.hotpath" not in hotpath.compiled_modules()


def test_pure_requested_reads_the_environment(monkeypatch):
    monkeypatch.setenv(hotpath.PURE_ENV, "1")
    assert hotpath.pure_requested()
    monkeypatch.setenv(hotpath.PURE_ENV, "0")
    assert not hotpath.pure_requested()
    monkeypatch.delenv(hotpath.PURE_ENV)
    assert not hotpath.pure_requested()
