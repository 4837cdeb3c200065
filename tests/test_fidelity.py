"""``vllm-admission fidelity``: engine and simulator compared request by request.

The engine tests are the project's fidelity gate: on a small synthetic trace whose pool is
small enough to evict on most requests, vLLM with the plugin and the simulator configured
from that engine must agree on every request's cached tokens.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from fidelity_cases import SMALL, small_synthetic

from vllm_admission.cli import main
from vllm_admission.core.costs import ModelCosts
from vllm_admission.core.eviction import ENGINE_EVICTION_POLICIES
from vllm_admission.core.geometry import CPU_BLOCK_SIZE, CPU_KERNEL_BLOCK_SIZE, aligned_block_size
from vllm_admission.core.traces import load_trace
from vllm_admission.engine.engine_geometry import EngineGeometry, KVCacheGroupInfo
from vllm_admission.engine.tiny_model import TINY_MODEL_ARCHS
from vllm_admission.fidelity import (
    FidelityError,
    compare_hits,
    costs_like_engine,
    meets_bar,
    simulate_like_engine,
)


def run(argv, capsys):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


# ---------------------------------------------------------------- comparison, no engine
def test_compare_hits_counts_requests_and_tokens():
    cmp = compare_hits([100, 200, 300, 400], [0, 128, 256, None], [0, 0, 256, None])
    assert cmp == {"requests": 3, "requests_differing": 1, "abs_diff_tokens": 128,
                   "prompt_tokens": 600, "abs_diff_fraction": 128 / 600, "first_difference": 1}


def test_a_request_only_one_side_ran_differs_by_its_prompt():
    cmp = compare_hits([100, 50], [None, 0], [0, 0])
    assert cmp["requests"] == 2 and cmp["requests_differing"] == 1
    assert cmp["abs_diff_tokens"] == 100 and cmp["first_difference"] == 0


def test_compare_hits_refuses_lists_of_different_lengths():
    with pytest.raises(ValueError, match="differ in length"):
        compare_hits([1, 2], [0], [0, 0])


@pytest.mark.parametrize("admission,eviction,differing,fraction,ok", [
    ("vllm", "lru", 0, 0.0, True),
    ("vllm", "lru", 1, 0.0001, False),     # exact pairs: one request is a miss of the bar
    ("dense", "lru", 1, 0.0001, False),
    ("marconi", "lru", 3, 0.009, True),     # marconi and flop: within 1 % of prompt tokens
    ("vllm", "flop", 3, 0.011, False),
])
def test_fidelity_bar(admission, eviction, differing, fraction, ok):
    rec = {"admission": admission, "eviction": eviction, "requests_differing": differing,
           "abs_diff_fraction": fraction, "mode": "sequential"}
    assert meets_bar(rec) is ok
    assert meets_bar({**rec, "mode": "timed"})  # concurrency drift is reported, not judged


def _engine_geometry(num_blocks, kinds=("state", "attention"), page=65536, block_size=128,
                     **extra):
    return EngineGeometry(block_size=block_size, num_gpu_blocks=num_blocks,
                          max_num_batched_tokens=4096, max_model_len=4096,
                          kv_cache_groups=tuple(KVCacheGroupInfo(kind=k, num_layers=2,
                                                                 block_size=block_size,
                                                                 page_size_bytes=page)
                                                for k in kinds), **extra)


def test_engine_geometry_keeps_the_replay_documents_keys():
    """:meth:`EngineGeometry.to_dict` is ``replay``'s ``results.json`` ``geometry``: its keys in
    their order, the in-process ones only in process, never the dtypes fidelity adds."""
    keys = ["block_size", "num_gpu_blocks", "max_num_batched_tokens", "max_model_len",
            "mamba_cache_mode", "mamba_ssm_cache_dtype", "prefix_cache_retention_interval",
            "prefix_match_unit", "speculative_method", "num_speculative_tokens",
            "enable_chunked_prefill", "async_scheduling", "max_num_seqs", "scheduler_cls",
            "kv_cache_groups", "ssm_state_dtype", "inprocess"]
    geo = _engine_geometry(48, dtype="bfloat16", kv_cache_dtype="auto")
    assert list(geo.to_dict()) == keys
    inprocess = dataclasses.replace(geo, inprocess=True).to_dict()
    assert list(inprocess) == keys + ["hidden_state_bytes_per_token", "host_chunks", "host_policy",
                                      "host_admission", "prompt_end_export"]
    assert inprocess["kv_cache_groups"][0] == {"kind": "state", "num_layers": 2, "block_size": 128,
                                               "page_size_bytes": 65536, "layers": []}
    assert json.loads(json.dumps(inprocess)) == inprocess


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory):
    pytest.importorskip("transformers")
    from vllm_admission_testing.harness import write_config_only_model

    return write_config_only_model(tmp_path_factory.mktemp("tiny_cfg")) / "config.json"


@pytest.fixture(scope="module")
def tiny_costs(tiny_config):
    return ModelCosts.from_config(tiny_config)


def _cpu_engine_geometry(costs, num_blocks, **extra):
    """What a CPU engine reports for ``costs``: its aligned block size, pages of that many tokens."""
    block = aligned_block_size(costs, CPU_BLOCK_SIZE, kernel_block_size=CPU_KERNEL_BLOCK_SIZE)
    per_token = costs.kv_bytes_per_token // len(costs.attention_layers)  # one layer's K and V
    return _engine_geometry(num_blocks, page=block * per_token, block_size=block,
                            ssm_state_dtype=costs.ssm_dtype, **extra)


def test_simulator_takes_the_engines_layout(tiny_costs):
    trace = load_trace("synthetic", num_requests=12, agent_fraction=0.0, chat_fraction=0.5,
                       fewshot_fraction=0.5)
    res = simulate_like_engine(trace, tiny_costs, _engine_geometry(48), admission="vllm",
                               eviction="lru", alpha=None)
    assert (res.num_blocks, res.block_size) == (48, 128)
    assert len(res.per_request_hits) == 12


@pytest.mark.parametrize("geometry,what", [
    (_engine_geometry(48, kinds=("attention", "state")), "groups"),
    (_engine_geometry(48, page=32768), "bytes per block"),
])
def test_a_layout_the_simulator_does_not_derive_is_an_error(tiny_costs, geometry, what):
    trace = load_trace("synthetic", num_requests=4)
    with pytest.raises(FidelityError, match=what):
        simulate_like_engine(trace, tiny_costs, geometry, admission="vllm", eviction="lru",
                             alpha=None)


@pytest.mark.parametrize("setting,allocated", [
    ("auto", "bfloat16"),        # vLLM's GPU rule: Qwen3-Next's GDN state in the model dtype
    ("bfloat16", "bfloat16"),
    ("float32", "float32"),      # e.g. "auto" reset by vLLM's CPU platform on AVX-512 BF16 CPUs
])
def test_costs_follow_the_engines_ssm_dtype(tiny_config, setting, allocated):
    geometry = _engine_geometry(48, dtype="bfloat16", kv_cache_dtype="auto", mamba_cache_dtype="auto",
                                mamba_ssm_cache_dtype=setting, ssm_state_dtype=allocated)
    costs = costs_like_engine(tiny_config, geometry)
    assert (costs.mamba_ssm_cache_dtype, costs.ssm_dtype) == (setting, allocated)
    assert costs.state_bytes == ModelCosts.from_config(
        tiny_config, mamba_ssm_cache_dtype=allocated).state_bytes
    # Without dtypes (None) everything is "auto".
    assert costs_like_engine(tiny_config, _engine_geometry(48, mamba_ssm_cache_dtype=None)
                             ).ssm_dtype == "bfloat16"


def test_an_ssm_dtype_the_settings_do_not_give_is_an_error(tiny_config, tiny_costs):
    with pytest.raises(FidelityError, match="stores the SSM state of .* in float32"):
        costs_like_engine(tiny_config, _engine_geometry(48, mamba_ssm_cache_dtype="auto",
                                                        ssm_state_dtype="float32"))
    # simulate_like_engine checks it too: bf16 costs for a float32-state engine.
    f32 = ModelCosts.from_config(tiny_config, mamba_ssm_cache_dtype="float32")
    with pytest.raises(FidelityError, match="SSM state"):
        simulate_like_engine(load_trace("synthetic", num_requests=4), tiny_costs,
                             _cpu_engine_geometry(f32, 48), admission="vllm", eviction="lru",
                             alpha=None)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_layout_check_holds_in_both_state_dtypes(tiny_config, dtype):
    costs = costs_like_engine(tiny_config, _engine_geometry(48, mamba_ssm_cache_dtype=dtype))
    trace = load_trace("synthetic", num_requests=12, agent_fraction=0.0, chat_fraction=0.5,
                       fewshot_fraction=0.5)
    geometry = _cpu_engine_geometry(costs, 48, mamba_ssm_cache_dtype=dtype)
    res = simulate_like_engine(trace, costs, geometry, admission="vllm", eviction="lru", alpha=None)
    assert (res.num_blocks, res.block_size, res.ssm_dtype) == (48, geometry.block_size, dtype)
    assert len(res.per_request_hits) == 12
    half = dataclasses.replace(geometry, kv_cache_groups=tuple(
        dataclasses.replace(g, page_size_bytes=g.page_size_bytes // 2) for g in geometry.kv_cache_groups))
    with pytest.raises(FidelityError, match="bytes per block"):
        simulate_like_engine(trace, costs, half, admission="vllm", eviction="lru", alpha=None)


def test_vllms_cpu_rule_reaches_the_simulator(tiny_config, monkeypatch):
    """vLLM's CPU platform on an AVX-512 BF16 CPU: "auto" becomes float32 and the block grows."""
    pytest.importorskip("vllm")
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.models import ModelRegistry
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from vllm_admission.fidelity.runner import _engine_dtypes

    if not current_platform.is_cpu():
        pytest.skip("vLLM's CPU platform rule")
    # vllm/platforms/cpu.py check_and_update_config asks torch whether the CPU has AVX-512 BF16.
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    vc = EngineArgs(model=str(tiny_config.parent), skip_tokenizer_init=True, dtype="bfloat16",
                    enable_prefix_caching=True, enforce_eager=True,
                    max_model_len=4096).create_engine_config()
    assert vc.cache_config.mamba_ssm_cache_dtype == "float32"
    current_platform._align_hybrid_block_size(vc, CPUAttentionBackend)
    model_cls, _ = ModelRegistry.resolve_model_cls(vc.model_config.architecture,
                                                   model_config=vc.model_config)
    state_dtype = str(model_cls.get_mamba_state_dtype_from_config(vc)[1]).removeprefix("torch.")
    geometry = _engine_geometry(48, **_engine_dtypes(vc),
                                mamba_ssm_cache_dtype=vc.cache_config.mamba_ssm_cache_dtype,
                                ssm_state_dtype=state_dtype)
    assert geometry.dtype == "bfloat16" and state_dtype == "float32"
    costs = costs_like_engine(tiny_config, geometry)
    assert costs.ssm_dtype == "float32"
    block = aligned_block_size(costs, CPU_BLOCK_SIZE, kernel_block_size=CPU_KERNEL_BLOCK_SIZE)
    assert block == vc.cache_config.block_size
    # The default ("auto" read as on a GPU) would have predicted the bf16 engine's smaller block.
    assert aligned_block_size(ModelCosts.from_config(tiny_config), CPU_BLOCK_SIZE,
                              kernel_block_size=CPU_KERNEL_BLOCK_SIZE) < block


@pytest.mark.parametrize("extra,message", [
    (["--admission", "vllm,bogus"], "unknown admission policy 'bogus'"),
    (["--eviction", "belady"],
     f"unknown eviction policy 'belady'; valid: {', '.join(ENGINE_EVICTION_POLICIES)}"),
    (["--num-gpu-blocks", "64,x"], "--num-gpu-blocks '64,x': expected a comma list of integers"),
    (["--num-gpu-blocks", "1"], "a pool needs at least 2 blocks"),
    (["--synthetic", "num_requests"], "--synthetic 'num_requests': expected KEY=VALUE"),
    (["--synthetic", "num_requests=ten"], "the value is not JSON"),
    (["--max-output-len", "0"], "--max-output-len must be >= 1, got 0"),
    (["--time-scale", "-1"], "time scale must be >= 0"),
])
def test_bad_input_is_one_error_line(tmp_path, capsys, extra, message):
    (tmp_path / "config.json").write_text("{}")
    rc, _, err = run(["fidelity", "--model", str(tmp_path), "--out", str(tmp_path / "o"), *extra],
                     capsys)
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("vllm-admission: error: ") and message in err
    assert not (tmp_path / "o").exists()


def test_model_without_config(tmp_path, capsys):
    rc, _, err = run(["fidelity", "--model", str(tmp_path), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and "no config.json there" in err


# ---------------------------------------------------------------- the real engine
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    pytest.importorskip("vllm")
    from vllm_admission.engine.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny_qwen3_next_fidelity"))


@pytest.mark.engine
@pytest.mark.parametrize("arch", TINY_MODEL_ARCHS)
def test_engine_and_simulator_agree_on_every_request_under_eviction(tiny_model_of, arch, tmp_path,
                                                                    capsys, engine_env,
                                                                    monkeypatch):
    """The gate: vllm+lru (stock) and dense+lru, a 40-block pool, every request equal, for
    both tiny models (Gated DeltaNet and Mamba2) in vLLM's default geometry on this CPU.
    Where the pool cannot hold the model's full length, only the first pair's engine is
    refused at it: the second starts at the length vLLM fitted."""
    pytest.importorskip("vllm")
    from vllm_admission.engine import llm as engine_llm

    builds = []
    build_llm = engine_llm.build_llm

    def counted(settings):
        builds.append(settings.max_model_len)
        return build_llm(settings)

    monkeypatch.setattr(engine_llm, "build_llm", counted)
    out = tmp_path / "fid"
    model = tiny_model_of(arch)
    rc, stdout, err = run(["fidelity", "--model", str(model), "--admission", "vllm,dense",
                           "--eviction", "lru", "--num-gpu-blocks", "40", "--max-output-len", "8",
                           "--check", "--out", str(out),
                           *[a for s in SMALL for a in ("--synthetic", s)]], capsys)
    doc = json.loads((out / "fidelity.json").read_text())
    assert (out / "fidelity.png").stat().st_size > 0
    recs = doc["records"]
    assert [(r["admission"], r["eviction"], r["num_blocks"]) for r in recs] == [
        ("vllm", "lru", 40), ("dense", "lru", 40)]
    for r in recs:
        pr = r["per_request"]
        assert r["requests"] == len(pr["engine"]) >= 20
        assert pr["engine"] == pr["simulator"], (r["admission"], r["first_difference"])
        assert r["requests_differing"] == 0 and r["abs_diff_fraction"] == 0.0
        assert r["engine"]["evictions"] > 0          # the pool really was under pressure
        assert r["engine"]["evictions"] == r["simulator"]["evictions"]
        assert 0 < r["engine"]["hit_tokens"] < r["prompt_tokens"]
        # Prefill steps: counted in the live scheduler, predicted by the core model.
        assert pr["engine_prefill_steps"] == pr["simulator_prefill_steps"], r["admission"]
        assert all(n >= 1 for n in pr["engine_prefill_steps"])
        assert r["prefill_steps_differing"] == 0
        assert r["engine"]["prefill_steps"] == r["simulator"]["prefill_steps"] == sum(
            pr["engine_prefill_steps"])
    # dense ends a chunk at every block boundary: more steps than stock on the same requests.
    assert recs[1]["engine"]["prefill_steps"] > recs[0]["engine"]["prefill_steps"]
    assert "steps eng/sim" in stdout
    assert rc == 0, err
    assert "fidelity bar missed" not in err
    assert recs[0]["engine"]["prefill_seconds_vs_stock"] == 1.0
    full = json.loads((model / "config.json").read_text())["max_position_embeddings"]
    fitted = recs[0]["max_model_len"]
    assert recs[1]["max_model_len"] == fitted <= full
    assert builds == ([None, fitted, fitted] if fitted < full else [None, None])


@pytest.mark.engine
def test_timed_mode_overlaps_requests(tiny_model, tmp_path, engine_env):
    """With time scale 0 every request is submitted at once; all still run and are compared."""
    from vllm_admission.fidelity import FidelitySpec, run_fidelity

    spec = FidelitySpec(model=str(tiny_model), trace="synthetic", num_gpu_blocks=(64,),
                        max_output_len=4, mode="timed", time_scale=0.0,
                        synthetic=dict(num_requests=8, agent_fraction=0.0, chat_fraction=0.5,
                                       fewshot_fraction=0.5, max_prompt_len=3000))
    (rec,) = run_fidelity(spec)["records"]
    pr = rec["per_request"]
    assert rec["mode"] == "timed" and rec["requests"] == 8
    assert all(h is not None for h in pr["engine"])
    # Every request was handed over before the first finished (its prefill alone takes longer).
    assert max(pr["submitted_s"]) < min(pr["prefill_seconds"])
    # Counted per engine request id while the requests overlap.
    assert all(n >= 1 for n in pr["engine_prefill_steps"])
    assert rec["engine"]["prefill_steps"] == sum(pr["engine_prefill_steps"])
    assert meets_bar(rec)  # timed records are reported, never judged


@pytest.mark.engine
@pytest.mark.parametrize("checkpoint,start", [("split", "vllm+lru"), ("inpass", "dense+lru")])
def test_auto_switches_in_the_engine_as_in_the_simulator(tiny_model, engine_env, checkpoint, start):
    """auto+auto deciding every 6 requests: the engine switches at the same requests to the
    same pairs as the simulator (from the start pair of its checkpoint mode: stock in
    ``split`` mode, ``dense`` in-pass), and every request's cached tokens are equal. The SSM
    dtype is pinned through vLLM's own argument: the case is sized for the bf16 geometry
    (B = 128), which vLLM's CPU platform would otherwise double on CPUs with AVX-512 BF16."""
    from vllm_admission.fidelity import FidelitySpec, run_fidelity

    synthetic = small_synthetic()
    spec = FidelitySpec(model=str(tiny_model), trace="synthetic", pairs=(("auto", "auto"),),
                        num_gpu_blocks=(40,), max_output_len=8, auto_interval=6,
                        synthetic=synthetic, mamba_ssm_cache_dtype="bfloat16",
                        checkpoint=checkpoint)
    (rec,) = run_fidelity(spec)["records"]
    pr = rec["per_request"]
    assert rec["requests"] == len(pr["engine"]) >= 20
    engine_switches = rec["engine"]["policy_switches"]
    sim_switches = rec["simulator"]["policy_switches"]
    assert engine_switches, "no switch: the case no longer exercises switching"
    assert engine_switches[0]["from"] == start
    assert [(s["at"], s["from"], s["to"]) for s in engine_switches] == \
        [(s["at"], s["from"], s["to"]) for s in sim_switches]
    assert all((s["at"] + 1) % 6 == 0 for s in engine_switches)
    assert pr["engine"] == pr["simulator"], rec["first_difference"]
    assert rec["engine"]["evictions"] == rec["simulator"]["evictions"] > 0


@pytest.mark.engine
@pytest.mark.parametrize("blocks_per_interval, eviction", [(2, "lru"), (None, "lru"), (2, "reuse")],
                         ids=["every-2-blocks", "dense", "every-2-blocks-reuse"])
def test_stock_retention_settings_are_mirrored_exactly(tiny_model, engine_env,
                                                       blocks_per_interval, eviction):
    """vLLM's own ``prefix_cache_retention_interval`` (N tokens, or None: dense), given to
    the engine and read back from it by the simulator: ``vllm`` with ``lru`` (stock), and
    with the plugin's ``reuse`` eviction beside it, agrees on every request's cached
    tokens, prefill steps and evictions, and keeps more states than vLLM's default (0)
    predicts for the same requests. The SSM dtype is pinned through vLLM's own argument
    so the block size (and so the interval's grid) is the same on every CPU; the prefill
    budget of 512 tokens writes states at chunk ends below the prompt end."""
    from engine_cases import predicted_block_size

    from vllm_admission.fidelity import FidelitySpec, run_fidelity

    B = predicted_block_size(tiny_model, "bfloat16")
    interval = None if blocks_per_interval is None else blocks_per_interval * B
    synthetic = small_synthetic()
    spec = FidelitySpec(model=str(tiny_model), trace="synthetic", num_gpu_blocks=(40,),
                        max_output_len=8, synthetic=synthetic, mamba_ssm_cache_dtype="bfloat16",
                        evictions=(eviction,),
                        engine_args={"prefix_cache_retention_interval": interval,
                                     "max_num_batched_tokens": 512})
    (rec,) = run_fidelity(spec)["records"]
    assert rec["block_size"] == B and rec["chunk_size"] == 512
    assert rec["prefix_cache_retention_interval"] == interval
    pr = rec["per_request"]
    assert rec["requests"] == len(pr["engine"]) >= 20
    assert pr["engine"] == pr["simulator"], rec["first_difference"]
    assert pr["engine_prefill_steps"] == pr["simulator_prefill_steps"]
    assert rec["engine"]["evictions"] == rec["simulator"]["evictions"] > 0
    # The setting changed what was kept: vLLM's default (0) keeps fewer states here.
    from vllm_admission.fidelity.runner import load_trace_of
    from vllm_admission.sim.simulator import SimulationSettings, simulate

    costs = ModelCosts.from_config(f"{tiny_model}/config.json", mamba_ssm_cache_dtype="bfloat16")
    default = simulate(load_trace_of(spec), costs, SimulationSettings.of(
        "vllm", eviction, num_blocks=40, block_size=B, chunk_size=512, outputs="unique",
        retention_interval=0))
    assert rec["simulator"]["state_checkpoints"] > default.state_checkpoints


def test_a_speculative_method_the_simulator_does_not_mirror_is_refused(tiny_model_dir):
    from vllm_admission.fidelity import FidelitySpec
    from vllm_admission.fidelity.spec import FidelityError

    with pytest.raises(FidelityError, match="method mtp, extract_hidden_states only"):
        FidelitySpec(model=str(tiny_model_dir), trace="synthetic",
                     engine_args={"speculative_config": {"method": "ngram",
                                                         "num_speculative_tokens": 2}}).check()


@pytest.mark.parametrize("kwargs, error, message", [
    ({"engine_args": {"kv_transfer_config": {"kv_connector": "NixlConnector",
                                             "kv_role": "kv_both"}}},
     "FidelityError", "connector OffloadingConnector only"),
    ({"offload": 1 << 20, "engine_args": {"kv_transfer_config": {
        "kv_connector": "OffloadingConnector", "kv_role": "kv_both"}}},
     "FidelityError", "give it or kv_transfer_config, not both"),
    ({"offload": 0}, "UserError", "positive number of bytes"),
    ({"offload": 1 << 20, "host_policy": "arc"}, "UnknownPolicyError", "got 'arc'"),
    ({"engine_args": {"kv_transfer_config": {
        "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 20, "eviction_policy": "arc"}}}},
     "UnknownPolicyError", "got 'arc'"),
    ({"offload": 1 << 20, "engine_args": {"prefix_match_unit": 32}},
     "FidelityError", "without speculative decoding and with whole-block hashes only"),
])
def test_a_host_tier_the_simulator_does_not_model_is_refused(tiny_model_dir, kwargs, error,
                                                             message):
    from vllm_admission.core.admission import UnknownPolicyError
    from vllm_admission.core.errors import UserError
    from vllm_admission.fidelity import FidelitySpec
    from vllm_admission.fidelity.spec import FidelityError

    cls = {"FidelityError": FidelityError, "UserError": UserError,
           "UnknownPolicyError": UnknownPolicyError}[error]
    with pytest.raises(cls, match=message):
        FidelitySpec(model=str(tiny_model_dir), trace="synthetic", **kwargs).check()


def test_an_offloading_connector_config_is_mirrored_as_given(tiny_model_dir):
    """``--kv-transfer-config`` naming vLLM's OffloadingConnector (the long form of
    ``--offload``) passes the check; the host tier is read from the engine."""
    from vllm_admission.fidelity import FidelitySpec
    from vllm_admission.plugin.offload_config import offloading_connector_config

    FidelitySpec(model=str(tiny_model_dir), trace="synthetic",
                 engine_args={"kv_transfer_config": offloading_connector_config(1 << 20)}).check()
