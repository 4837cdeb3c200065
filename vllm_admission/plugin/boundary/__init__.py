"""The plugin's boundary with vLLM: what it relies on, what it changes, how it starts.

A newcomer who wants to know where the plugin touches vLLM reads this subpackage and
nothing else:

* :mod:`~vllm_admission.plugin.boundary.surface`: what the plugin relies on (the
  supported releases, every private member and every overridden method, each with the
  vLLM file it comes from); changes nothing;
* :mod:`~vllm_admission.plugin.boundary.hooks`: every change to a live vLLM object,
  behind the version check;
* :mod:`~vllm_admission.plugin.boundary.register`: also installs vLLM 0.32's repairs
  (:func:`~vllm_admission.plugin.boundary.register.install_vllm_fixes`), which live apart
  from the product in :mod:`vllm_admission.plugin.repairs`, only where the plugin is asked
  for (or ``VLLM_ADMISSION_CPU_FIXES=1``);
* :mod:`~vllm_admission.plugin.boundary.register`: the ``vllm.general_plugins`` entry
  point (does nothing unless the plugin is asked for) and the early check;
* :mod:`~vllm_admission.plugin.boundary.engine_setup`: what an engine can run, decided
  once from its facts, before the model loads and again in the scheduler.

Importing this package imports nothing; each module imports vLLM where it needs it.
"""
