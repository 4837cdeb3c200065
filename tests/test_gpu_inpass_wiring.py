"""In-pass checkpoints wired into vLLM's GPU engine, the parts that need no GPU: the step's
capture built from the metadata, the metadata that carries it, the wrappers' behaviour
outside and inside a captured layer call, and the settings a GPU engine is refused without.
The capture's writes through vLLM's own Triton kernels are checked under Triton's
interpreter in ``tests/test_gdn_chunk_capture.py``."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from vllm_admission.plugin.runner import gdn_chunk_capture as cap


def test_step_capture_maps_the_plan_to_the_prefill_rows() -> None:
    # Rows with running blocks 7, 3, 9; the step's plan names 7 and 9 only.
    plan = {7: ((64, 20), (192, 21)), 9: ((128, 22),), 5: ((64, 23),)}
    found = cap.step_capture(plan, [7, 3, 9], [0, 200, 300, 500], decode_tokens=4,
                             conv_width=4)
    assert found is not None
    assert found.plan.rows == (20, 21, 22)
    assert found.plan.token_end == (64, 192, 300 + 128)
    assert (found.decode_tokens, found.prefill_tokens) == (4, 500)
    # An offset at or past the chunk end is not this step's.
    assert cap.step_capture({7: ((200, 20),)}, [7], [0, 200], decode_tokens=0,
                            conv_width=4) is None
    assert cap.step_capture({}, [7], [0, 200], decode_tokens=0, conv_width=4) is None
    with pytest.raises(ValueError, match="not a multiple of the GDN chunk size 64"):
        cap.step_capture({7: ((96, 20),)}, [7], [0, 200], decode_tokens=0, conv_width=4)


def test_the_metadata_carries_the_capture_and_stays_vllms() -> None:
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadata

    md = GDNAttentionMetadata(num_prefills=1, num_prefill_tokens=200, num_decodes=0,
                              num_decode_tokens=0, num_spec_decodes=0,
                              num_spec_decode_tokens=0, num_actual_tokens=200)
    found = cap.step_capture({7: ((64, 20),)}, [7], [0, 200], decode_tokens=0, conv_width=4)
    got = cap.with_capture(md, found)
    assert isinstance(got, GDNAttentionMetadata) and got.inpass_capture is found
    assert all(getattr(got, f.name) is getattr(md, f.name) for f in dataclasses.fields(md))
    assert not hasattr(md, "inpass_capture")
    assert type(cap.with_capture(md, found)) is type(got)        # one subclass per class


def test_the_wrappers_call_vllm_unchanged_without_a_capture() -> None:
    calls = []
    capture = cap.GPUCapture()
    conv = capture.conv_fn(lambda x, *a, **k: calls.append(("conv", x)) or "conv-out")
    rule = capture.chunk_rule(lambda **k: calls.append(("rule", k)) or ("o", "final"),
                              conv_state_dim_first=lambda: False)

    def core(layer, *args):
        return conv("x", 1), rule(q=1, k=2)

    for metadata in (None, SimpleNamespace(inpass_capture=None)):
        wrapped = capture.forward_core(core, lambda layer, md=metadata: md)
        assert wrapped(SimpleNamespace()) == ("conv-out", ("o", "final"))
    assert calls == [("conv", "x"), ("rule", {"q": 1, "k": 2})] * 2
    assert capture._call() is None  # noqa: SLF001 - no call left current


def test_a_captured_call_is_current_only_while_the_layer_runs() -> None:
    capture = cap.GPUCapture()
    found = cap.step_capture({7: ((64, 20),)}, [7], [0, 200], decode_tokens=0, conv_width=4)
    seen = []

    def core(layer):
        seen.append(capture._call())  # noqa: SLF001
        raise RuntimeError("kernel failed")

    wrapped = capture.forward_core(core, lambda layer: SimpleNamespace(inpass_capture=found))
    layer = SimpleNamespace()
    with pytest.raises(RuntimeError, match="kernel failed"):
        wrapped(layer)
    assert seen[0].capture is found and seen[0].layer is layer
    assert capture._call() is None  # noqa: SLF001 - cleared on the error path too
    # The chunk rule of a captured call needs the conv input first.
    rule = capture.chunk_rule(lambda **k: None, conv_state_dim_first=lambda: False)

    def rule_first(layer):
        rule(q=torch.zeros(1))

    with pytest.raises(RuntimeError, match="ran before the conv"):
        capture.forward_core(rule_first, lambda layer: SimpleNamespace(inpass_capture=found))(
            layer)


@pytest.fixture
def gpu_config(tmp_path, monkeypatch):
    """The tiny Qwen3-Next's vLLM config, with vLLM's platform answering as CUDA."""
    import vllm.platforms

    from vllm_admission_testing.harness import make_vllm_config, write_config_only_model

    cfg = make_vllm_config(write_config_only_model(tmp_path), max_model_len=8192)
    fake = SimpleNamespace(is_cuda=lambda: True, is_cpu=lambda: False, device_type="cuda")
    monkeypatch.setattr(vllm.platforms, "_current_platform", fake)
    return cfg


def test_the_gpu_path_names_what_it_needs(gpu_config, monkeypatch) -> None:
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as gdn

    from vllm_admission.plugin import inpass

    monkeypatch.setattr(gdn, "_resolve_gdn_prefill_backend", lambda cfg: ("auto", "flashinfer"))
    monkeypatch.setattr(gpu_config.cache_config, "block_size", 544)
    problems = inpass.inpass_problems(gpu_config)
    assert len(problems) == 2
    assert "GDN prefill backend 'flashinfer'" in problems[0]
    assert '"gdn_prefill_backend": "triton"' in problems[0]
    assert "block size 544 is not a multiple of the GDN chunk size 64" in problems[1]
    monkeypatch.setattr(gdn, "_resolve_gdn_prefill_backend", lambda cfg: ("triton", "triton"))
    monkeypatch.setattr(gpu_config.cache_config, "block_size", 576)
    assert inpass.inpass_problems(gpu_config) == []
    # The hook wraps the V1 runner: vLLM's V2 runner is named with the setting that avoids it.
    monkeypatch.setattr(type(gpu_config), "use_v2_model_runner", property(lambda self: True))
    (problem,) = inpass.inpass_problems(gpu_config)
    assert "V2 model runner" in problem and "VLLM_USE_V2_MODEL_RUNNER=0" in problem


_INSTALL = """
import json
from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as gdn
from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder as Builder
from vllm_admission.plugin.boundary import hooks
from vllm_admission.plugin.runner.inpass_runner import StepCheckpoints

vllm_fns = (gdn.QwenGatedDeltaNetAttention._forward_core, gdn.causal_conv1d_fn,
            gdn.fla_chunk_gated_delta_rule, Builder.build)
channel = StepCheckpoints()
hooks._install_gdn_chunk_capture(channel)
first = (gdn.QwenGatedDeltaNetAttention._forward_core, gdn.causal_conv1d_fn,
         gdn.fla_chunk_gated_delta_rule, Builder.build)
hooks._install_gdn_chunk_capture(channel)        # idempotent
again = (gdn.QwenGatedDeltaNetAttention._forward_core, gdn.causal_conv1d_fn,
         gdn.fla_chunk_gated_delta_rule, Builder.build)
print(json.dumps({
    "wrapped": [f is not v for f, v in zip(first, vllm_fns)],
    "originals": [getattr(f, "_admission_original", None) is v for f, v in zip(first, vllm_fns)],
    "idempotent": [a is b for a, b in zip(first, again)],
    "channel": Builder.build._admission_step is channel,
}))
"""


def test_the_gpu_hooks_wrap_vllms_functions_once() -> None:
    """In a fresh process: each of the four vLLM functions is wrapped, keeps vLLM's as its
    original, and a second install changes nothing."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", _INSTALL], cwd=root, capture_output=True,
                         text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"wrapped": [True] * 4, "originals": [True] * 4, "idempotent": [True] * 4,
                   "channel": True}


def test_inpass_is_read_from_the_scheduler_class_or_the_environment(tmp_path, monkeypatch):
    from vllm_admission.plugin.env import Settings
    from vllm_admission.plugin.inpass import inpass_requested
    from vllm_admission.plugin.scheduler import AdmissionScheduler
    from vllm_admission_testing.harness import make_vllm_config, write_config_only_model

    cfg = make_vllm_config(write_config_only_model(tmp_path), max_model_len=8192)
    sched = cfg.scheduler_config
    for mode in ("inpass", "split"):
        settings = Settings.from_env({"VLLM_ADMISSION_CHECKPOINT": mode})
        monkeypatch.setattr(sched, "scheduler_cls", AdmissionScheduler.configured(settings))
        assert inpass_requested(cfg) is (mode == "inpass")
    monkeypatch.setattr(sched, "scheduler_cls", "vllm_admission.AdmissionScheduler")
    monkeypatch.setenv("VLLM_ADMISSION_CHECKPOINT", "inpass")
    assert inpass_requested(cfg) is True
    monkeypatch.setenv("VLLM_ADMISSION_CHECKPOINT", "split")
    assert inpass_requested(cfg) is False
    monkeypatch.setattr(sched, "scheduler_cls", None)             # stock vLLM
    monkeypatch.setenv("VLLM_ADMISSION_CHECKPOINT", "inpass")
    assert inpass_requested(cfg) is False


def test_on_cuda_inpass_turns_vllms_mamba2_export_off(gpu_config, monkeypatch) -> None:
    """Under ``inpass`` on a GPU the Mamba2 layers declare no export of their own (in-pass
    writes the prompt end through the same fields); otherwise vLLM's spec is unchanged."""
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
    from vllm.v1.kv_cache_interface import MambaSpec

    from vllm_admission.plugin import inpass
    from vllm_admission.plugin.boundary.register import install_gpu_export_off

    spec = MambaSpec(block_size=128, shapes=((3, 512), (4, 64, 64)),
                     dtypes=(torch.bfloat16, torch.float32), mamba_cache_mode="align",
                     num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1)
    monkeypatch.setattr(MambaMixer2, "get_kv_cache_spec", lambda self, cfg: spec)
    assert install_gpu_export_off() is True
    asked = {"value": True}
    monkeypatch.setattr(inpass, "inpass_requested", lambda cfg: asked["value"])
    got = MambaMixer2.get_kv_cache_spec(None, gpu_config)
    assert (got.num_prefill_checkpoint_blocks, got.prefill_checkpoint_alignment) == (0, None)
    assert got.shapes == spec.shapes and got.block_size == spec.block_size
    asked["value"] = False
    assert MambaMixer2.get_kv_cache_spec(None, gpu_config) is spec
