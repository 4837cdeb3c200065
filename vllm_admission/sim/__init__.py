"""Trace-replay simulator built on :mod:`vllm_admission.core`."""
