"""The simulator end to end: results, bounds, determinism, and the CLI's handling of bad input."""

import json

import pytest
from shared_data import MOONCAKE, require

from vllm_admission.cli import build_parser, main
from vllm_admission.core.adaptive import AUTO_ADMISSIONS, AUTO_EVICTIONS, PolicyController
from vllm_admission.core.admission import ADMISSION_POLICIES
from vllm_admission.core.costs import load_model
from vllm_admission.core.eviction import EVICTION_POLICIES
from vllm_admission.core.geometry import aligned_block_size, block_geometry, parse_bytes
from vllm_admission.core.traces import load_trace
from vllm_admission.sim.simulator import SimulationSettings, cache_requests, simulate, trace_bound

REQUIRED = {"trace", "model", "admission", "eviction", "capacity_bytes", "block_size", "num_blocks",
            "requests", "prompt_tokens", "hit_tokens", "token_hit_rate", "request_hit_rate",
            "flops_saved_fraction", "state_checkpoints", "evictions", "wall_seconds",
            "mamba_ssm_cache_dtype", "ssm_dtype", "state_miss_tokens"}


@pytest.fixture(scope="module")
def costs():
    return load_model("qwen3-next-80b-a3b")


@pytest.fixture(scope="module")
def small_trace():
    return load_trace("synthetic", max_requests=300)


def test_cli_writes_results_and_plot(tmp_path, capsys):
    rc = main(["simulate", "--trace", "synthetic", "--max-requests", "150", "--capacity", "2GiB,8GiB",
               "--admission", "vllm,marconi", "--eviction", "lru,flop", "--out", str(tmp_path),
               "--no-progress"])
    assert rc == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert len(doc["runs"]) == 2 * 2 * 2
    for run in doc["runs"]:
        assert set(run) >= REQUIRED
        assert run["requests"] == 150
        assert 0 <= run["token_hit_rate"] <= 1
        assert run["hit_tokens"] <= doc["bound"][0]["hit_tokens"]
        # The default "auto" resolves as on a GPU: Qwen3-Next keeps a bf16 GDN state.
        assert (run["mamba_ssm_cache_dtype"], run["ssm_dtype"]) == ("auto", "bfloat16")
    assert doc["bound"][0]["block_size"] == 544
    assert (tmp_path / "hit_rate.png").stat().st_size > 10_000
    table = capsys.readouterr().out
    assert "infinite-capacity bound" in table and "marconi" in table


def test_fixed_seed_gives_identical_results(costs):
    def run():
        trace = load_trace("synthetic", max_requests=250, seed=7)
        r = simulate(trace, costs, SimulationSettings.of("marconi", "flop",
                                                      capacity_bytes=parse_bytes("2GiB")))
        rec = r.to_record()
        rec.pop("wall_seconds"), rec.pop("cpu_seconds")
        return rec

    assert run() == run()


@pytest.mark.parametrize("admission", sorted(ADMISSION_POLICIES))
def test_no_run_beats_the_infinite_capacity_bound(costs, small_trace, admission):
    geo = block_geometry(costs, parse_bytes("2GiB"))
    reqs = cache_requests(small_trace, geo.block_size)
    bound = trace_bound(reqs, geo.block_size)["hit_tokens"]
    for eviction, alpha in (("lru", None), ("flop", 0.5), ("belady", None)):
        r = simulate(small_trace, costs, SimulationSettings.of(admission, eviction,
                                                            capacity_bytes=parse_bytes("2GiB"), alpha=alpha),
                     requests=reqs)
        assert r.evictions > 0  # the capacity really is under pressure
        assert r.hit_tokens <= bound


def test_dense_with_ample_capacity_reaches_the_bound(costs, small_trace):
    geo = block_geometry(costs, parse_bytes("1TiB"))
    reqs = cache_requests(small_trace, geo.block_size)
    r = simulate(small_trace, costs, SimulationSettings.of("dense", "lru",
                                                        capacity_bytes=parse_bytes("1TiB")), requests=reqs)
    assert r.evictions == 0
    assert r.hit_tokens == trace_bound(reqs, geo.block_size)["hit_tokens"]
    assert r.state_miss_tokens == 0  # a state at every block: no KV hit is thrown away


def test_state_miss_tokens_are_the_kv_hits_no_state_serves(costs, small_trace):
    """Without any saved state (``none``) and nothing evicted, every request finds the bound's
    attention-KV hit and recomputes all of it: the state misses are the whole bound. With
    ``vllm`` they are what its hit falls short of that, block for block."""
    geo = block_geometry(costs, parse_bytes("1TiB"))
    reqs = cache_requests(small_trace, geo.block_size)
    bound = trace_bound(reqs, geo.block_size)["hit_tokens"]
    none = simulate(small_trace, costs, SimulationSettings.of("none", "lru",
                                                           capacity_bytes=parse_bytes("1TiB")), requests=reqs)
    assert (none.evictions, none.hit_tokens, none.state_miss_tokens) == (0, 0, bound)
    stock = simulate(small_trace, costs, SimulationSettings.of("vllm", "lru",
                                                            capacity_bytes=parse_bytes("1TiB")), requests=reqs)
    assert stock.evictions == 0
    assert stock.hit_tokens + stock.state_miss_tokens == bound
    assert stock.state_miss_tokens > 0 and stock.state_miss_tokens % geo.block_size == 0


def test_belady_gets_true_next_uses_and_evicts_the_farthest(costs, small_trace, monkeypatch):
    """What the simulator owes Bélády: each victim is the candidate whose next use
    (as the simulator supplied and refreshed it) is farthest ahead, and never one
    in the past. Bélády is no proven optimum for a hybrid cache (a state block is
    only useful where a hit ends on it; ``BeladyEviction``'s docstring), so no
    ordering against ``lru`` is asserted; without pressure both evict nothing and
    agree exactly."""
    from vllm_admission.core.eviction import BeladyEviction

    victims = []
    pop = BeladyEviction.pop

    def checked_pop(self, now):
        self._refresh_stale(now)  # noqa: SLF001 - what pop does first; idempotent
        next_use = {block: nu for block, (nu, _) in self._entries.items()}  # noqa: SLF001
        block = pop(self, now)
        assert next_use[block] > now and next_use[block] == max(next_use.values())
        victims.append(block)
        return block

    monkeypatch.setattr(BeladyEviction, "pop", checked_pop)
    run = simulate(small_trace, costs, SimulationSettings.of("vllm", "belady",
                                                          capacity_bytes=parse_bytes("2GiB")))
    assert run.evictions > 0 and len(victims) > 0
    roomy = {ev: simulate(small_trace, costs, SimulationSettings.of("vllm", ev,
                                                                 capacity_bytes=parse_bytes("1TiB")))
             for ev in ("lru", "belady")}
    assert roomy["lru"].evictions == roomy["belady"].evictions == 0
    assert roomy["lru"].hit_tokens == roomy["belady"].hit_tokens


def test_mooncake_prefix_stays_under_its_bound(costs):
    trace = load_trace(str(require(MOONCAKE)), max_requests=800)
    assert trace.skipped == {"beyond max_requests": 12031 - 800}
    r = simulate(trace, costs, SimulationSettings.of("vllm", "lru",
                                                  capacity_bytes=parse_bytes("64GiB")))
    geo = block_geometry(costs, parse_bytes("64GiB"))
    bound = trace_bound(cache_requests(trace, geo.block_size), geo.block_size)
    assert 0 < r.hit_tokens <= bound["hit_tokens"]
    assert r.requests == 800 and r.skipped_requests == 0


def test_async_scheduling_option_reaches_the_cache_model(tmp_path, costs, small_trace):
    """``--async-scheduling`` is recorded and runs the core model with vLLM's step-late
    retirement (``HybridPrefixCache``'s ``async_scheduling``): each run equals the API's
    with the setting, and in a small pool under pressure it serves ``dense`` + ``s3fifo``
    differently from the synchronous engine's model."""
    rc = main(["simulate", "--trace", "synthetic", "--max-requests", "300", "--capacity", "1GiB",
               "--admission", "dense", "--eviction", "s3fifo", "--async-scheduling",
               "--out", str(tmp_path), "--no-progress"])
    assert rc == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["async_scheduling"] is True
    (run,) = doc["runs"]
    got = {flag: simulate(small_trace, costs, SimulationSettings.of("dense", "s3fifo",
                                                                 capacity_bytes=parse_bytes("1GiB"),
                                                                 async_scheduling=flag))
           for flag in (True, False)}
    assert (run["hit_tokens"], run["evictions"]) == (got[True].hit_tokens, got[True].evictions)
    assert got[True].hit_tokens != got[False].hit_tokens


def test_ssm_cache_dtype_option_changes_the_geometry(tmp_path, capsys):
    docs, tables = {}, {}
    for dtype in ("bfloat16", "float32"):
        rc = main(["simulate", "--trace", "synthetic", "--max-requests", "40", "--capacity", "2GiB",
                   "--admission", "vllm", "--eviction", "lru", "--mamba-ssm-cache-dtype", dtype,
                   "--out", str(tmp_path / dtype), "--no-progress"])
        assert rc == 0
        docs[dtype] = json.loads((tmp_path / dtype / "results.json").read_text())
        tables[dtype] = capsys.readouterr().out
    for dtype, doc in docs.items():
        assert (doc["mamba_ssm_cache_dtype"], doc["ssm_dtype"]) == (dtype, dtype)
        assert f"SSM state {dtype} (--mamba-ssm-cache-dtype {dtype})" in tables[dtype]
        (run,) = doc["runs"]
        assert (run["mamba_ssm_cache_dtype"], run["ssm_dtype"]) == (dtype, dtype)
        costs = load_model("qwen3-next-80b-a3b", mamba_ssm_cache_dtype=dtype)
        geo = block_geometry(costs, parse_bytes("2GiB"))
        assert (run["block_size"], run["num_blocks"]) == (aligned_block_size(costs), geo.num_blocks)
        assert doc["bound"][0]["block_size"] == run["block_size"]
    bf16, fp32 = docs["bfloat16"]["runs"][0], docs["float32"]["runs"][0]
    # A float32 SSM state doubles the bulk of the state page: larger blocks, fewer of them.
    assert fp32["block_size"] > bf16["block_size"]
    assert fp32["num_blocks"] < bf16["num_blocks"]


def test_bad_ssm_cache_dtype_is_argparses_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--out", str(tmp_path), "--mamba-ssm-cache-dtype", "bogus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "invalid choice: 'bogus'" in errors[0]
    assert "Traceback" not in err and not (tmp_path / "results.json").exists()


def test_demo_takes_the_ssm_cache_dtype_too():
    parser = build_parser()
    assert parser.parse_args(["demo"]).mamba_ssm_cache_dtype == "auto"
    assert parser.parse_args(["demo", "--mamba-ssm-cache-dtype", "float32"]).mamba_ssm_cache_dtype == "float32"
    assert parser.parse_args(["simulate", "--out", "x"]).mamba_ssm_cache_dtype == "auto"


@pytest.mark.parametrize("argv, message", [
    (["--admission", "nope"], "unknown admission policy 'nope'; valid: none, last, vllm, block, marconi, dense"),
    (["--eviction", "arc"], f"unknown eviction policy 'arc'; valid: {', '.join(EVICTION_POLICIES)}"),
    (["--capacity", "1KiB"], "too small"),
    (["--capacity", "12 parsecs"], "unknown unit 'parsecs'"),
    (["--model", "/nonexistent/config.json"], "nonexistent"),
    (["--pairs", "auto"], "--pairs wants ADMISSION+EVICTION, got 'auto'"),
    (["--pairs", "auto+arc"], "unknown eviction policy 'arc'"),
    (["--retention-interval", "often"], "must be an integer >= 0 or 'none', got 'often'"),
    (["--retention-interval", "-512"], "must be an integer >= 0 or 'none'"),
    (["--retention-interval", "1000"], "(1000) must be None or a non-negative multiple of the "
                                       "block size"),
    (["--hidden-states", "-1"], "--hidden-states must be >= 0, got -1"),
    (["--hidden-states", "1", "--num-speculative-tokens", "1"],
     "--hidden-states is vLLM's extract_hidden_states speculative method"),
    # Qwen3-Next's 2048-wide hidden states get 272-token blocks beside 544-token ones.
    (["--hidden-states", "1"], "KV cache groups of different block sizes are not modelled"),
])
def test_bad_input_is_one_clear_line(tmp_path, capsys, argv, message):
    rc = main(["simulate", "--trace", "synthetic", "--max-requests", "20", "--out", str(tmp_path),
               "--no-progress", *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.startswith("vllm-admission: error:") and message in err
    assert "\n" not in err and "Traceback" not in err


def test_malformed_trace_line_names_file_line_and_field(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}\n'
                   '{"timestamp": 1, "input_length": -5, "output_length": 3, "hash_ids": [1]}\n')
    rc = main(["simulate", "--trace", str(bad), "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"{bad}:2: field 'input_length'" in err


def test_empty_trace_is_an_error(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    rc = main(["simulate", "--trace", str(empty), "--out", str(tmp_path / "o"), "--no-progress"])
    assert rc == 2
    assert "empty" in capsys.readouterr().err.lower()


def test_non_hybrid_model_is_a_clear_no_op(tmp_path, capsys):
    cfg = tmp_path / "llama.json"
    cfg.write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
        "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "vocab_size": 1000, "torch_dtype": "bfloat16"}))
    rc = main(["simulate", "--trace", "synthetic", "--model", str(cfg), "--out", str(tmp_path / "o"),
               "--no-progress"])
    assert rc == 0
    assert "no recurrent layers" in capsys.readouterr().out
    assert not (tmp_path / "o").exists()


def test_cli_auto_records_its_decisions(tmp_path):
    """``--admission auto --eviction auto``: a decision every ``--auto-interval`` requests,
    every switch recorded with the request index after which it took effect."""
    rc = main(["simulate", "--trace", "synthetic", "--max-requests", "120", "--capacity", "2GiB",
               "--admission", "auto", "--eviction", "auto", "--auto-interval", "15",
               "--out", str(tmp_path), "--no-progress"])
    assert rc == 0
    (run,) = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert (run["admission"], run["eviction"]) == ("auto", "auto")
    assert run["policy_decisions"] == 120 // 15
    assert run["policy_switches"]                      # this workload rewards leaving stock
    pair = str(PolicyController.default_start(AUTO_ADMISSIONS, AUTO_EVICTIONS, "split"))  # stock
    for s in run["policy_switches"]:
        assert (s["at"] + 1) % 15 == 0 and s["from"] == pair and s["to"] != pair
        assert s["scores"][s["to"]] > s["scores"][s["from"]]
        pair = s["to"]
    assert run["final_policy"] == pair


def test_demo_runs_auto_beside_stock(tmp_path, capsys):
    """``--pairs`` adds pairs to the grid (the demo's default adds ``auto+auto``), and the
    table closes with a line putting each ``auto`` run beside stock ``vllm+lru``."""
    parser = build_parser()
    assert parser.parse_args(["demo"]).pairs == "auto+auto"
    assert parser.parse_args(["simulate", "--out", "x"]).pairs == ""
    rc = main(["simulate", "--trace", "synthetic", "--max-requests", "120", "--capacity", "2GiB",
               "--admission", "vllm", "--eviction", "lru", "--pairs", "auto+auto,vllm+lru",
               "--out", str(tmp_path), "--no-progress"])
    assert rc == 0
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert [(r["admission"], r["eviction"]) for r in runs] == [("vllm", "lru"), ("auto", "auto")]
    stock, auto = runs
    out = capsys.readouterr().out
    assert (f"auto+auto against stock vllm+lru: 2GiB {auto['token_hit_rate']:.2%} vs "
            f"{stock['token_hit_rate']:.2%} "
            f"({auto['token_hit_rate'] / stock['token_hit_rate']:.2f}x), "
            f"ends as {auto['final_policy']}") in out.splitlines()
    miss = f"{stock['state_miss_tokens'] / stock['prompt_tokens']:.2%}"
    assert any(line.startswith("vllm ") and f" {miss} " in line for line in out.splitlines())


def test_cli_refuses_an_auto_interval_below_one(tmp_path, capsys):
    rc = main(["simulate", "--trace", "synthetic", "--capacity", "2GiB", "--admission", "auto",
               "--auto-interval", "0", "--out", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err
    assert rc != 0 and "--auto-interval='0' is invalid; valid: an integer >= 1" in err
    assert "Traceback" not in err


def test_sweeps_in_one_process_do_not_share_requests_across_output_modes():
    # The sweep caches the trace's cache requests per process; they depend on --outputs.
    from dataclasses import replace

    from vllm_admission.sim.sweep import SweepSpec, run_sweep

    spec = SweepSpec(trace="synthetic", model="qwen3-next-80b-a3b", capacities=(parse_bytes("2GiB"),),
                     admissions=("vllm",), evictions=("lru",), chunk_size=8192, max_requests=200)
    hits = {}
    for outputs in ("trace", "unique", "trace"):
        run = run_sweep(replace(spec, outputs=outputs), progress=False)["runs"][0]
        hits.setdefault(outputs, set()).add(run["hit_tokens"])
    assert len(hits["trace"]) == 1
    assert hits["trace"] != hits["unique"]  # the two modes hash output blocks differently


def test_retention_interval_reaches_the_stock_policy_and_the_records(tmp_path):
    """``--retention-interval``: vLLM's prefix_cache_retention_interval, which only the
    stock ``vllm`` admission follows: the other policies' runs are the same bit for bit,
    and retention interval none keeps more states than vLLM's default on the same requests."""
    docs = {}
    for value in ("0", "none"):
        out = tmp_path / value
        assert main(["simulate", "--trace", "synthetic", "--max-requests", "150", "--capacity",
                     "2GiB", "--admission", "vllm,last", "--eviction", "lru",
                     "--retention-interval", value, "--out", str(out), "--no-progress"]) == 0
        docs[value] = json.loads((out / "results.json").read_text())
    assert docs["0"]["retention_interval"] == 0 and docs["none"]["retention_interval"] is None
    runs = {v: {r["admission"]: r for r in d["runs"]} for v, d in docs.items()}
    assert runs["none"]["vllm"]["retention_interval"] is None
    assert runs["none"]["vllm"]["state_checkpoints"] > runs["0"]["vllm"]["state_checkpoints"]
    for key in ("hit_tokens", "state_checkpoints", "evictions"):
        assert runs["none"]["last"][key] == runs["0"]["last"][key]


@pytest.mark.parametrize("argv, message", [
    (["--chunk-size", "0"], "--chunk-size must be >= 1 token, got 0"),
    (["--admission", "auto,vllm", "--eviction", "auto,belady"],
     "eviction 'belady' needs future knowledge; it cannot be combined with admission 'auto'"),
])
def test_a_bad_setting_fails_before_any_run(tmp_path, capsys, monkeypatch, argv, message):
    """Caught before the sweep starts: no run is simulated (issue 34: a setting that used
    to become 8192 silently, a grid cell that used to fail after the others had run)."""
    import vllm_admission.sim.sweep as sweep

    ran = []
    monkeypatch.setattr(sweep, "_run_one", lambda *a: ran.append(a))
    rc = main(["simulate", "--trace", "synthetic", "--max-requests", "20", "--capacity", "2GiB",
               "--out", str(tmp_path), "--no-progress", *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == f"vllm-admission: error: {message}"
    assert not ran and not (tmp_path / "results.json").exists()


def test_an_unwritable_out_fails_before_the_sweep(tmp_path, capsys, monkeypatch):
    import vllm_admission.sim.sweep as sweep

    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setattr(sweep, "run_sweep", lambda *a, **k: pytest.fail("the sweep ran"))
    rc = main(["simulate", "--trace", "synthetic", "--max-requests", "20", "--capacity", "2GiB",
               "--out", str(blocked / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith(f"vllm-admission: error: --out {blocked / 'out'}: cannot "
                                      f"write there")


def test_an_alpha_nothing_uses_is_said(tmp_path, capsys):
    rc = main(["simulate", "--trace", "synthetic", "--max-requests", "30", "--capacity", "2GiB",
               "--admission", "vllm", "--eviction", "lru", "--alpha", "0.5",
               "--out", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 0
    assert ("vllm-admission: --alpha 0.5 has no effect: no eviction policy run here has an "
            "alpha (lru; flop has one)") in err


def test_the_hidden_state_cache_takes_its_own_group_and_blocks(small_trace):
    """``hidden_state_bytes_per_token`` (``--hidden-states N`` on the command line): a KV
    cache group of kind ``hidden`` beside the model's own, which holds a block per
    ``block_size`` tokens out of the same pool, so the hit rate falls where the pool is
    short, and its evictions are counted under its kind. The tiny Qwen3-Next's hidden
    states fit its page at its own block size (vLLM's rule, ``hidden_state_block_size``),
    as on the CPU engine (``tests/test_fidelity.py``)."""
    from vllm_admission.core.costs import ModelCosts
    from vllm_admission.engine.tiny_model import TINY_MODEL_PARAMS

    tiny = ModelCosts.from_config({"architectures": ["Qwen3NextForCausalLM"],
                                   "model_type": "qwen3_next", "torch_dtype": "bfloat16",
                                   **TINY_MODEL_PARAMS})
    capacity = 64 * 2**20
    geo = block_geometry(tiny, capacity)
    per_token = tiny.hidden_size * tiny.dtype_bytes
    runs = {n: simulate(small_trace, tiny, SimulationSettings.of("marconi", "lru", capacity_bytes=capacity,
                hidden_state_bytes_per_token=n * per_token))
            for n in (0, 1)}
    assert runs[1].num_blocks == runs[0].num_blocks == geo.num_blocks
    kinds = [k.rstrip("0123456789") for k in runs[1].evictions_by_group]
    assert kinds == [k.rstrip("0123456789") for k in runs[0].evictions_by_group] + ["hidden"]
    assert runs[1].evictions_by_group[f"hidden{len(kinds) - 1}"] > 0
    assert runs[1].token_hit_rate < runs[0].token_hit_rate
