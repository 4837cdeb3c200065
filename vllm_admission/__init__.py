"""vllm-admission: prefix-cache admission and eviction for hybrid models in vLLM.

The pure-Python core (``vllm_admission.core``) holds the cost model, the block
geometry, the trace readers, the block-level cache model and the policies. The
simulator (``vllm_admission.sim``) and the vLLM plugin (``vllm_admission.plugin``)
both run those same objects.

``vllm_admission.AdmissionScheduler`` is resolved lazily so that importing this
package never imports vLLM or torch.

Where the package was installed with its compiled hot path, ``VLLM_ADMISSION_PURE_PYTHON=1``
(read once, here) runs the pure-Python sources instead; :func:`compiled_modules` says which
modules are live as extension modules (:mod:`vllm_admission.hotpath`).
"""

import sys as _sys

from vllm_admission import hotpath as _hotpath
from vllm_admission.hotpath import compiled_modules

__version__ = "0.1.0"

__all__ = ["AdmissionScheduler", "__version__", "compiled_modules"]

if not any(isinstance(f, _hotpath.SourceOnlyFinder) for f in _sys.meta_path):
    _sys.meta_path.insert(0, _hotpath.SourceOnlyFinder(stale_only=not _hotpath.pure_requested()))


def __getattr__(name: str):
    if name == "AdmissionScheduler":
        from vllm_admission.plugin.scheduler import AdmissionScheduler

        return AdmissionScheduler
    raise AttributeError(f"module 'vllm_admission' has no attribute {name!r}")
