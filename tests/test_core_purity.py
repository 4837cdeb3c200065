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
