"""``vllm-admission fidelity``: engine and simulator compared request by request.

The engine tests are the project's fidelity gate: on a small synthetic trace whose pool is
small enough to evict on most requests, vLLM with the plugin and the simulator configured
from that engine must agree on every request's cached tokens.
"""

from __future__ import annotations

import json

import pytest

from vllm_admission.cli import main
from vllm_admission.core.costs import ModelCosts
from vllm_admission.core.traces import load_trace
from vllm_admission.fidelity import (
    FidelityError,
    compare_hits,
    meets_bar,
    simulate_like_engine,
)

#: A short synthetic workload (chats and few-shot prompts over shared prefixes).
SMALL = ["num_requests=24", "agent_fraction=0", "chat_fraction=0.6", "fewshot_fraction=0.4",
         "system_prompt_len=[600,0.5,200,1500]", "template_len=[900,0.5,300,2000]",
         "user_message_len=[100,1.0,8,600]", "max_prompt_len=4000"]


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


def _engine_geometry(num_blocks, kinds=("mamba", "full_attention"), page=65536):
    return {"block_size": 128, "num_gpu_blocks": num_blocks, "max_num_batched_tokens": 4096,
            "kv_cache_groups": [{"kind": k, "num_layers": 2, "page_size_bytes": page}
                                for k in kinds]}


@pytest.fixture(scope="module")
def tiny_costs(tmp_path_factory):
    pytest.importorskip("transformers")
    from vllm_admission.plugin.testing import write_config_only_model

    model = write_config_only_model(tmp_path_factory.mktemp("tiny_cfg"))
    return ModelCosts.from_config(model / "config.json")


def test_simulator_takes_the_engines_layout(tiny_costs):
    trace = load_trace("synthetic", num_requests=12, agent_fraction=0.0, chat_fraction=0.5,
                       fewshot_fraction=0.5)
    res = simulate_like_engine(trace, tiny_costs, _engine_geometry(48), admission="vllm",
                               eviction="lru", alpha=None)
    assert (res.num_blocks, res.block_size) == (48, 128)
    assert len(res.per_request_hits) == 12


@pytest.mark.parametrize("geometry,what", [
    (_engine_geometry(48, kinds=("full_attention", "mamba")), "groups"),
    (_engine_geometry(48, page=32768), "bytes per block"),
])
def test_a_layout_the_simulator_does_not_derive_is_an_error(tiny_costs, geometry, what):
    trace = load_trace("synthetic", num_requests=4)
    with pytest.raises(FidelityError, match=what):
        simulate_like_engine(trace, tiny_costs, geometry, admission="vllm", eviction="lru",
                             alpha=None)


@pytest.mark.parametrize("extra,message", [
    (["--admission", "vllm,bogus"], "unknown admission policy 'bogus'"),
    (["--eviction", "belady"], "unknown eviction policy 'belady'; valid: lru, flop"),
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
def test_engine_and_simulator_agree_on_every_request_under_eviction(tiny_model, tmp_path,
                                                                    capsys, engine_env):
    """The gate: vllm+lru (stock) and dense+lru, a 40-block pool, every request equal."""
    out = tmp_path / "fid"
    rc, stdout, err = run(["fidelity", "--model", str(tiny_model), "--admission", "vllm,dense",
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
    assert rc == 0, err
    assert "fidelity bar missed" not in err
    assert recs[0]["engine"]["prefill_seconds_vs_stock"] == 1.0


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
    assert meets_bar(rec)  # timed records are reported, never judged
