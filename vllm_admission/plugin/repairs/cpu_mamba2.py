"""Mamba2 prefix caching on vLLM 0.32's CPU platform: vLLM's prefill-checkpoint export off.

vLLM 0.32's ``MambaMixer2.get_kv_cache_spec``
(``vllm/model_executor/layers/mamba/mamba_mixer2.py``) declares one in-pass
prefill-checkpoint block on every Mamba2 layer (``num_prefill_checkpoint_blocks=1``,
``prefill_checkpoint_alignment=1``). In ``align`` mode the scheduler then no longer ends
a prefill chunk at the prompt-end checkpoint ``floor((P - 1) / B) * B``
(``v1/core/sched/scheduler.py`` ``_mamba_block_aligned_split``:
``use_internal_checkpoint``) and expects the layer to write that state from inside the
pass. On the CPU platform the layer cannot:

* the CPU SSD scan (``model_executor/layers/mamba/ops/cpu/mamba_ssm.py``
  ``_mamba_chunk_scan_combined_fwd_cpu``, swapped in by ``ops/ssd_combined.py``) ignores
  ``return_intermediate_states`` and returns one final state per sequence, so
  ``MambaMixer2``'s ``varlen_states[last_chunk_indices_p]`` raises ``IndexError`` (measured:
  "index 7 is out of bounds for dimension 0 with size 1" at the first 1,000-token prompt);
* the state store (``ops/ssd_checkpoint.py`` ``store_prefill_checkpoint``) is a Triton
  kernel, and the CPU build has no Triton.

So stock vLLM 0.32 on CPU fails at the first prefill of a Mamba2 hybrid (Nemotron-H,
Granite-4-H, Falcon-H1, Zamba2) that covers a block boundary, with prefix caching on.
:func:`install` makes the layer declare no export there: the spec is vLLM's own with
``num_prefill_checkpoint_blocks=0`` and ``prefill_checkpoint_alignment=None``, which is
what every Gated DeltaNet layer declares in 0.32. The scheduler then ends a chunk at the
prompt-end checkpoint and the state is written at that chunk end, as for the GDN models;
the pool's per-request peak is 2 state blocks per group (``MambaSpec.max_memory_usage_bytes``)
instead of 3. On any other platform :func:`install` changes nothing.

The patch is process-wide and idempotent. The general plugin (:mod:`vllm_admission.plugin.boundary.register`)
installs it in every vLLM process, and :func:`vllm_admission.engine.llm.build_llm` before
each engine it builds (its stock engines run with ``VLLM_PLUGINS=""``).

Upstream: vLLM issue #54504 and its PR #54505 ("[CPU] Support mamba prefix-caching block
tables in the CPU conv/SSM wrappers", open as of 2026-11) make the CPU scan return the
chunk-end states; with a CPU ``store_prefill_checkpoint`` as well (no upstream issue found
as of 2026-11) the layer could write its export on CPU and this module, and the CPU branch
of :func:`~vllm_admission.plugin.boundary.hooks.wrap_mamba2_spec`, could go.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

__all__ = ["install", "installed", "spec_without_export"]


def spec_without_export(spec: Any) -> Any:
    """``spec`` (a vLLM ``MambaSpec``) with vLLM's prefill-checkpoint export turned off.

    Returns the same object when it declares no export, else a copy with
    ``num_prefill_checkpoint_blocks=0`` and ``prefill_checkpoint_alignment=None``
    (``vllm/v1/kv_cache_interface.py`` ``MambaSpec``, a frozen dataclass).
    """
    if not getattr(spec, "num_prefill_checkpoint_blocks", 0):
        return spec
    return replace(spec, num_prefill_checkpoint_blocks=0, prefill_checkpoint_alignment=None)


def install() -> bool:
    """On vLLM's CPU platform, make ``MambaMixer2`` declare no prefill-checkpoint export.

    The wrap itself is :func:`vllm_admission.plugin.boundary.hooks.wrap_mamba2_spec`
    (every change to a vLLM object is made there).

    Returns:
        True when the patch is active in this process (installed now or
        before), False on any other platform (nothing changed).

    Raises:
        ImportError: vLLM is not installed.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm_admission.plugin.boundary.hooks import wrap_mamba2_spec

    wrap_mamba2_spec(lambda spec, _vllm_config: spec_without_export(spec))
    return True


def installed() -> bool:
    """Whether ``MambaMixer2.get_kv_cache_spec`` is wrapped in this process."""
    from vllm_admission.plugin.boundary.hooks import mamba2_spec_wrapped

    return mamba2_spec_wrapped()
