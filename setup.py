"""Build hook: compile the simulator's hot path with Cython where a C compiler exists.

Everything else (metadata, dependencies, entry points) is in ``pyproject.toml``. The
modules listed in ``vllm_admission/hotpath.py`` (``COMPILED``) are compiled from their
unchanged ``.py`` sources, without type declarations (``annotation_typing=False``: the
annotations are not turned into C types, so the compiled code has Python's semantics and
gives the pure-Python results bit for bit). If Cython is missing, there is no compiler, a
module fails to compile, or ``VLLM_ADMISSION_NO_COMPILE=1`` is set, the package installs as
pure Python with one line saying so; the install never fails for it.
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
NO_COMPILE_ENV = "VLLM_ADMISSION_NO_COMPILE"


BUILDING = any(cmd in sys.argv for cmd in ("build", "build_ext", "bdist_wheel", "editable_wheel",
                                           "develop", "install"))


def say(message: str) -> None:
    """One line on stderr, once per install (setup.py also runs for the metadata)."""
    if BUILDING:
        print(f"vllm-admission: {message}", file=sys.stderr, flush=True)


def remove_stale_builds() -> None:
    """Delete extension modules of ``COMPILED`` left in the source tree by an earlier
    build (an editable install builds in place), so that a pure install is pure."""
    from importlib.machinery import EXTENSION_SUFFIXES

    for name in compiled_names():
        stem = HERE / Path(*name.split("."))
        for suffix in EXTENSION_SUFFIXES:
            stem.with_suffix(suffix).unlink(missing_ok=True)


def compiled_names() -> tuple[str, ...]:
    """``COMPILED`` of ``vllm_admission/hotpath.py``, read without importing the package."""
    tree = ast.parse((HERE / "vllm_admission" / "hotpath.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "COMPILED":
            return tuple(ast.literal_eval(node.value))
    raise RuntimeError("vllm_admission/hotpath.py defines no COMPILED tuple")


def extensions() -> list:
    if os.environ.get(NO_COMPILE_ENV, "").strip().lower() in ("1", "true", "yes"):
        say(f"{NO_COMPILE_ENV} is set: installing the pure-Python hot path only")
        if BUILDING:
            remove_stale_builds()
        return []
    try:
        from Cython.Build import cythonize
        from setuptools import Extension
    except ImportError:
        say("Cython is not available: installing the pure-Python hot path only")
        if BUILDING:
            remove_stale_builds()
        return []
    mods = [Extension(name, [str(Path(*name.split(".")).with_suffix(".py"))],
                      # No FMA contraction: the C code does each float operation as Python does.
                      extra_compile_args=["-ffp-contract=off"])
            for name in compiled_names()]
    try:
        return cythonize(mods, build_dir="build/cython", quiet=True, language_level=3,
                         compiler_directives={"annotation_typing": False, "binding": True,
                                              "embedsignature": False})
    except Exception as exc:  # noqa: BLE001 - any failure means: pure Python
        say(f"Cython could not translate the hot path ({exc}); installing pure Python only")
        if BUILDING:
            remove_stale_builds()
        return []


class OptionalBuildExt(build_ext):
    """``build_ext`` that falls back to pure Python when compiling fails (modules in
    parallel, one per CPU)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - no compiler, or it failed
            for ext in self.extensions:   # none half-built: the install is pure or compiled
                Path(self.get_ext_fullpath(ext.name)).unlink(missing_ok=True)
            remove_stale_builds()
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            say(f"compiling the hot path failed ({first[:160]}); "
                "installing the pure-Python hot path only")
            return
        say(f"compiled the hot path ({len(self.extensions)} modules)")

    def build_extension(self, ext) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            raise RuntimeError(f"{ext.name}: {exc}") from None


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
