"""A real OpenAI-compatible server with the plugin: ``vllm serve`` as the README writes it.

The server is vLLM's own ``vllm`` command from this environment, started on each tiny model
(weights and tokenizer from ``make_tiny_model``: Qwen3-Next, then Nemotron-H) with the
AdmissionScheduler, and spoken to over HTTP with the ``openai`` client and ``httpx``. The
SSM state is pinned to bf16 (``--mamba-ssm-cache-dtype``), so the block size B is the core's
derivation on any CPU. The Mamba2 model's engine core runs in its own process, where only
the general plugin can turn off the prefill-checkpoint export vLLM's CPU kernels cannot
write (``plugin/repairs/cpu_mamba2.py``): its server run checks that path.

Three text completions share a long prefix and differ after it (vLLM's stock admission,
``vllm``): with S = the shared tokens rounded down to a block,

* A runs on an empty cache: 0 cached tokens; its prompt-end state is kept;
* B finds S tokens of attention KV but no state there: 0 cached tokens, one junction, and
  its prefill stops at S so the state at S is kept, plus its own prompt end;
* C hits S (``usage.prompt_tokens_details.cached_tokens``) and keeps its prompt end.

So on ``/metrics``: 3 requests, 1 junction, 4 checkpoints, 1 state hit, S tokens saved,
S state-miss tokens (B's attention-KV hit of S with no state at its end), no evictions, and
vLLM's own ``vllm:prefix_cache_hits`` = S.

At start the engine core logs the smallest cacheable prefix: B tokens in each KV cache group,
so prompts of B + 1 tokens or more can hit (no warning: 4 (B + 1) <= max_model_len 4096).
Stopped with Ctrl-C (SIGINT), the server leaves no metrics folder behind.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from engine_cases import env_without_vllm, predicted_block_size

from vllm_admission.engine.tiny_model import TINY_MODEL_ARCHS

pytestmark = pytest.mark.engine

VLLM = str(Path(sys.executable).with_name("vllm"))
MODEL_NAME = "tiny"
START_TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(model_dir, port: int) -> list[str]:
    return [VLLM, "serve", str(model_dir), "--scheduler-cls", "vllm_admission.AdmissionScheduler",
            "--served-model-name", MODEL_NAME, "--enable-prefix-caching",
            "--enable-prompt-tokens-details", "--dtype", "bfloat16",
            "--mamba-ssm-cache-dtype", "bfloat16", "--gpu-memory-utilization", "0.5",
            "--max-model-len", "4096", "--host", "127.0.0.1", "--port", str(port)]


def server_env(**extra: str) -> dict[str, str]:
    return env_without_vllm(VLLM_CPU_KVCACHE_SPACE="1", VLLM_ADMISSION_LOG_INTERVAL="0", **extra)


@pytest.fixture(scope="module", params=TINY_MODEL_ARCHS)
def server_model_dir(request, tiny_model_of):
    """The tiny model of one arch per module instance."""
    return tiny_model_of(request.param)


@contextmanager
def running_server(model_dir, env: dict[str, str], log_path: Path, *extra: str):
    """``(base_url, process)`` of ``vllm serve`` on ``model_dir`` with the plugin, healthy;
    stopped on exit."""
    import httpx

    port = free_port()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([*serve_command(model_dir, port), *extra], env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}:\n"
                            + log_path.read_text()[-4000:])
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("vllm serve did not become healthy:\n" + log_path.read_text()[-4000:])
            time.sleep(1)
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


@pytest.fixture(scope="module")
def server(server_model_dir, tmp_path_factory):
    """``(base_url, block_size, log path, process)`` of a running ``vllm serve`` with the plugin,
    in eager mode (what these tests check does not depend on torch.compile, which more than
    doubles the start; ``test_inpass_serves_with_one_prefill_step_per_prompt`` serves with
    vLLM's default compilation)."""
    pytest.importorskip("httpx")
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    env = server_env(VLLM_ADMISSION_POLICY="vllm", VLLM_ADMISSION_EVICTION="lru")
    with running_server(server_model_dir, env, log_path, "--enforce-eager") as (base, proc):
        yield base, predicted_block_size(server_model_dir, "bfloat16"), log_path, proc


def scrape(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``(sample name, sorted labels) -> value`` of every sample on ``/metrics``."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{base}/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(samples, name: str, **labels: str) -> float:
    want = {"model_name": MODEL_NAME, **labels}
    hits = [v for (n, ls), v in samples.items()
            if n == name and all(dict(ls).get(k) == x for k, x in want.items())]
    assert len(hits) == 1, f"{name} {labels}: {len(hits)} samples"
    return hits[0]


def words(seed: int, n: int) -> str:
    import random

    rng = random.Random(seed)
    vocab = ["cache", "block", "prefix", "state", "token", "model", "layer", "attention", "hybrid", "server", "prompt"]
    return " ".join(f"{rng.choice(vocab)}{rng.randrange(100)}" for _ in range(n))


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_shared_prefix_is_cached_and_counted(server, server_model_dir):
    from openai import OpenAI
    from transformers import AutoTokenizer

    base, B, log_path, _ = server  # noqa: N806
    tok = AutoTokenizer.from_pretrained(str(server_model_dir))
    prefix = words(1, 300)
    prompts = [f"{prefix}\n{tag}: {words(seed, 150)}" for tag, seed in
               (("alpha", 2), ("beta", 3), ("gamma", 4))]
    ids = [tok(p)["input_ids"] for p in prompts]
    shared = {common_prefix(ids[i], ids[j]) // B * B for i, j in ((0, 1), (0, 2), (1, 2))}
    assert len(shared) == 1
    (S,) = shared  # noqa: N806
    assert S >= 2 * B and all(len(x) - 1 >= S + B for x in ids)

    before = scrape(base)
    assert value(before, "vllm:hybrid_prefix_cache_policy_info", engine="0",
                 admission="vllm", eviction="lru", active="true") == 1.0

    client = OpenAI(base_url=f"{base}/v1", api_key="unused")
    usages = []
    for p in prompts:
        r = client.completions.create(model=MODEL_NAME, prompt=p, max_tokens=4, temperature=0.0)
        assert r.choices[0].text is not None
        usages.append(r.usage)
    assert [u.prompt_tokens for u in usages] == [len(x) for x in ids]
    assert [u.prompt_tokens_details.cached_tokens for u in usages] == [0, 0, S]

    # The engine core publishes when its last running request ends; allow the file a moment.
    deadline = time.monotonic() + 30
    while True:
        after = scrape(base)
        if value(after, "vllm:hybrid_prefix_cache_requests_total", engine="0") >= 3:
            break
        assert time.monotonic() < deadline, "the plugin's counters did not reach /metrics"
        time.sleep(0.5)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    expected = {"requests": 3, "prompt_tokens": sum(len(x) for x in ids), "junctions": 1,
                "checkpoints": 4, "state_hits": 1, "tokens_saved": S, "superseded": 0,
                "state_miss_tokens": S}
    got = {k: moved(f"vllm:hybrid_prefix_cache_{k}_total", engine="0") for k in expected}
    assert got == expected
    for kind, group in (("state", "0"), ("attention", "1")):
        assert value(after, "vllm:hybrid_prefix_cache_evictions_total", engine="0",
                     kind=kind, group=group) == 0
    assert moved("vllm:prefix_cache_hits_total", engine="0") == S
    usable = value(after, "vllm:hybrid_prefix_cache_usable_blocks", engine="0")
    assert value(after, "vllm:hybrid_prefix_cache_free_blocks", engine="0") == usable > 0
    log = log_path.read_text()
    active = re.search(r"AdmissionScheduler active: admission=vllm eviction=lru; "
                       r"block_size=(\d+), groups=([a-z,]+),", log)
    assert active and int(active[1]) == B
    groups = " ".join(f"{kind}{g}={B}" for g, kind in enumerate(active[2].split(",")))
    assert groups == f"state0={B} attention1={B}"  # either tiny model's two groups
    assert (f"vllm_admission: smallest cacheable prefix: {B} tokens (per KV cache group: "
            f"{groups}; a hit ends where every group can reuse a block), so only prompts of "
            f"{B + 1} tokens or more can hit (vLLM recomputes at least the last prompt token)"
            in log)
    assert "never hit the prefix cache" not in log


def test_ctrl_c_leaves_no_metrics_folder_behind(server):
    """vLLM force-kills the engine core at Ctrl-C (``--shutdown-timeout 0``), before the
    scheduler can delete its snapshot; the API server, whose general plugin named the
    folder, removes it on its way out. (Runs after the test above: it stops the server.)"""
    from vllm_admission.plugin.metrics.prometheus import default_metrics_dir

    _, _, log_path, proc = server
    folder = default_metrics_dir(proc.pid)
    assert os.listdir(folder) == ["engine-0.json"]  # the engine core published there
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    assert not os.path.exists(folder), log_path.read_text()[-3000:]


def test_invalid_policy_stops_the_server_with_one_line(tiny_model_dir):
    proc = subprocess.run(serve_command(tiny_model_dir, free_port()),
                          env=server_env(VLLM_ADMISSION_POLICY="marconni"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1] == ("vllm_admission: error: VLLM_ADMISSION_POLICY='marconni' is invalid; "
                         "valid: none, last, vllm, block, marconi, dense, written, auto")


def test_a_setting_the_engine_cannot_run_stops_the_server_before_the_model_loads(tiny_model_dir):
    """n-gram speculative decoding with ``marconi``: one line naming the setting and the
    feature, exit status 2, and no engine core started (its start-up line never appears)."""
    ngram = '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}'
    proc = subprocess.run([*serve_command(tiny_model_dir, free_port()),
                           "--speculative-config", ngram],
                          env=server_env(VLLM_ADMISSION_POLICY="marconi"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "Initializing a V1 LLM engine" not in proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1] == ("vllm_admission: error: VLLM_ADMISSION_POLICY=marconi cannot run with "
                         "speculative decoding other than EAGLE/MTP and extract_hidden_states "
                         "(valid here: vllm)")


@pytest.mark.parametrize("arch", TINY_MODEL_ARCHS)
def test_inpass_serves_with_one_prefill_step_per_prompt(arch, tiny_model_of, tmp_path):
    """``VLLM_ADMISSION_CHECKPOINT=inpass`` under ``vllm serve``, whose model runner lives in
    a worker process of its own: the general plugin installs the runner hooks there and the
    step's checkpoints travel on the ``SchedulerOutput`` vLLM sends it. The junction case
    (four prompts sharing a 1,500-token prefix, as token ids, ``vllm`` admission) gets the
    same cached tokens and greedy text as split mode, in one prefill step per prompt where
    split mode ends chunks at the prompt checkpoint and the junction
    (``vllm:hybrid_prefix_cache_prefill_steps_total``)."""
    import random

    import httpx

    model_dir = tiny_model_of(arch)
    rng = random.Random(5)
    prefix = [rng.randrange(3, 500) for _ in range(1500)]
    prompts = [prefix + [3 + i] + [rng.randrange(3, 500) for _ in range(300)] for i in range(4)]
    runs = {}
    for mode in ("split", "inpass"):
        # vLLM's compile cache without its AOT artifacts: on the CPU backend an AOT artifact
        # fails to load ("'function' object has no attribute 'finalize_loading'") and every
        # start compiles again; the plain cache loads, so the second server starts in about
        # 7 s instead of 18. The in-pass server then runs the graph compiled for the split
        # one: the checkpoint copies live outside the compiled graph.
        env = server_env(VLLM_ADMISSION_POLICY="vllm", VLLM_ADMISSION_CHECKPOINT=mode,
                         VLLM_USE_AOT_COMPILE="0")
        with running_server(model_dir, env, tmp_path / f"{mode}.log") as (base, _):
            got = []
            for ids in prompts:
                r = httpx.post(f"{base}/v1/completions", timeout=300, json={
                    "model": MODEL_NAME, "prompt": ids, "max_tokens": 4, "temperature": 0.0}).json()
                got.append((r["usage"]["prompt_tokens_details"]["cached_tokens"],
                            r["choices"][0]["text"]))
            deadline = time.monotonic() + 30
            while True:  # the engine core publishes when its last running request ends
                samples = scrape(base)
                if value(samples, "vllm:hybrid_prefix_cache_requests_total",
                         engine="0") >= len(prompts):
                    break
                assert time.monotonic() < deadline, "the plugin's counters did not reach /metrics"
                time.sleep(0.5)
            steps = value(samples, "vllm:hybrid_prefix_cache_prefill_steps_total", engine="0")
            runs[mode] = (got, steps)
    (split, split_steps), (inpass, inpass_steps) = runs["split"], runs["inpass"]
    B = predicted_block_size(model_dir, "bfloat16")  # noqa: N806
    S = 1500 // B * B                                    # noqa: N806  (the shared prefix, whole blocks)
    assert [c for c, _ in split] == [0, 0, S, S]          # prompt 2 is the junction
    assert inpass == split
    assert inpass_steps == len(prompts) < split_steps
