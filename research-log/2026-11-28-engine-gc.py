"""What vLLM's garbage-collector freeze costs a process that starts many engines.

Starts six in-process engines of the tiny Qwen3-Next one after the other (40 blocks, bf16
state), serves five 600-token prompts on each and shuts it down, and prints each engine's
CPU seconds for the build, the requests and the shutdown. With ``freeze`` the heap is frozen
again after every shutdown (what ``tests/conftest.py`` does for engine tests); with ``plain``
it is not.

Run: ``.venv/bin/python research-log/2026-11-28-engine-gc.py plain|freeze MODEL_DIR``
(``MODEL_DIR`` from ``vllm-admission make-tiny-model``), with ``OMP_NUM_THREADS=1``.
"""

from __future__ import annotations

import gc
import os
import random
import sys
import time

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from vllm import SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

from vllm_admission.engine.llm import EngineSettings, build_llm, shutdown_llm  # noqa: E402


def main(mode: str, model: str) -> None:
    rng = random.Random(0)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, detokenize=False)
    for _ in range(6):
        c0 = time.process_time()
        llm = build_llm(EngineSettings(model=model, max_model_len=4096, num_gpu_blocks=40,
                                       mamba_ssm_cache_dtype="bfloat16",
                                       env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}))
        c1 = time.process_time()
        for _ in range(5):
            prompt = [rng.randrange(3, 500) for _ in range(600)]
            llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
        c2 = time.process_time()
        shutdown_llm(llm)
        if mode == "freeze":
            gc.freeze()
        del llm
        gc.collect()
        c3 = time.process_time()
        print(f"{mode}: build {c1 - c0:.2f} s, 5 requests {c2 - c1:.2f} s, "
              f"shutdown {c3 - c2:.2f} s (CPU)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
