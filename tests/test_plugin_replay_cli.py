"""``vllm-admission replay``: error lines (no engine) and one real replay (engine)."""

from __future__ import annotations

import json
import random

import pytest

from vllm_admission.cli import main
from vllm_admission.core.eviction import ENGINE_EVICTION_POLICIES


def run(argv, capsys):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("extra,message", [
    (["--admission", "bogus"],
     "vllm-admission: error: unknown admission policy 'bogus'; valid: none, last, vllm, block, "
     "marconi, dense"),
    (["--eviction", "belady"],
     "vllm-admission: error: eviction policy 'belady' cannot run in an engine; "
     f"valid: {', '.join(ENGINE_EVICTION_POLICIES)}"),
    (["--trace", "/nonexistent/trace.jsonl"], "vllm-admission: error: trace file not found"),
    (["--num-gpu-blocks", "0"], "vllm-admission: error: --num-gpu-blocks must be >= 1, got 0"),
    (["--speculative-config", "{mtp"], "vllm-admission: error: --speculative-config: not JSON"),
    (["--kv-transfer-config", "[1]"],
     "vllm-admission: error: --kv-transfer-config: expected a JSON object, got '[1]'"),
    (["--prefix-cache-retention-interval", "sometimes"],
     "vllm-admission: error: --prefix-cache-retention-interval must be an integer >= 0 or "
     "'none', got 'sometimes'"),
    (["--prefix-match-unit", "0"], "vllm-admission: error: --prefix-match-unit must be >= 1"),
])
def test_bad_input_is_one_error_line(tmp_path, capsys, extra, message):
    model = tmp_path / "model"
    model.mkdir()
    rc, out, err = run(["replay", "--model", str(model), "--out", str(tmp_path / "out"), *extra],
                       capsys)
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith(message)
    assert not (tmp_path / "out" / "results.json").exists()


def test_missing_model_directory(tmp_path, capsys):
    rc, _, err = run(["replay", "--model", str(tmp_path / "nope"), "--out", str(tmp_path)], capsys)
    assert rc == 2 and err.startswith("vllm-admission: error: --model") and "not a directory" in err


def test_malformed_trace_line(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"request_id": "a", "prompt_token_ids": [1, 2], "output_len": 1}\n{oops\n')
    rc, _, err = run(["replay", "--model", str(tmp_path), "--trace", str(trace),
                      "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and err.startswith("vllm-admission: error: ") and ":2:" in err


@pytest.mark.engine
def test_replay_writes_results(tmp_path_factory, capsys, engine_env):
    """Four short requests, the second and fourth resending the first: with ``vllm`` the
    resends hit floor((300 - 1) / B) * B tokens, B the block size the engine reports
    (the platform's default here: 128 or 256 depending on the CPU, see
    ``tests/test_tiny_model_engine.py``; 256 tokens either way)."""
    from vllm_admission.engine.tiny_model import make_tiny_model

    model = make_tiny_model(tmp_path_factory.mktemp("tiny_qwen3_next_replay"))
    rng = random.Random(0)
    a = [rng.randrange(3, 512) for _ in range(300)]
    b = [rng.randrange(3, 512) for _ in range(200)]
    trace = tmp_path_factory.mktemp("trace") / "t.jsonl"
    trace.write_text("".join(json.dumps({"request_id": rid, "prompt_token_ids": p,
                                         "output_len": 3}) + "\n"
                             for rid, p in [("a", a), ("a2", a), ("b", b), ("a3", a)]))
    out = tmp_path_factory.mktemp("out")
    rc, stdout, _ = run(["replay", "--model", str(model), "--trace", str(trace),
                         "--admission", "vllm", "--eviction", "flop", "--alpha", "0.5",
                         "--num-gpu-blocks", "64", "--out", str(out)], capsys)
    assert rc == 0
    assert "mode: sequential: one request at a time, in trace order" in stdout
    doc = json.loads((out / "results.json").read_text())
    B = doc["geometry"]["block_size"]  # noqa: N806
    hit = 299 // B * B
    assert [r["cached_tokens"] for r in doc["requests"]] == [0, hit, 0, hit]
    # Prefill steps (docs/engine-facts.md rule 6): a chunk ends at the checkpoint
    # floor((P - 1) / B) * B when it lies inside the prompt; a resend resumes there.
    b_steps = 2 if 199 // B * B > 0 else 1
    assert [r["prefill_steps"] for r in doc["requests"]] == [2, 1, b_steps, 1]
    assert doc["prefill_steps"] == 4 + b_steps
    assert [r["prompt_tokens"] for r in doc["requests"]] == [300, 300, 200, 300]
    assert doc["prompt_tokens"] == 1100 and doc["hit_tokens"] == 2 * hit > 0
    assert doc["token_hit_rate"] == pytest.approx(2 * hit / 1100)
    assert doc["skipped"] == {}
    assert doc["engine_prefix_cache_hits"] == 2 * hit
    assert doc["admission_stats"]["eviction"] == "flop"
    assert doc["admission_stats"]["alpha"] == 0.5
    assert doc["admission_stats"]["hit_tokens"] == 2 * hit
    assert doc["geometry"]["num_gpu_blocks"] == 64
    assert doc["wall_seconds"] > 0


def test_engine_args_pass_through_with_vllms_names():
    """``replay`` and ``fidelity`` take vLLM's own flags and hand vLLM its own names and
    values (JSON objects parsed, ``none`` as None)."""
    from vllm_admission.cli import build_parser
    from vllm_admission.cli.options import engine_args_from

    args = build_parser().parse_args([
        "replay", "--model", "m", "--out", "o", "--max-num-batched-tokens", "512",
        "--prefix-cache-retention-interval", "none", "--prefix-match-unit", "32",
        "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}',
        "--kv-transfer-config", '{"kv_connector": "ExampleConnector", "kv_role": "kv_both"}'])
    assert engine_args_from(args) == {
        "max_num_batched_tokens": 512, "prefix_cache_retention_interval": None,
        "prefix_match_unit": 32,
        "speculative_config": {"method": "mtp", "num_speculative_tokens": 1},
        "kv_transfer_config": {"kv_connector": "ExampleConnector", "kv_role": "kv_both"}}
    assert engine_args_from(build_parser().parse_args(["replay", "--model", "m", "--out", "o"])) == {}


def test_fidelity_refuses_what_the_simulator_does_not_mirror(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    rc, _, err = run(["fidelity", "--model", str(model), "--out", str(tmp_path / "out"),
                      "--kv-transfer-config", '{"kv_connector": "ExampleConnector"}'],
                     capsys)
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith("vllm-admission: error: the simulator mirrors kv_transfer_config "
                          "with connector OffloadingConnector only, got {'kv_connector': "
                          "'ExampleConnector'}")
    rc, _, err = run(["fidelity", "--model", str(model), "--out", str(tmp_path / "out"),
                      "--offload", "1GiB", "--prefix-match-unit", "32"], capsys)
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith("vllm-admission: error: the simulator models a host tier without "
                          "speculative decoding and with whole-block hashes only")
    rc, _, err = run(["fidelity", "--model", str(model), "--out", str(tmp_path / "out"),
                      "--offload", "lots"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "cannot parse byte size 'lots'" in err
    rc, _, err = run(["fidelity", "--model", str(model), "--out", str(tmp_path / "out"),
                      "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}'],
                     capsys)
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith("vllm-admission: error: the simulator mirrors speculative_config "
                          "with method mtp, extract_hidden_states only")


@pytest.mark.parametrize("argv, message", [
    (["--host-policy", "s3fifo"], "--host-policy sets the host tier of --offload; give --offload too"),
    (["--offload", "1MiB", "--host-policy", "flop"],
     "eviction policy 'flop' cannot run in the host tier: it needs FLOP values"),
    (["--host-admission", "dense"], "host admission 'dense' needs a host tier"),
    (["--offload", "1MiB", "--host-admission", "bogus"], "--host-admission='bogus' is invalid; valid: none, "),
])
@pytest.mark.parametrize("command", ["replay", "fidelity"])
def test_host_tier_options_are_checked_in_one_line(tmp_path, capsys, command, argv, message):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    rc, _, err = run([command, "--model", str(model), "--out", str(tmp_path / "out"), *argv],
                     capsys)
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith(f"vllm-admission: error: {message}")


def test_host_policy_rides_in_the_offload_config():
    from vllm_admission.cli import build_parser
    from vllm_admission.cli.options import engine_args_from
    from vllm_admission.plugin.offload_config import HOST_POLICY_MODULE

    args = build_parser().parse_args(["replay", "--model", "m", "--out", "o",
                                      "--offload", "2MiB", "--host-policy", "reuse"])
    extra = engine_args_from(args)["kv_transfer_config"]["kv_connector_extra_config"]
    assert extra["cpu_bytes_to_use"] == 2 << 20 and extra["eviction_policy"] == "reuse"
    assert extra["cache_policy_module_path"] == HOST_POLICY_MODULE
    args = build_parser().parse_args(["replay", "--model", "m", "--out", "o",
                                      "--offload", "2MiB", "--host-policy", "lru"])
    extra = engine_args_from(args)["kv_transfer_config"]["kv_connector_extra_config"]
    assert extra["eviction_policy"] == "lru" and "cache_policy_module_path" not in extra


def test_without_vllm_the_engine_commands_say_so_in_one_line(tmp_path, capsys, monkeypatch):
    """``replay`` where vLLM cannot be imported: one line naming what is missing and how to
    install it, exit status 2, no traceback (``sys.modules[name] = None`` makes the import
    fail as an absent package does)."""
    import sys

    model = tmp_path / "model"
    model.mkdir()
    monkeypatch.setitem(sys.modules, "vllm", None)
    rc, _, err = run(["replay", "--model", str(model), "--out", str(tmp_path / "out"),
                      "--max-requests", "2"], capsys)
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith("vllm-admission: error: 'replay' needs vllm, which is not installed")
