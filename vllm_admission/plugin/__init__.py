"""Thin vLLM 0.32 adapters around :mod:`vllm_admission.core` (imports vLLM)."""
