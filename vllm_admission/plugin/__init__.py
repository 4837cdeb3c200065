"""Thin vLLM 0.32 adapters around :mod:`vllm_admission.core` (imports vLLM).

* :mod:`~vllm_admission.plugin.scheduler`: ``AdmissionScheduler`` (use it with
  ``scheduler_cls="vllm_admission.AdmissionScheduler"``);
* :mod:`~vllm_admission.plugin.kv_cache`: the KV cache subclasses it installs;
* :mod:`~vllm_admission.plugin.control`: per-engine state, policy calls, metrics, tuner;
* :mod:`~vllm_admission.plugin.free_queue`: the free block queue of any eviction policy;
* :mod:`~vllm_admission.plugin.vllm_hooks`: every change to vLLM's live objects, the
  version check and the private members relied on;
* :mod:`~vllm_admission.plugin.metrics`: the counters on the server's ``/metrics``;
* :mod:`~vllm_admission.plugin.config`: the ``VLLM_ADMISSION_*`` settings (no vLLM import);
* :mod:`~vllm_admission.plugin.register`: the ``vllm.general_plugins`` entry point;
* :mod:`~vllm_admission.testing`: a supported harness that drives vLLM's scheduler
  without a model (the fast tests and the overhead benchmark use it).

See ``docs/plugin.md``.
"""
