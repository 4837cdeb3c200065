"""Repairs of vLLM 0.32, kept apart from the product: what its CPU platform lacks or gets wrong,
and one block copy it gets wrong anywhere.

None of them is admission or eviction. They exist so that the plugin's settings (and a
stock engine on the same machine) run correctly on vLLM 0.32's CPU build, where the
project's tests and measurements run. Each module names the vLLM behaviour it repairs
(file and function in vLLM 0.32) and the upstream issue or PR that would retire it:

* :mod:`~vllm_admission.plugin.repairs.cpu_block_size`: the engine core's block size kept
  through the CPU platform's config re-check at the start-up handshake;
* :mod:`~vllm_admission.plugin.repairs.cpu_mamba2`: Mamba2 layers declare no in-pass
  prefill-checkpoint export on CPU (the CPU kernels cannot write it);
* :mod:`~vllm_admission.plugin.repairs.cpu_spec_decode` (with
  :mod:`~vllm_admission.plugin.repairs.cpu_spec_decode_ops`, the torch kernels): MTP/EAGLE
  state copies and the Mamba2 conv update under drafts, Triton-only in vLLM;
* :mod:`~vllm_admission.plugin.repairs.block_copy` (any platform): block copies of whole
  pages where an attention and a Mamba layer share a page;
* :mod:`~vllm_admission.plugin.repairs.cpu_hidden_states`,
  :mod:`~vllm_admission.plugin.repairs.cpu_offload`: the worker sides of the
  hidden-states connector and of the ``OffloadingConnector``'s host tier on CPU, loaded
  by vLLM's own out-of-tree hooks (``kv_connector_module_path``, ``spec_module_path``).

Their switch: the first four are installed together by
:func:`vllm_admission.plugin.boundary.register.install_vllm_fixes` (where the plugin is
asked for, or with ``VLLM_ADMISSION_CPU_FIXES=1`` alone, and by
:func:`vllm_admission.engine.llm.build_llm`); each CPU one changes nothing on another
platform. The two connector sides run only where a ``--kv-transfer-config`` names them.
As every change to a live vLLM object, the wraps themselves are made by
:mod:`vllm_admission.plugin.boundary.hooks` (named in each module), and the vLLM members
they rely on are listed in :mod:`vllm_admission.plugin.boundary.surface`.

Importing this package imports nothing; each module imports vLLM (or torch) where it needs it.
"""
