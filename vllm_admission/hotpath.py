"""Which build of the simulator's hot path is live: the compiled one or the pure-Python reference.

The modules in :data:`COMPILED` are compiled with Cython when the package is installed
where a C compiler exists (``setup.py``; ``docs/architecture.md``, "The compiled hot
path"). The ``.py`` sources stay the reference: the extension modules are the same code,
compiled without type declarations, and give the same results bit for bit
(``tests/test_compiled_core.py``).

Setting ``VLLM_ADMISSION_PURE_PYTHON=1`` before ``vllm_admission`` is imported runs the
pure-Python sources although the extension modules are installed (``vllm_admission``'s
``__init__`` reads it once and puts :class:`SourceOnlyFinder` first on ``sys.meta_path``).
Without it, the same finder passes over only an extension module older than its ``.py``
(a source edited after the build runs as source until the next install).
:func:`compiled_modules` says which modules are live as extension modules.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys

__all__ = ["COMPILED", "PURE_ENV", "SourceOnlyFinder", "compiled_modules", "describe",
           "pure_requested"]

#: Environment variable: ``1`` runs the pure-Python sources even where compiled.
PURE_ENV = "VLLM_ADMISSION_PURE_PYTHON"

#: The modules ``setup.py`` compiles: the cache model, the free-block queue, the
#: eviction policies and the admission/``auto`` hot path (``benchmarks/simulator_bench.py``
#: profiles). The registries stay Python (a new policy is appended to them as source), and so
#: does ``core/shadows.py`` (message passing only; the child runs it with ``python -m``,
#: which cannot run an extension module).
COMPILED: tuple[str, ...] = (
    "vllm_admission.core.adaptive",
    "vllm_admission.core.admission",
    "vllm_admission.core.cache.block_pool",
    "vllm_admission.core.cache.checkpoint",
    "vllm_admission.core.cache.groups",
    "vllm_admission.core.cache.model",
    "vllm_admission.core.cache.values",
    "vllm_admission.core.eviction.base",
    "vllm_admission.core.eviction.belady",
    "vllm_admission.core.eviction.conversation",
    "vllm_admission.core.eviction.fifo",
    "vllm_admission.core.eviction.flop",
    "vllm_admission.core.eviction.frequency",
    "vllm_admission.core.eviction.history",
    "vllm_admission.core.eviction.lru",
    "vllm_admission.core.eviction.mix",
    "vllm_admission.core.eviction.reuse",
    "vllm_admission.core.eviction.s3fifo",
    "vllm_admission.core.free_blocks",
    "vllm_admission.core.replay",
    "vllm_admission.core.tuning",
)


def pure_requested() -> bool:
    """Whether :data:`PURE_ENV` asks for the pure-Python sources (``1``, ``true``, ``yes``)."""
    return os.environ.get(PURE_ENV, "").strip().lower() in ("1", "true", "yes")


class SourceOnlyFinder:
    """A ``sys.meta_path`` finder that loads ``vllm_admission``'s submodules from their
    ``.py`` sources, passing over extension modules beside them.

    Args:
        stale_only: pass over only an extension module older than its source (an
            editable install whose ``.py`` was edited since the build; one warning line),
            and leave every other import to the normal finders.
    """

    _loaders = [(importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES),
                (importlib.machinery.SourcelessFileLoader, importlib.machinery.BYTECODE_SUFFIXES)]

    def __init__(self, stale_only: bool = False) -> None:
        self.stale_only = stale_only

    def find_spec(self, name, path=None, target=None):
        if not name.startswith("vllm_admission.") or not path:
            return None
        if self.stale_only and name not in COMPILED:
            return None
        for entry in path:
            spec = importlib.machinery.FileFinder(entry, *self._loaders).find_spec(name, target)
            if spec is None or (spec.loader is None and not spec.submodule_search_locations):
                continue
            if self.stale_only and not _stale(spec.origin):
                return None
            return spec
        return None


def _stale(source: str | None) -> bool:
    """Whether an extension module beside ``source`` is older than it (warns once)."""
    if not source:
        return False
    stem = source[:-len(".py")] if source.endswith(".py") else source
    try:
        src_time = os.stat(source).st_mtime
    except OSError:
        return False
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        try:
            ext_time = os.stat(stem + suffix).st_mtime
        except OSError:
            continue
        if ext_time < src_time:
            print(f"vllm-admission: {os.path.basename(source)} changed since the hot path was "
                  "compiled; running its source (reinstall to recompile)", file=sys.stderr)
            return True
    return False


def compiled_modules() -> list[str]:
    """Names of the imported ``vllm_admission`` modules that are extension modules
    (empty: the pure-Python reference is live, or nothing compiled is imported yet)."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return sorted(name for name, mod in list(sys.modules.items())
                  if name.startswith("vllm_admission.")
                  and str(getattr(mod, "__file__", "") or "").endswith(suffixes))


def describe() -> str:
    """One line for logs: which build of the hot path is live, after importing it."""
    import importlib

    for name in COMPILED:
        importlib.import_module(name)
    live = compiled_modules()
    if live:
        return f"hot path: compiled ({len(live)} of {len(COMPILED)} modules are extension modules)"
    why = f" ({PURE_ENV}=1)" if pure_requested() else " (no compiled build installed)"
    return f"hot path: pure Python{why}"
