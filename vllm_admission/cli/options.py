"""Command-line values shared by the subcommands."""

from __future__ import annotations

from collections.abc import Sequence

from vllm_admission.core.errors import UserError

__all__ = ["RETENTION_HELP", "add_engine_args", "add_model_trace_policy_args", "add_policy_tuning_args",
           "add_request_limit_args", "engine_args_from", "parse_list", "parse_retention_interval"]

#: ``--help`` text of vLLM's ``--prefix-cache-retention-interval``, as the
#: subcommands take it.
RETENTION_HELP = ("vLLM's prefix_cache_retention_interval, which the 'vllm' admission policy "
                  "(stock) follows: 0 (default, vLLM's: the prompt's last block boundary and "
                  "shared-prefix junctions), N (also every state written at a multiple of N "
                  "tokens, a multiple of the block size) or 'none' (every state written)")


def parse_list(text: str, what: str, valid: Sequence[str]) -> tuple[str, ...]:
    """Split a comma list and check every name; one clear error line otherwise."""
    from vllm_admission.core.admission import UnknownPolicyError

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise UnknownPolicyError(f"no {what} given; valid: {', '.join(valid)}")
    for n in names:
        if n not in valid:
            raise UnknownPolicyError(f"unknown {what} {n!r}; valid: {', '.join(valid)}")
    return names


def parse_retention_interval(text: str) -> int | None:
    """``--prefix-cache-retention-interval``: an integer >= 0, or ``none`` for
    vLLM's ``None`` (retention interval ``none``).

    Raises:
        UserError: anything else (one line; the block-size multiple is
            checked where the block size is known).
    """
    word = text.strip()
    if word.lower() == "none":
        return None
    try:
        value = int(word)
    except ValueError:
        value = -1
    if value < 0:
        raise UserError(f"--prefix-cache-retention-interval must be an integer >= 0 or "
                        f"'none', got {text!r}")
    return value


def add_model_trace_policy_args(p, policies: str) -> None:
    """``--model``, ``--trace``, ``--admission`` and ``--eviction``, as ``replay`` and ``fidelity``
    take them; ``policies``: what the policy flags take ("one of", "comma list of")."""
    from vllm_admission.core.adaptive import AUTO
    from vllm_admission.core.admission import ADMISSION_POLICIES
    from vllm_admission.core.eviction import engine_eviction_policies

    p.add_argument("--model", required=True,
                   help="model directory (e.g. from 'vllm-admission make-tiny-model DIR')")
    p.add_argument("--trace", default="synthetic",
                   help="a Mooncake or token JSONL file, or 'synthetic' (default)")
    p.add_argument("--admission", default="vllm",
                   help=f"{policies}: {', '.join(ADMISSION_POLICIES)}, {AUTO} (default vllm)")
    p.add_argument("--eviction", default="lru",
                   help=f"{policies}: {', '.join(engine_eviction_policies())}, {AUTO} (default lru)")


def add_policy_tuning_args(p, *, auto_interval: bool) -> None:
    """``--alpha`` and, with ``auto_interval``, ``--auto-interval``: the policies' own
    settings, as ``simulate``, ``replay`` and ``fidelity`` take them."""
    from vllm_admission.core.settings import add_flags

    add_flags(p, ["alpha", *(["auto.interval"] if auto_interval else [])])


def add_request_limit_args(p, *, max_prompt_tokens: bool, mooncake_note: str = "") -> None:
    """``--max-requests``, ``--max-prompt-tokens`` (when ``max_prompt_tokens``),
    ``--max-output-len`` and ``--mooncake-block-tokens`` (its help ending with
    ``mooncake_note``), as ``replay`` and ``fidelity`` take them."""
    from vllm_admission.core.traces import MOONCAKE_BLOCK_TOKENS

    p.add_argument("--max-requests", type=int, default=None,
                   help="replay only the first K requests of the trace")
    if max_prompt_tokens:
        p.add_argument("--max-prompt-tokens", type=int, default=None,
                       help="drop requests with longer prompts (counted as skipped)")
    p.add_argument("--max-output-len", type=int, default=None,
                   help="cap each request's output tokens (default: as in the trace)")
    p.add_argument("--mooncake-block-tokens", type=int, default=MOONCAKE_BLOCK_TOKENS,
                   help=f"tokens per Mooncake hash id (default {MOONCAKE_BLOCK_TOKENS}, the "
                        f"trace's own; 128 shrinks prompts 4x{mooncake_note})")


def add_engine_args(p) -> None:
    """vLLM's own engine arguments that ``replay`` and ``fidelity`` take, with vLLM's flag
    names and values: ``--mamba-ssm-cache-dtype`` (an ``EngineSettings`` field) and those
    :func:`engine_args_from` reads back for ``EngineSettings.engine_args``."""
    from vllm_admission.core.costs import MAMBA_SSM_CACHE_DTYPES

    p.add_argument("--mamba-ssm-cache-dtype", choices=MAMBA_SSM_CACHE_DTYPES, default=None,
                   help="the engine's mamba_ssm_cache_dtype (default: vLLM's, which its CPU "
                        "platform turns into float32 on CPUs with AVX-512 BF16, doubling the "
                        "tiny model's block size); pin it for the same run on every CPU")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, metavar="T",
                   help="vLLM's prefill token budget per step (default: vLLM's)")
    p.add_argument("--prefix-cache-retention-interval", default=None, metavar="0|N|none",
                   help=RETENTION_HELP)
    p.add_argument("--prefix-match-unit", type=int, default=None, metavar="T",
                   help="vLLM's prefix_match_unit: tokens per block hash, below the block size "
                        "for sub-block hits")
    p.add_argument("--speculative-config", default=None, metavar="JSON",
                   help='vLLM\'s speculative_config, e.g. \'{"method": "mtp", '
                        '"num_speculative_tokens": 1}\'')
    p.add_argument("--kv-transfer-config", default=None, metavar="JSON",
                   help="vLLM's kv_transfer_config (a KV connector)")
    p.add_argument("--offload", default=None, metavar="BYTES",
                   help="a host tier of BYTES (e.g. 1GiB): vLLM's OffloadingConnector with "
                        "cpu_bytes_to_use=BYTES, its worker run by this project's "
                        "HostCopyOffloadingSpec (copies on the host, so it runs on CPU); the "
                        "short form of that --kv-transfer-config")
    p.add_argument("--host-policy", default=None, metavar="NAME",
                   help="with --offload: the host tier's eviction policy, vLLM's lru (default) "
                        "or one of the project's (lfu, reuse, s3fifo, mix), which vLLM loads "
                        "through cache_policy_module_path")
    from vllm_admission.core.settings import add_flags

    add_flags(p, ["host_admission"])


def _json_object(flag: str, text: str) -> dict:
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{flag}: not JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(value, dict):
        raise UserError(f"{flag}: expected a JSON object, got {text!r}")
    return value


def engine_args_from(args) -> dict:
    """vLLM's own engine arguments given on the command line (``replay``,
    ``fidelity``), by vLLM's names; only those given.

    Raises:
        UserError: a malformed value (one line).
    """
    out: dict = {}
    budget = getattr(args, "max_num_batched_tokens", None)
    if budget is not None:
        if budget < 1:
            raise UserError(f"--max-num-batched-tokens must be >= 1, got {budget}")
        out["max_num_batched_tokens"] = budget
    retention = getattr(args, "prefix_cache_retention_interval", None)
    if retention is not None:
        out["prefix_cache_retention_interval"] = parse_retention_interval(retention)
    prefix_match_unit = getattr(args, "prefix_match_unit", None)
    if prefix_match_unit is not None:
        if prefix_match_unit < 1:
            raise UserError(f"--prefix-match-unit must be >= 1, got {prefix_match_unit}")
        out["prefix_match_unit"] = prefix_match_unit
    for flag, name in (("--speculative-config", "speculative_config"),
                       ("--kv-transfer-config", "kv_transfer_config")):
        text = getattr(args, name, None)
        if text is not None:
            out[name] = _json_object(flag, text)
    host = offload_bytes(args)
    if host is not None:
        if "kv_transfer_config" in out:
            raise UserError("--offload is a kv_transfer_config of its own; give it or "
                            "--kv-transfer-config, not both")
        from vllm_admission.plugin.offload_config import offloading_connector_config

        out["kv_transfer_config"] = offloading_connector_config(
            host, eviction_policy=getattr(args, "host_policy", None))
    elif getattr(args, "host_policy", None) is not None:
        raise UserError("--host-policy sets the host tier of --offload; give --offload too")
    return out


def host_settings(args, admission: str | None) -> str | None:
    """``--host-policy`` (``None`` where not given), checked, and ``admission`` (the parsed
    ``--host-admission``) against the host tier the options give.

    Raises:
        UserError: an unknown or unusable host policy, an unknown admission policy, or
            ``--host-admission`` without a host tier (``--offload`` or a
            ``--kv-transfer-config`` with a connector).
    """
    from vllm_admission.core.cache.host import check_host_admission, check_host_tier

    policy = getattr(args, "host_policy", None)
    if policy is not None:
        check_host_tier(policy)
    has_host = (getattr(args, "offload", None) is not None
                or getattr(args, "kv_transfer_config", None) is not None)
    check_host_admission(admission, has_host)
    return policy


def offload_bytes(args) -> int | None:
    """``--offload`` in bytes (``None`` when not given).

    Raises:
        UserError: a malformed or zero size (one line).
    """
    text = getattr(args, "offload", None)
    if text is None:
        return None
    from vllm_admission.core.geometry import parse_bytes

    value = parse_bytes(text)
    if value < 1:
        raise UserError(f"--offload needs a positive size, got {text!r}")
    return value
