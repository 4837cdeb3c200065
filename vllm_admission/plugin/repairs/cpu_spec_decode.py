"""MTP/EAGLE speculative decoding on vLLM 0.32's CPU platform: the state kernels it lacks.

vLLM's CPU build loads MTP drafters for hybrid models (``Qwen3NextMTP``,
``NemotronHMTP``) but dies at the first model step, in the Triton state copies of
``v1/worker/mamba_utils.py`` (``run_fused_precopy``, then ``run_fused_postprocess``),
and gives wrong Mamba2 outputs under drafts (the CPU conv update drops
``num_accepted_tokens``). :func:`install` supplies torch versions
(:mod:`vllm_admission.plugin.repairs.cpu_spec_decode_ops`); the wraps themselves are
:func:`vllm_admission.plugin.boundary.hooks.install_cpu_spec_decode`. Only paths that fail or
are wrong on CPU change: without drafts nothing here runs, and on any other platform
:func:`install` changes nothing. Installed where :mod:`vllm_admission.plugin.repairs.cpu_mamba2`
is (the general plugin, :func:`vllm_admission.engine.llm.build_llm`). Facts:
docs/engine-facts.md, section 9.

Upstream: no upstream issue found as of 2026-11 for the fused speculative-decoding copies or
the Mamba2 CPU conv update under drafts. The closest is vLLM issue #46693 (open: the same
module's ``batch_memcpy`` fails on CPU for want of Triton); the Gated DeltaNet CPU conv got
its draft path in vLLM PR #48577. CPU versions of ``run_fused_precopy`` /
``run_fused_postprocess`` and ``num_accepted_tokens`` in the CPU ``causal_conv1d_update``
would retire this module, :mod:`~vllm_admission.plugin.repairs.cpu_spec_decode_ops` and
:func:`~vllm_admission.plugin.boundary.hooks.install_cpu_spec_decode`.
"""

from __future__ import annotations

__all__ = ["install", "installed"]


def install() -> bool:
    """On vLLM's CPU platform, install the torch speculative-decoding state kernels.

    Returns:
        True when they are active in this process, False on any other platform.

    Raises:
        ImportError: vLLM is not installed.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm_admission.plugin.boundary.hooks import install_cpu_spec_decode

    install_cpu_spec_decode()
    return True


def installed() -> bool:
    """Whether the kernels are installed in this process."""
    from vllm_admission.plugin.boundary.hooks import cpu_spec_decode_installed

    return cpu_spec_decode_installed()
