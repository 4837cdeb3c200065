"""Engine side: a tiny hybrid model and request replay through a real vLLM ``LLM``.

Unlike ``vllm_admission.core``, this package may import vLLM, torch and
transformers; the imports happen inside the submodules, so importing this
package alone stays cheap.
"""

from vllm_admission.engine.tiny_model import (
    TINY_MODEL_ARCHS,
    TINY_MODEL_PARAMS,
    TINY_NEMOTRON_H_PARAMS,
    make_tiny_model,
)

__all__ = ["TINY_MODEL_ARCHS", "TINY_MODEL_PARAMS", "TINY_NEMOTRON_H_PARAMS", "make_tiny_model"]
