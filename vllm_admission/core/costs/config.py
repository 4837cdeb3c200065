"""Reading Hugging Face configs: fields with one-line errors, and vLLM 0.32's dtype rules."""

from __future__ import annotations

import builtins
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar, overload

from vllm_admission.core.costs.dtypes import (
    CANONICAL_DTYPE,
    DTYPE_BYTES,
    NEMOTRON_H,
    QWEN3_5,
    Dtypes,
)
from vllm_admission.core.costs.layers import ModelConfigError

__all__ = ["ConfigFields", "display_name", "read_json", "resolve_dtypes"]

# --------------------------------------------------------------------------- #
# Reading configs
# --------------------------------------------------------------------------- #


def read_json(path: Path) -> Any:
    """The JSON in ``path``.

    Raises:
        ModelConfigError: a missing or unreadable file, or not JSON (one line).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelConfigError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"{path}: cannot read ({exc.__class__.__name__}: {exc})") from None
    try:
        # json accepts the non-standard tokens Infinity / NaN that some
        # Nemotron-H configs contain (time_step_limit).
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelConfigError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None


def display_name(raw: Mapping[str, Any], path: Path | None, architecture: str) -> str:
    """The model's name for reports: the config's ``_name_or_path``, else the file's,
    else the architecture."""
    name_or_path = raw.get("_name_or_path")
    if isinstance(name_or_path, str) and name_or_path.strip("/"):
        return name_or_path.rstrip("/").rsplit("/", 1)[-1]
    if path is not None:
        stem = path.stem
        if stem == "config" and path.parent.name:
            return path.parent.name
        # "Org__Model.json" (the naming of the shared model_configs folder) -> "Model"
        return stem.split("__", 1)[-1]
    return architecture


_MISSING = object()
_D = TypeVar("_D")
_T = TypeVar("_T")


class ConfigFields:
    """Typed access to one JSON object, with one-line errors naming file and field.

    Args:
        data: the object.
        label: the file (or ``<dict>``) named in errors.
        prefix: the object's path in the file (``"text_config."``), named in errors.
    """

    def __init__(self, data: Mapping[str, Any], label: str, prefix: str = "") -> None:
        self.data = data
        self.label = label
        self.prefix = prefix

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def _error(self, key: str, problem: str) -> ModelConfigError:
        return ModelConfigError(f"{self.label}: field '{self.prefix}{key}' {problem}")

    def _value(self, key: builtins.str, default: object) -> Any:
        """The field's value, None when it is absent or null and ``default`` is given.

        Raises:
            ModelConfigError: the field is absent or null and there is no default.
        """
        value = self.data.get(key)
        if value is None and default is _MISSING:
            raise self._error(key, "is missing")
        return value

    def sub(self, key: str) -> ConfigFields:
        value = self.data.get(key)
        if not isinstance(value, Mapping):
            raise self._error(key, "must be a JSON object")
        return ConfigFields(value, self.label, f"{self.prefix}{key}.")

    # ``int``, ``list``, ``str`` and ``bool`` name methods here: annotations in the class
    # spell the built-in types ``builtins.*`` (the method bodies see the built-ins). A
    # call without a default returns the field's type; with one, the field's type or the
    # default's.
    @overload
    def int(self, key: builtins.str, *, minimum: builtins.int = 1) -> builtins.int: ...
    @overload
    def int(self, key: builtins.str, default: _D, *, minimum: builtins.int = 1) -> builtins.int | _D: ...
    def int(self, key: builtins.str, default: object = _MISSING, *,
            minimum: builtins.int = 1) -> object:
        value = self._value(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
            raise self._error(key, f"must be an integer, got {value!r}")
        if int(value) < minimum:
            raise self._error(key, f"must be >= {minimum}, got {value!r}")
        return int(value)

    @overload
    def first_int(self, keys: tuple[builtins.str, ...], *, minimum: builtins.int = 1) -> builtins.int: ...
    @overload
    def first_int(self, keys: tuple[builtins.str, ...], default: _D, *,
                  minimum: builtins.int = 1) -> builtins.int | _D: ...
    def first_int(self, keys: tuple[builtins.str, ...], default: object = _MISSING, *,
                  minimum: builtins.int = 1) -> object:
        """The first of ``keys`` that is present and not null."""
        for key in keys:
            if self.data.get(key) is not None:
                return self.int(key, minimum=minimum)
        if default is _MISSING:
            raise self._error(keys[0], "is missing" + (f" (also tried {', '.join(keys[1:])})" if keys[1:] else ""))
        return default

    @overload
    def list(self, key: builtins.str) -> builtins.list[Any]: ...
    @overload
    def list(self, key: builtins.str, default: _D) -> builtins.list[Any] | _D: ...
    def list(self, key: builtins.str, default: object = _MISSING) -> object:
        return self._of_type(key, default, list, "a list", lambda value: type(value).__name__)

    @overload
    def str(self, key: builtins.str) -> builtins.str: ...
    @overload
    def str(self, key: builtins.str, default: _D) -> builtins.str | _D: ...
    def str(self, key: builtins.str, default: object = _MISSING) -> object:
        return self._of_type(key, default, str, "a string")

    def bool(self, key: builtins.str, default: builtins.bool) -> builtins.bool:
        return self._of_type(key, default, bool, "true or false")

    def _of_type(self, key: builtins.str, default: _D, kind: type[_T], expected: builtins.str,
                 shown: Callable[[Any], builtins.str] = repr) -> _T | _D:
        """The field, ``default`` when it is absent or null; else it must be a ``kind``.

        Raises:
            ModelConfigError: absent or null with no default ("is missing"), or not a
                ``kind`` ("must be {expected}, got {shown(value)}").
        """
        value = self._value(key, default)
        if value is None:
            return default
        if not isinstance(value, kind):
            raise self._error(key, f"must be {expected}, got {shown(value)}")
        return value


# --------------------------------------------------------------------------- #
# dtypes (vLLM 0.32 rules)
# --------------------------------------------------------------------------- #


def resolve_dtypes(
    top: ConfigFields,
    text: ConfigFields,
    dtype: str | None,
    kv_cache_dtype: str,
    mamba_cache_dtype: str,
    mamba_ssm_cache_dtype: str,
    architecture: str,
) -> Dtypes:
    """Resolve the four dtypes as vLLM 0.32 does (file references in the body).

    Args:
        top, text: the config and its text config (``top`` when there is none).
        dtype, kv_cache_dtype, mamba_cache_dtype, mamba_ssm_cache_dtype: vLLM's flags
            of those names (``"auto"``, and ``dtype`` also ``None``: vLLM's default).
        architecture: the config's architecture (its per-model dtype hooks).

    Raises:
        ModelConfigError: an unknown dtype name, or a model dtype that is not a float.
    """
    # Model dtype: vllm/config/model.py _get_and_verify_dtype / _resolve_auto_dtype:
    # "auto" takes the config's dtype, and float32 checkpoints are served in
    # the platform's preferred half type (bfloat16 on current GPUs).
    if dtype is None or dtype == "auto":
        config_dtype = None
        for fields in (text, top):
            for key in ("torch_dtype", "dtype"):
                if isinstance(fields.get(key), str):
                    config_dtype = fields.get(key)
                    break
            if config_dtype is not None:
                break
        model = _dtype_name(config_dtype or "float32", top.label, "torch_dtype")
        if model == "float32":
            model = "bfloat16"
    else:
        model = _dtype_name(dtype, top.label, "dtype (argument)")
    if model not in ("bfloat16", "float16", "float32"):
        raise ModelConfigError(f"{top.label}: model dtype '{model}' is not a float dtype")

    # KV cache: vllm/config/cache.py cache_dtype; "auto" = model dtype.
    kv = model if kv_cache_dtype == "auto" else _dtype_name(kv_cache_dtype, top.label, "kv_cache_dtype (argument)")
    # Conv state: MambaStateDtypeCalculator._mamba_state_dtype ->
    # get_kv_cache_torch_dtype(mamba_cache_dtype, model_dtype).
    conv = (
        model
        if mamba_cache_dtype == "auto"
        else _dtype_name(mamba_cache_dtype, top.label, "mamba_cache_dtype (argument)")
    )
    # SSM state: "auto" = the conv-state dtype, after the per-model hooks of
    # vllm/model_executor/models/config.py have replaced "auto":
    #   NemotronHForCausalLMConfig: hf_config.mamba_ssm_cache_dtype, default float32
    #   Qwen3_5ForConditionalGenerationConfig: hf_text_config.mamba_ssm_dtype
    ssm_choice = mamba_ssm_cache_dtype
    if ssm_choice == "auto":
        if architecture in NEMOTRON_H:
            ssm_choice = text.str("mamba_ssm_cache_dtype", "float32")
        elif architecture in QWEN3_5 and text.get("mamba_ssm_dtype") is not None:
            ssm_choice = text.str("mamba_ssm_dtype")
    ssm = conv if ssm_choice == "auto" else _dtype_name(ssm_choice, top.label, "mamba_ssm_cache_dtype")
    return Dtypes(model=model, kv=kv, conv=conv, ssm=ssm)


def _dtype_name(value: str, label: str, field_name: str) -> str:
    name = str(value).lower().replace("torch.", "")
    if name not in DTYPE_BYTES:
        raise ModelConfigError(
            f"{label}: field '{field_name}' has unsupported dtype {value!r}; "
            f"known: {', '.join(sorted(DTYPE_BYTES))}"
        )
    return CANONICAL_DTYPE.get(name, name)


