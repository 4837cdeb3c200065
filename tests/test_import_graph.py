"""Every module of ``vllm_admission`` imports, and the package's own imports form no cycle,
type-only imports included.

The graph is read from the source (``ast``), so it holds the imports inside functions too
(the lazy ones a cycle hides behind). An edge ``a -> b`` means module ``a`` imports module
``b`` of this package (``from pkg import name`` counts as importing ``pkg.name`` when that
is a module, else ``pkg``), or a module inside package ``b`` that ``a`` is not inside
(Python runs ``b/__init__.py`` first). It is built twice: with the imports that run (those under
``if TYPE_CHECKING:`` left out) and with every import, the type-only ones too (a module
that names another's type must not be named back: a cycle there is a cycle of meaning,
and one refactoring away from a real one). In each, two graphs must be acyclic: the
modules', and the subpackages' (``core``, ``sim``, ``plugin``, ``engine``, ...: the
layers), so that, for example, ``engine`` may use ``plugin`` but ``plugin`` never
``engine``.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = "vllm_admission"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE


def module_files() -> dict[str, Path]:
    """``dotted module name -> file`` for every module of the package (``__main__`` left out)."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _under_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _resolve(module: str, level: int, here: str, is_package: bool) -> str:
    if not level:
        return module
    base = here.split(".")
    base = base[:len(base) - level + (1 if is_package else 0)]
    return ".".join([*base, module] if module else base)


def import_graph(type_checking: bool = False) -> dict[str, set[str]]:
    """``module -> package modules it imports`` (see the module docstring); with
    ``type_checking``, the imports under ``if TYPE_CHECKING:`` too."""
    files = module_files()
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        edges: set[str] = set()
        stack: list[ast.AST] = [ast.parse(path.read_text(), str(path))]
        while stack:
            for node in ast.iter_child_nodes(stack.pop()):
                if not type_checking and _under_type_checking(node):
                    continue
                stack.append(node)
                if isinstance(node, ast.Import):
                    edges.update(a.name for a in node.names if a.name in files)
                elif isinstance(node, ast.ImportFrom):
                    source = _resolve(node.module or "", node.level, name,
                                      path.name == "__init__.py")
                    for alias in node.names:
                        full = f"{source}.{alias.name}"
                        if full in files:
                            edges.add(full)
                        elif source in files:
                            edges.add(source)
        for target in list(edges):
            parts = target.split(".")
            for k in range(2, len(parts)):
                package = ".".join(parts[:k])
                if package in files and not (name + ".").startswith(package + "."):
                    edges.add(package)
        edges.discard(name)
        graph[name] = edges
    return graph


def layer(module: str) -> str | None:
    """The subpackage (or top-level module) ``module`` belongs to; ``None`` for the root."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else None


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of nodes (first == last), or ``None``."""
    state: dict[str, int] = {}          # 1: on the path, 2: done
    path: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        path.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return path[path.index(w):] + [w]
            if w not in state:
                found = visit(w)
                if found:
                    return found
        path.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state:
            found = visit(v)
            if found:
                return found
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_sees_lazy_imports_packages_and_type_checking():
    graph, typed = import_graph(), import_graph(type_checking=True)
    # a lazy import inside a function: the package root resolves AdmissionScheduler on demand
    assert f"{PACKAGE}.plugin.scheduler" in graph[PACKAGE]
    assert f"{PACKAGE}.core.cache" in graph[f"{PACKAGE}.core.cache_inputs"]
    # core/policies.py imports core.eviction.registry, which runs core/eviction/__init__.py;
    # core/__init__.py is the importer's own package: no edge to it
    assert f"{PACKAGE}.core.eviction" in graph[f"{PACKAGE}.core.policies"]
    assert f"{PACKAGE}.core" not in graph[f"{PACKAGE}.core.policies"]
    # a type-only import (cache/values.py names BlockPool under TYPE_CHECKING)
    values = f"{PACKAGE}.core.cache.values"
    assert f"{PACKAGE}.core.cache.block_pool" not in graph[values]
    assert f"{PACKAGE}.core.cache.block_pool" in typed[values]


@pytest.mark.parametrize("type_checking", [False, True], ids=["run", "type_checking"])
def test_no_module_import_cycle(type_checking):
    cycle = find_cycle(import_graph(type_checking))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("type_checking", [False, True], ids=["run", "type_checking"])
def test_no_layer_import_cycle(type_checking):
    layers: dict[str, set[str]] = {}
    for module, edges in import_graph(type_checking).items():
        a = layer(module)
        if a is None:
            continue
        layers.setdefault(a, set())
        for target in edges:
            b = layer(target)
            if b is not None and b != a:
                layers[a].add(b)
    cycle = find_cycle(layers)
    assert cycle is None, "cycle between subpackages: " + " -> ".join(cycle)
    assert layers[f"{PACKAGE}.core"] == set(), "core imports no other layer"


@pytest.mark.parametrize("module", sorted(module_files()))
def test_every_module_imports(module):
    if module.split(".")[1:2] in (["plugin"], ["engine"]) or module.endswith(
            ("fidelity.run", "cli.replay")):
        pytest.importorskip("vllm")
    importlib.import_module(module)


# ------------------------------------------------------------ where vLLM objects change
#: Attribute stores on objects other than ``self`` / ``cls`` that plugin modules besides
#: ``boundary/hooks.py`` may make: ``(module file, the stored target as written)``. None changes
#: a vLLM class or module: every such change is made (or installed) by ``boundary/hooks.py``.
ALLOWED_STORES = {
    ("policy_events.py", "self.eviction_policy.alpha"),  # a core policy object
    ("requests.py", "self.counters.junctions"),           # the plugin's own CacheCounters
    ("requests.py", "self.counters.state_checkpoints"),
    ("requests.py", "self.counters.prefill_steps"),
    ("requests.py", "self.counters.host_hit_tokens"),
    ("free_queue.py", "b.prev_free_block"),        # the free queue's own links (vLLM's
    ("free_queue.py", "b.next_free_block"),        # FreeKVCacheBlockQueue contract)
    ("logs.py", "logger.propagate"),               # the plugin's own logger
    # engine/llm.py: a mark on the wrapper wrap_schedule installed (the counter's own function)
    ("llm.py", "scheduler.schedule._prefill_step_counter"),
}


def attribute_stores(path: Path) -> set[tuple[str, str]]:
    """``(file name, target)`` of every attribute store and ``setattr`` on a name other
    than ``self`` / ``cls`` in ``path``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for x in ast.walk(target):
                if (isinstance(x, ast.Attribute) and isinstance(x.ctx, ast.Store)
                        and not (isinstance(x.value, ast.Name) and x.value.id in ("self", "cls"))):
                    out.add((path.name, ast.unparse(x)))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("setattr", "delattr"):
            out.add((path.name, ast.unparse(node)))
    return out


def test_vllm_objects_change_only_in_the_boundary_hooks():
    """docs/plugin.md "How it works": every change to a vLLM object lives in (or is
    installed by) ``plugin/boundary/hooks.py``, where ``PRIVATE_MEMBERS`` lists it."""
    stores = set()
    for path in sorted((ROOT / "plugin").rglob("*.py")):
        if path.relative_to(ROOT).as_posix() != "plugin/boundary/hooks.py":
            stores |= attribute_stores(path)
    for path in (ROOT / "engine").rglob("*.py"):
        stores |= {s for s in attribute_stores(path) if "schedule" in s[1] or "scheduler" in s[1]}
    assert stores <= ALLOWED_STORES, sorted(stores - ALLOWED_STORES)


def test_no_module_name_repeats_across_layers():
    """A module's file name says which one it is: no two layers (``core``, ``sim``, ``plugin``,
    ``engine``, ``fidelity``, ``cli``) hold modules of the same name (``__init__`` aside)."""
    layers: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if path.name != "__init__.py" and len(rel.parts) > 1:
            layers.setdefault(path.stem, set()).add(rel.parts[0])
    assert {name: sorted(found) for name, found in layers.items() if len(found) > 1} == {}
