"""What a fidelity run runs: :class:`FidelitySpec`, its checks, and :class:`FidelityError`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_admission.core.adaptive import AUTO, DEFAULT_INTERVAL
from vllm_admission.core.admission import UnknownPolicyError, get_admission
from vllm_admission.core.cache import check_checkpoint_mode
from vllm_admission.core.cache.host import check_host_admission, host_policy_names
from vllm_admission.core.costs import MAMBA_SSM_CACHE_DTYPES
from vllm_admission.core.errors import UserError
from vllm_admission.core.eviction import engine_eviction_policies
from vllm_admission.core.layout import DEFAULT_CHECKPOINT, check_retention_interval
from vllm_admission.core.settings import AutoSettings, Settings
from vllm_admission.core.traces import MOONCAKE_BLOCK_TOKENS
from vllm_admission.plugin.offload_config import host_policy_name

__all__ = ["ENGINE_CHECKPOINT_MODES", "FidelityError", "FidelitySpec", "MODES"]


MODES = ("sequential", "timed")

#: The checkpoint modes (:data:`vllm_admission.core.cache.CHECKPOINT_MODES`) the
#: engine runs: vLLM's own ``split`` and the plugin's ``inpass``
#: (``VLLM_ADMISSION_CHECKPOINT``; Gated DeltaNet models on CPU).
ENGINE_CHECKPOINT_MODES = ("split", "inpass")


#: vLLM engine arguments (``FidelitySpec.engine_args``) whose effect the
#: simulator models; it reads their values from the live engine
#: (:func:`~vllm_admission.engine.llm.engine_geometry`).
SIMULATED_ENGINE_ARGS = ("max_num_batched_tokens", "prefix_cache_retention_interval",
                         "prefix_match_unit", "speculative_config", "kv_transfer_config",
                         "async_scheduling")
#: vLLM engine arguments that change how the forward pass runs and nothing the cache
#: decides (eager mode, which kernels and attention backend, which logprobs are returned):
#: accepted as they are. A GPU engine without vLLM's compiled ops needs them
#: (``benchmarks/gpu/engine_check.py``).
EXECUTION_ENGINE_ARGS = ("enforce_eager", "compilation_config", "attention_config",
                         "additional_config", "moe_backend", "ir_op_priority", "logprobs_mode")
#: The KV connector the simulator mirrors (``kv_transfer_config["kv_connector"]``): vLLM's
#: ``OffloadingConnector``, whose host tier it reads from the live engine.
SIMULATED_CONNECTORS = ("OffloadingConnector",)

#: The speculative methods the simulator mirrors (``speculative_config["method"]``): MTP,
#: whose drafter layers the cost model reads from the model's config, and vLLM's
#: hidden-state cache, a KV cache group of kind ``"hidden"``.
SIMULATED_SPECULATIVE_METHODS = ("mtp", "extract_hidden_states")


class FidelityError(UserError):
    """The simulator cannot be configured like the engine (e.g. a group layout it does not model)."""


@dataclass
class FidelitySpec:
    """What :func:`run_fidelity` runs.

    Attributes:
        model: model directory (its ``config.json`` gives the FLOP costs).
        trace: a trace file or ``"synthetic"``.
        admissions, evictions: policy names; every pair runs.
        pairs: run exactly these ``(admission, eviction)`` pairs instead of
            the cross product (``None``: the cross product).
        num_gpu_blocks: pool sizes in blocks (``None``: sized from memory,
            8,192 blocks with the default 1 GiB on CPU); every pair runs at each.
        max_requests: keep the first K requests of the trace.
        max_prompt_tokens: drop longer prompts (counted as skipped).
        max_output_len: cap every request's output tokens (``None``: as in
            the trace); recorded in the output.
        mooncake_block_tokens: tokens per Mooncake hash id (512: the trace's own).
        synthetic: keyword parameters of the synthetic workload.
        mode: ``"sequential"`` or ``"timed"``.
        time_scale: ``"timed"`` mode: multiplies trace arrival times.
        alpha: fix ``flop``'s alpha in both (``None``: tuned online in both).
        auto_interval: ``auto``'s requests between decisions, in both.
        seed: synthetic workload and engine seed.
        checkpoint: the checkpoint mode both sides run (one of
            :data:`ENGINE_CHECKPOINT_MODES`).
        mamba_ssm_cache_dtype: vLLM's ``mamba_ssm_cache_dtype`` for the engine
            (``"auto"``, ``"float32"``, ``"bfloat16"``, ``"float16"``; ``None``:
            vLLM's default, which the CPU platform resolves per instruction set).
            The simulator always takes the geometry the live engine reports, so
            pinning it matters only for getting the same run on every CPU.
        engine_args: more of vLLM's engine arguments for the engine, by vLLM's
            names (:data:`SIMULATED_ENGINE_ARGS`: those the simulator mirrors,
            reading their values from the live engine; :data:`EXECUTION_ENGINE_ARGS`:
            those that decide nothing of the cache).
        offload: a host tier of this many bytes: vLLM's ``OffloadingConnector`` on
            the engine (run on CPU by
            :class:`~vllm_admission.plugin.repairs.cpu_offload.HostCopyOffloadingSpec`),
            the simulator's host tier with the chunks the engine reports (``None``: none).
        host_policy: the host tier's eviction policy (the connector's ``eviction_policy``).
        host_admission: per-tier admission (``VLLM_ADMISSION_HOST_ADMISSION``): an
            admission policy whose states go to the host tier only; needs a host tier.
    """

    model: str
    trace: str = "synthetic"
    admissions: tuple[str, ...] = ("vllm",)
    evictions: tuple[str, ...] = ("lru",)
    pairs: tuple[tuple[str, str], ...] | None = None
    num_gpu_blocks: tuple[int | None, ...] = (None,)
    max_requests: int | None = None
    max_prompt_tokens: int | None = None
    max_output_len: int | None = None
    mooncake_block_tokens: int = MOONCAKE_BLOCK_TOKENS
    synthetic: dict[str, Any] = field(default_factory=dict)
    mode: str = "sequential"
    time_scale: float = 1.0
    alpha: float | None = None
    auto_interval: int = DEFAULT_INTERVAL
    seed: int = 0
    checkpoint: str = DEFAULT_CHECKPOINT
    mamba_ssm_cache_dtype: str | None = None
    engine_args: dict[str, Any] = field(default_factory=dict)
    offload: int | None = None
    host_policy: str = "lru"
    host_admission: str | None = None

    def policy_settings(self, admission: str, eviction: str) -> Settings:
        """The plugin's settings for the pair ``admission`` + ``eviction`` of this run."""
        return Settings(admission=admission, eviction=eviction, alpha=self.alpha,
                        checkpoint=self.checkpoint, host_admission=self.host_admission,
                        auto=AutoSettings(interval=self.auto_interval))

    def policy_pairs(self) -> list[tuple[str, str]]:
        """The ``(admission, eviction)`` pairs to run, in order."""
        if self.pairs is not None:
            return [(a, e) for a, e in self.pairs]
        return [(a, e) for a in self.admissions for e in self.evictions]

    def check(self) -> None:
        """Validate names and numbers before any engine starts.

        Raises:
            UnknownPolicyError: an unknown policy, or an eviction the engine cannot run.
            FidelityError: a checkpoint mode the engine does not have.
            UserError: a bad number, mode, checkpoint mode or model directory.
        """
        check_checkpoint_mode(self.checkpoint)
        if self.checkpoint not in ENGINE_CHECKPOINT_MODES:
            raise FidelityError(
                f"checkpoint mode {self.checkpoint!r} is not built in the engine in this version "
                f"(only the simulator models it: vllm-admission simulate --checkpoint "
                f"{self.checkpoint}); the engine runs: {', '.join(ENGINE_CHECKPOINT_MODES)}")
        if not self.policy_pairs():
            raise UnknownPolicyError("give at least one admission and one eviction policy")
        for a, _ in self.policy_pairs():
            if a != AUTO:
                get_admission(a)
        for _, e in self.policy_pairs():
            if e not in engine_eviction_policies() and e != AUTO:
                raise UnknownPolicyError(f"eviction policy {e!r} cannot run in an engine; "
                                         f"valid: {', '.join([*engine_eviction_policies(), AUTO])}")
        if self.mamba_ssm_cache_dtype not in (None, *MAMBA_SSM_CACHE_DTYPES):
            raise UserError(f"unknown mamba_ssm_cache_dtype {self.mamba_ssm_cache_dtype!r}; "
                            f"valid: {', '.join(MAMBA_SSM_CACHE_DTYPES)}")
        if self.mode not in MODES:
            raise UserError(f"unknown mode {self.mode!r}; valid: {', '.join(MODES)}")
        if not self.time_scale >= 0:
            raise UserError(f"time scale must be >= 0, got {self.time_scale}")
        if self.alpha is not None and not self.alpha >= 0:
            raise UserError(f"alpha must be >= 0, got {self.alpha}")
        if self.auto_interval < 1:
            raise UserError(f"the auto interval must be >= 1 request, got {self.auto_interval}")
        for n in self.num_gpu_blocks:
            if n is not None and n < 2:
                raise UserError(f"a pool needs at least 2 blocks (one is vLLM's null block), got {n}")
        if self.max_output_len is not None and self.max_output_len < 1:
            raise UserError(f"max output length must be >= 1, got {self.max_output_len}")
        unknown = sorted(set(self.engine_args) - set(SIMULATED_ENGINE_ARGS)
                         - set(EXECUTION_ENGINE_ARGS))
        if unknown:
            raise FidelityError(f"the simulator does not mirror the engine argument(s) "
                                f"{', '.join(unknown)}; it mirrors: "
                                f"{', '.join(SIMULATED_ENGINE_ARGS)} (and accepts "
                                f"{', '.join(EXECUTION_ENGINE_ARGS)}, which decide nothing "
                                f"of the cache)")
        check_retention_interval(self.engine_args.get("prefix_cache_retention_interval"))
        transfer = self.engine_args.get("kv_transfer_config")
        if transfer is not None:
            if (not isinstance(transfer, dict)
                    or transfer.get("kv_connector") not in SIMULATED_CONNECTORS):
                raise FidelityError(f"the simulator mirrors kv_transfer_config with connector "
                                    f"{', '.join(SIMULATED_CONNECTORS)} only, got {transfer!r}")
            if self.offload is not None:
                raise FidelityError("offload is a kv_transfer_config of its own; give it or "
                                    "kv_transfer_config, not both")
        spec = self.engine_args.get("speculative_config")
        if spec is not None and (not isinstance(spec, dict)
                                 or spec.get("method") not in SIMULATED_SPECULATIVE_METHODS):
            raise FidelityError(f"the simulator mirrors speculative_config with method "
                                f"{', '.join(SIMULATED_SPECULATIVE_METHODS)} only, got {spec!r}")
        if self.offload is not None or transfer is not None:
            if self.offload is not None and (isinstance(self.offload, bool)
                                             or not isinstance(self.offload, int)
                                             or self.offload < 1):
                raise UserError(f"the host tier needs a positive number of bytes, got "
                                f"{self.offload!r}")
            if self.engine_args.get("prefix_match_unit") or spec is not None:
                raise FidelityError("the simulator models a host tier without speculative "
                                    "decoding and with whole-block hashes only")
            extra = (transfer or {}).get("kv_connector_extra_config") or {}
            policy = host_policy_name(extra) if transfer else self.host_policy
            if policy not in host_policy_names():
                raise UnknownPolicyError(f"the simulator models the host policies "
                                         f"{', '.join(host_policy_names())}, got {policy!r}")
        check_host_admission(self.host_admission,
                             self.offload is not None or transfer is not None)
        if not (Path(self.model) / "config.json").is_file():
            raise UserError(f"model {self.model}: no config.json there "
                            f"(make one with 'vllm-admission make-tiny-model DIR')")
