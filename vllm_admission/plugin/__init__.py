"""Thin vLLM 0.32 adapters around :mod:`vllm_admission.core` (imports vLLM).

* :mod:`~vllm_admission.plugin.scheduler`: ``AdmissionScheduler`` (use it with
  ``scheduler_cls="vllm_admission.AdmissionScheduler"``);
* :mod:`~vllm_admission.plugin.kv_cache`: the KV cache subclasses it installs;
* :mod:`~vllm_admission.plugin.control`: per-engine state, policy calls, metrics, tuner;
* :mod:`~vllm_admission.plugin.free_queue`: the FLOP-aware free block queue;
* :mod:`~vllm_admission.plugin.config`: the ``VLLM_ADMISSION_*`` settings (no vLLM import);
* :mod:`~vllm_admission.plugin.register`: the ``vllm.general_plugins`` entry point;
* :mod:`~vllm_admission.plugin.replay_cli`: ``vllm-admission replay``;
* :mod:`~vllm_admission.plugin.testing`: vLLM's scheduler driven without a model.

See ``docs/plugin.md``.
"""
