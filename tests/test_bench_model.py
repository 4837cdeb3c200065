"""``make-tiny-model --size bench``: the serving benchmark's model keeps the tiny model's
block size (so where hits can land is the same) and only adds compute."""

from __future__ import annotations

import pytest

from vllm_admission.core.costs import ModelCosts
from vllm_admission.core.errors import UserError
from vllm_admission.core.geometry import CPU_BLOCK_SIZE, CPU_KERNEL_BLOCK_SIZE, aligned_block_size
from vllm_admission.engine.tiny_model import (
    TINY_MODEL_ARCHS,
    make_tiny_model,
    tiny_model_config_kwargs,
)

ARCH_NAMES = {"qwen3-next": ("Qwen3NextForCausalLM", "qwen3_next"),
              "nemotron-h": ("NemotronHForCausalLM", "nemotron_h")}


def _costs(arch: str, size: str, ssm_dtype: str) -> ModelCosts:
    name, model_type = ARCH_NAMES[arch]
    config = dict(tiny_model_config_kwargs(arch=arch, size=size), architectures=[name],
                  model_type=model_type, torch_dtype="bfloat16")
    return ModelCosts.from_config(config, mamba_ssm_cache_dtype=ssm_dtype)


@pytest.mark.parametrize("arch", TINY_MODEL_ARCHS)
@pytest.mark.parametrize("ssm_dtype", ["bfloat16", "float32"])
def test_the_bench_size_keeps_the_cache_geometry_and_adds_compute(arch, ssm_dtype):
    tiny, bench = _costs(arch, "tiny", ssm_dtype), _costs(arch, "bench", ssm_dtype)
    block = [aligned_block_size(c, CPU_BLOCK_SIZE, kernel_block_size=CPU_KERNEL_BLOCK_SIZE)
             for c in (tiny, bench)]
    assert block[0] == block[1]
    assert bench.prefill_flops(2048, 0) > 8 * tiny.prefill_flops(2048, 0)


def test_unknown_sizes_and_an_mtp_bench_model_are_refused(tmp_path):
    with pytest.raises(UserError, match="unknown model size 'huge'"):
        tiny_model_config_kwargs(size="huge")
    with pytest.raises(UserError, match="tiny size only"):
        make_tiny_model(tmp_path, size="bench", mtp=True)
    assert not any(tmp_path.iterdir())
