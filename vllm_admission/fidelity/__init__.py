"""Simulator fidelity: the same requests through a real vLLM engine and the simulator.

For every (pool size, admission, eviction) this module

1. starts vLLM with the :class:`~vllm_admission.AdmissionScheduler` and the
   policy pair (``VLLM_ADMISSION_*``), replays the requests
   (:func:`vllm_admission.engine.llm_replay.replay`) and reads each request's
   ``num_cached_tokens``;
2. runs the simulator on exactly the requests the engine ran, configured from
   the engine itself: its block size, its number of blocks, its
   ``max_num_batched_tokens`` as the chunk size, its KV cache group order and
   bytes per block (checked against the simulator's own geometry; a mismatch
   is an error, not a silent fallback), its resolved dtypes (model, KV cache,
   conv state and, above all, ``mamba_ssm_cache_dtype`` after vLLM's CPU
   platform has reset it to float32 on CPUs with AVX-512 BF16; the SSM state
   dtype decides the state page and so the block size), the model's FLOP
   costs, output blocks hashed as unique (the engine generates them), and
   alpha tuned once, as the plugin does (no re-tuning);
3. compares the two request by request.

In ``"sequential"`` mode (the default) a request finishes before the next is
sent, and the plugin's alpha tuner is given time to digest it (its thread is
drained) so the decision lands before the next request, as in the simulator.
In ``"timed"`` mode requests are submitted at their scaled trace arrival
times and overlap; the simulator still serves them one at a time in arrival
order, so the difference measures how far concurrency moves the engine from
the sequential prediction.

The outcome is ``fidelity.json`` (:func:`run_fidelity`) and
``fidelity.png`` (:func:`plot_fidelity`).

Modules: :mod:`~vllm_admission.fidelity.spec` (what runs),
:mod:`~vllm_admission.fidelity.twin` (the simulator set up like the
engine), :mod:`~vllm_admission.fidelity.compare` (request-by-request
comparison and the bar), :mod:`~vllm_admission.fidelity.runner` (both sides, every
pair), :mod:`~vllm_admission.fidelity.summary` (files and tables).
"""

from vllm_admission.fidelity.compare import EXACT_ADMISSIONS, TOLERANCE, compare_hits, meets_bar
from vllm_admission.fidelity.runner import run_fidelity, run_pair
from vllm_admission.fidelity.spec import MODES, FidelityError, FidelitySpec
from vllm_admission.fidelity.summary import format_fidelity, plot_fidelity, write_fidelity
from vllm_admission.fidelity.twin import costs_like_engine, simulate_like_engine

__all__ = ["EXACT_ADMISSIONS", "MODES", "TOLERANCE", "FidelityError", "FidelitySpec", "compare_hits",
           "costs_like_engine", "format_fidelity", "meets_bar", "plot_fidelity", "run_fidelity",
           "run_pair", "simulate_like_engine", "write_fidelity"]
