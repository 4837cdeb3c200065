"""Keep the engine core's block size when vLLM 0.32's CPU platform re-checks the config.

An engine core in its own process (vLLM's default for ``LLM``, and what ``vllm serve``
runs) ends its start-up handshake by running ``VllmConfig.__post_init__()`` again
(``v1/engine/core.py`` ``EngineCoreProc._perform_handshakes``), after the KV cache is
built and the scheduler holds the config. That re-runs the platform's
``check_and_update_config``, and the CPU platform's (``platforms/cpu.py``) sets
``cache_config.block_size = 128`` whenever the user gave no ``--block-size``, undoing the
hybrid alignment the worker made (``CpuPlatform.update_block_size_for_backend``: 256 for
the tiny Qwen3-Next with a float32 state). From then on the scheduler's
``_mamba_block_aligned_split`` cuts prefill chunks on 128-token boundaries while the
Mamba manager caches states only on 256-token ones: a 3,740-token prompt runs as 3,712 +
28 tokens instead of 3,584 + 156, its prompt-end state (3,584) is never written, and the
same prompt sent again misses. It hits only on the third sighting, after the second
one's junction stop wrote that state (docs/engine-facts.md, section 11). An engine core
in the calling process never re-runs the check, and the CUDA platform's check does not
touch the block size.

:func:`keep_block_size` wraps the check so that, once the KV cache exists
(``cache_config.num_gpu_blocks`` set), the block sizes it found are the block sizes it
leaves; before that it changes nothing. :func:`install` puts it in place on the CPU
platform, with the other fixes (:func:`vllm_admission.plugin.boundary.register.install_vllm_fixes`).

Upstream: no upstream issue found as of 2026-11. The CPU platform's own hybrid alignment
moved to ``update_block_size_for_backend`` in vLLM PR #41025, which left the fixed
``block_size = 128`` in ``check_and_update_config``; a check that keeps a block size the
alignment already chose (or a handshake that does not re-run it) would retire this module
and :func:`~vllm_admission.plugin.boundary.hooks.wrap_platform_config_check`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["install", "installed", "keep_block_size"]


def keep_block_size(check: Callable[[Any], None]) -> Callable[[Any], None]:
    """``check`` (a platform's ``check_and_update_config(vllm_config)``), except that on a
    config whose KV cache is already sized it leaves ``cache_config.block_size`` and
    ``mamba_block_size`` as they were."""

    def checked(vllm_config: Any) -> None:
        cache = getattr(vllm_config, "cache_config", None)
        if cache is None or cache.num_gpu_blocks is None:
            check(vllm_config)
            return
        kept = {"block_size": cache.block_size, "mamba_block_size": cache.mamba_block_size}
        check(vllm_config)
        from vllm_admission.plugin.boundary.hooks import restore_cache_sizes

        restore_cache_sizes(cache, kept)

    return checked


def install() -> bool:
    """On vLLM's CPU platform, wrap ``CpuPlatform.check_and_update_config`` with
    :func:`keep_block_size` (process-wide, once; the change itself is
    :func:`vllm_admission.plugin.boundary.hooks.wrap_platform_config_check`).

    Returns:
        True when the wrap is active in this process, False on any other platform.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm_admission.plugin.boundary.hooks import wrap_platform_config_check

    wrap_platform_config_check(keep_block_size)
    return True


def installed() -> bool:
    """Whether the CPU platform's config check is wrapped in this process."""
    from vllm_admission.plugin.boundary.hooks import platform_config_check_wrapped

    return platform_config_check_wrapped()
