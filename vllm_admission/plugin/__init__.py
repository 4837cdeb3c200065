"""Thin vLLM 0.32 / 0.33 adapters around :mod:`vllm_admission.core` (imports vLLM).

Three layers, each in one place:

* **policies in the engine** (this package's modules):
  :mod:`~vllm_admission.plugin.scheduler` (``AdmissionScheduler``; use it with
  ``scheduler_cls="vllm_admission.AdmissionScheduler"``),
  :mod:`~vllm_admission.plugin.kv_cache` (the KV cache subclasses it installs),
  :mod:`~vllm_admission.plugin.free_queue` (the free block queue of any eviction policy),
  :mod:`~vllm_admission.plugin.control` (the per-engine facade the adapters call) over
  :mod:`~vllm_admission.plugin.requests` (live requests: lookups, chunk stops,
  admission decisions, tentative states superseded, counters),
  :mod:`~vllm_admission.plugin.policy_events` (the eviction policy: block events and
  block values) and :mod:`~vllm_admission.plugin.background` (the alpha tuner and
  ``auto``'s controller off the scheduler loop),
  :mod:`~vllm_admission.plugin.translate` (vLLM's block hashes and requests as the core's
  keys and ``CacheRequest``\\ s), :mod:`~vllm_admission.plugin.env` (the
  ``VLLM_ADMISSION_*`` settings, no vLLM import), and the ``inpass`` checkpoint mode
  (:mod:`~vllm_admission.plugin.inpass`, :mod:`~vllm_admission.plugin.state_copy`,
  :mod:`~vllm_admission.plugin.runner`: scheduler and runner sides);
* **the boundary with vLLM**, :mod:`~vllm_admission.plugin.boundary`: what the plugin
  relies on, every change it makes to vLLM objects, the general-plugin entry point and the
  start-up decision; the repairs vLLM 0.32 needs (its CPU platform, whole-page block
  copies) apart, in :mod:`~vllm_admission.plugin.repairs`;
* **metrics**, :mod:`~vllm_admission.plugin.metrics`: ``stats()``, the log line and
  ``/metrics``, one counter schema.

The harness that drives vLLM's scheduler without a model (tests, the overhead
benchmark) is :mod:`vllm_admission_testing.harness`, outside the installed package. See
``docs/plugin.md``.
"""
