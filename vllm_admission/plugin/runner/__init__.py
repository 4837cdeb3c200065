"""Runner-side building blocks for ``inpass`` checkpoints.

* :mod:`~vllm_admission.plugin.runner.gdn_capture`: the prefill of a Gated DeltaNet
  layer's recurrent core run in segments split at checkpoint offsets, each segment's
  end state (conv and SSM) copied into its checkpoint block. Imports vLLM's CPU GDN
  kernels lazily, on first use;
* :mod:`~vllm_admission.plugin.runner.gdn_chunk_capture`: the GPU path's counterpart (checked
  and timed on an H200 by ``benchmarks/gpu_inpass_bench.py``; wired into vLLM's GPU engine and
  checked there against split mode by ``benchmarks/gpu/engine_check.py``): the states at checkpoint offsets read from
  the Triton/FLA chunk kernel's per-chunk states ``h`` (offsets must be multiples of 64) and
  the conv input, written into checkpoint rows;
* :mod:`~vllm_admission.plugin.runner.mamba2_export`: Mamba2 layers, through vLLM's own
  prefill-checkpoint export: a chunk layout with a chunk end at every checkpoint, the
  CPU SSD scan returning chunk-end states, and a torch checkpoint store;
* :mod:`~vllm_admission.plugin.runner.inpass_runner`: what the wrapped GDN core and the
  wrapped Mamba2 metadata builder run in ``inpass`` mode (the hooks themselves are installed by
  :func:`vllm_admission.plugin.boundary.hooks.install_inpass_runner`). See ``docs/checkpoints.md``.
"""
