"""Test helpers for vllm-admission, kept out of the runtime package (not installed).

* :mod:`~vllm_admission_testing.harness`: vLLM's scheduler driven without a model
  (``FakeEngine``), for the tests and the scheduler-overhead benchmark;
* :mod:`~vllm_admission_testing.peer_swap`: the pytest plugin (``-p``) that runs vLLM's
  own scheduler tests with the AdmissionScheduler swapped in.

Importable from the repository root (pytest's ``pythonpath``, ``PYTHONPATH=.``).
"""
