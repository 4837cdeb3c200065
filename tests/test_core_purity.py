"""The core and the simulator must never import vllm or torch."""

import subprocess
import sys


def test_core_and_sim_import_without_vllm_or_torch():
    code = (
        "import sys, importlib, pkgutil\n"
        "import vllm_admission, vllm_admission.core, vllm_admission.sim\n"
        "for pkg in (vllm_admission.core, vllm_admission.sim):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        importlib.import_module(m.name)\n"
        "import vllm_admission.cli\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"core/sim imported: {out.stdout.strip()}"


def test_importing_the_package_installs_no_import_hook():
    """Importing vllm_admission (and its core, simulator and command line) leaves the
    interpreter's import machinery as it was: no meta-path finder, no path hook, and every
    core module loaded from its .py source (issue 34: no compiled build, no hook choosing)."""
    code = (
        "import sys, importlib, pkgutil\n"
        "meta, hooks = list(sys.meta_path), list(sys.path_hooks)\n"
        "import vllm_admission, vllm_admission.core, vllm_admission.sim, vllm_admission.cli\n"
        "for m in pkgutil.walk_packages(vllm_admission.core.__path__, 'vllm_admission.core.'):\n"
        "    importlib.import_module(m.name)\n"
        "print(sys.meta_path == meta, sys.path_hooks == hooks)\n"
        "print(sorted(n for n, m in sys.modules.items() if n.startswith('vllm_admission')\n"
        "             and not (getattr(m, '__file__', '') or '').endswith('.py')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    same, not_source = out.stdout.strip().splitlines()
    assert same == "True True"
    assert not_source == "[]"
