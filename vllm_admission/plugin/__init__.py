"""Thin vLLM 0.32 / 0.33 adapters around :mod:`vllm_admission.core` (imports vLLM).

* :mod:`~vllm_admission.plugin.scheduler`: ``AdmissionScheduler`` (use it with
  ``scheduler_cls="vllm_admission.AdmissionScheduler"``), with its start-up checks and
  run plan in :mod:`~vllm_admission.plugin.engine_setup`;
* :mod:`~vllm_admission.plugin.kv_cache`: the KV cache subclasses it installs;
* :mod:`~vllm_admission.plugin.free_queue`: the free block queue of any eviction policy;
* :mod:`~vllm_admission.plugin.control`: per-engine admission state (per-request
  decisions, block values, metrics);
* :mod:`~vllm_admission.plugin.worker`: the alpha tuner and ``auto``'s controller off
  the scheduler loop;
* :mod:`~vllm_admission.plugin.translate`: vLLM's block hashes and requests as the
  core's keys and ``CacheRequest``\\ s;
* :mod:`~vllm_admission.plugin.inpass`, :mod:`~vllm_admission.plugin.runner`: the
  ``inpass`` checkpoint mode (scheduler and runner sides);
* :mod:`~vllm_admission.plugin.vllm_hooks`: every change to vLLM's live objects, the
  version check and the private members relied on;
* :mod:`~vllm_admission.plugin.snapshots`, :mod:`~vllm_admission.plugin.metrics`: the
  counters on the server's ``/metrics`` (engine-core and API-server halves);
* :mod:`~vllm_admission.plugin.config`: the ``VLLM_ADMISSION_*`` settings (no vLLM import);
* :mod:`~vllm_admission.plugin.register`: the ``vllm.general_plugins`` entry point
  (nothing unless the plugin is asked for);
* :mod:`~vllm_admission.plugin.engine_setup`: what an engine can run, decided once from
  its facts, before the model loads and again in the scheduler;
* :mod:`~vllm_admission.plugin.cpu_mamba2`, :mod:`~vllm_admission.plugin.cpu_spec_decode`:
  the kernels vLLM 0.32's CPU platform lacks (Mamba2 prefill export, MTP state copies).

The harness that drives vLLM's scheduler without a model (tests, the overhead
benchmark) is :mod:`vllm_admission.testing`, outside this package. See
``docs/plugin.md``.
"""
