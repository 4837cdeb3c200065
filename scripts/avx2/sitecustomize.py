"""Run vLLM's CPU build as on a CPU without AVX-512 (``make test-avx2``).

Put this folder on ``PYTHONPATH`` with ``ADMISSION_TEST_FORCE_AVX2=1``: every Python process
then answers False to torch's ``_is_avx512_supported``, ``_is_avx512_bf16_supported``,
``_is_avx512_vnni_supported`` and ``_is_amx_tile_supported``, which are the checks vLLM 0.32's
CPU platform makes (``vllm/platforms/cpu.py`` ``import_kernels`` then loads ``_C_AVX2``;
the GDN, conv, attention and GEMM dispatch take their AVX2 branches). The Makefile also caps
ATen, oneDNN and MKL at AVX2 through their own variables. This does not make the machine an
AVX2 one: the libraries still block their work by this CPU's caches, and on an AVX2-only
EPYC rounding came out otherwise (docs/engine-facts.md, section 0c).
"""

import os

if os.environ.get("ADMISSION_TEST_FORCE_AVX2") == "1":
    import torch

    def _no() -> bool:
        return False

    torch.cpu._is_avx512_supported = _no
    torch.cpu._is_avx512_bf16_supported = _no
    torch.cpu._is_avx512_vnni_supported = _no
    torch.cpu._is_amx_tile_supported = _no
