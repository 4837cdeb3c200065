"""vllm-admission: prefix-cache admission and eviction for hybrid models in vLLM.

The pure-Python core (``vllm_admission.core``) holds the cost model, the block
geometry, the trace readers, the block-level cache model and the policies. The
simulator (``vllm_admission.sim``) and the vLLM plugin (``vllm_admission.plugin``)
both run those same objects.

``vllm_admission.AdmissionScheduler`` is resolved lazily so that importing this
package never imports vLLM or torch, and importing it changes nothing else (no import
hooks).
"""

__version__ = "0.1.0"

__all__ = ["AdmissionScheduler", "__version__"]


def __getattr__(name: str):
    if name == "AdmissionScheduler":
        from vllm_admission.plugin.scheduler import AdmissionScheduler

        return AdmissionScheduler
    raise AttributeError(f"module 'vllm_admission' has no attribute {name!r}")
