"""Block geometry that vLLM 0.32 derives for a hybrid model's KV cache.

vLLM keeps the attention KV cache and the recurrent states in one pool of
equal-sized pages (one ``BlockPool``). This module recomputes, from a
:class:`~vllm_admission.core.costs.ModelCosts`, the numbers vLLM arrives at:

1. **Block size** (``vllm/platforms/interface.py``,
   ``Platform._align_hybrid_block_size``, called from
   ``update_block_size_for_backend``): one attention page (``block_size``
   tokens of one layer) must be at least as large as one recurrent-state page
   (one layer's state). Starting from ``cache_config.block_size`` (16 on CUDA
   unless ``--block-size`` is given), vLLM takes
   ``align = max(kernel_block, block_size)`` and grows the block to
   ``align * ceil(state_page / (align * attn_page_per_token))``, then rounds it
   up to a multiple of the attention backend's kernel block (FlashAttention /
   Triton / FlexAttention and FlashInfer on Hopper: multiples of 16;
   FlashAttention-4's head_dim-256 kernel on Blackwell: 128, with a starting
   block of 128; the CPU backend: multiples of 32 with a platform default
   block of 128).
2. **Padding**: the state page is padded to exactly the attention page
   (``cache_config.mamba_page_size_padded``, read by ``MambaSpec.page_size_bytes``
   in ``vllm/v1/kv_cache_interface.py``).
3. **Groups** (``vllm/v1/core/kv_cache_utils.py``,
   ``_get_kv_cache_groups_uniform_page_size``): layers with identical specs form
   one bucket per type (full attention, each sliding window, the recurrent
   layers); the group size is the smallest bucket, or the largest when the
   largest is below 1.5x the smallest; each bucket is cut into
   ``ceil(len / group_size)`` groups (the last one padded). A model whose
   layers all share one spec has one group holding all layers.
4. **Block count** (``get_kv_cache_config_from_groups``): every group's tensors
   alias the same memory, and one block id costs
   ``group_size * page_bytes`` (one page for each layer of a group), so
   ``num_blocks = capacity // (group_size * page_bytes)``. Block 0 is the
   ``BlockPool``'s null block and never holds data.
5. **Minimum to serve** (``get_kv_cache_configs`` / ``_check_enough_kv_cache_memory``
   with ``MambaSpec.max_memory_usage_bytes``): one request needs, per attention
   group, ``ceil(max_model_len / block_size)`` blocks and, per state group,
   2 blocks in ``mamba_cache_mode="align"`` (prefix caching on) or 1 otherwise,
   on top of the null block.

With ``enable_prefix_caching`` vLLM switches ``mamba_cache_mode`` to ``"align"``
(``vllm/model_executor/models/config.py`` ``MambaModelConfig``) and sets
``mamba_block_size = block_size``: the state is saved at block boundaries.

Nothing here imports vllm or torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING

from vllm_admission.core.errors import UserError
from vllm_admission.core.layout import check_hash_block_size

if TYPE_CHECKING:  # pragma: no cover - typing only
    from vllm_admission.core.costs import ModelCosts

__all__ = [
    "CUDA_BLOCK_SIZE",
    "CUDA_KERNEL_BLOCK_SIZE",
    "CPU_BLOCK_SIZE",
    "CPU_KERNEL_BLOCK_SIZE",
    "CacheGeometry",
    "CapacityError",
    "aligned_block_size",
    "block_geometry",
    "blocks_needed",
    "geometry_from_blocks",
    "hidden_state_block_size",
    "hidden_states_share_the_block",
    "inpass_capture_limit",
    "minimum_capacity_bytes",
    "parse_bytes",
]

#: ``CacheConfig.DEFAULT_BLOCK_SIZE`` (vllm/config/cache.py), kept by CUDA backends.
CUDA_BLOCK_SIZE = 16
#: Smallest kernel block of FlashAttention / Triton / FlexAttention (``MultipleOf(16)``).
CUDA_KERNEL_BLOCK_SIZE = 16
#: Block size the CPU platform sets when none is given (vllm/platforms/cpu.py).
CPU_BLOCK_SIZE = 128
#: CPU attention backend kernel block (vllm/v1/attention/backends/cpu_attn.py, ``MultipleOf(32)``).
CPU_KERNEL_BLOCK_SIZE = 32

_MAMBA_CACHE_MODES = ("align", "none")


class CapacityError(UserError):
    """The KV cache capacity cannot hold the blocks needed to serve one request."""


@dataclass(frozen=True)
class CacheGeometry:
    """The KV cache layout vLLM 0.32 uses for one model and one capacity.

    Attributes:
        block_size: tokens per block (attention); after hybrid alignment.
        num_blocks: blocks in vLLM's one shared ``BlockPool`` (including the
            null block 0, which never holds data).
        page_bytes: bytes of one block of one layer (the uniform page size,
            after padding the state page up to the attention page).
        group_size: layers per KV cache group.
        num_attention_groups: attention KV cache groups (full + sliding).
        num_state_groups: recurrent-state (Mamba / GDN) KV cache groups.
        attention_page_bytes: unpadded attention page (``block_size`` tokens,
            one layer); equals ``page_bytes`` for hybrid models.
        state_page_bytes: unpadded state page (one sequence's state, one
            layer); 0 without recurrent layers.
        num_sliding_groups: how many of the attention groups are sliding-window.
    """

    block_size: int
    num_blocks: int
    page_bytes: int
    group_size: int
    num_attention_groups: int
    num_state_groups: int
    attention_page_bytes: int = 0
    state_page_bytes: int = 0
    num_sliding_groups: int = 0

    @property
    def bytes_per_block(self) -> int:
        """Capacity consumed by one block id: ``page_bytes * group_size``."""
        return self.page_bytes * self.group_size

    @property
    def num_groups(self) -> int:
        return self.num_attention_groups + self.num_state_groups

    @property
    def usable_blocks(self) -> int:
        """Blocks that can hold data: ``num_blocks - 1`` (block 0 is the null block)."""
        return max(self.num_blocks - 1, 0)

    @property
    def capacity_used_bytes(self) -> int:
        """Bytes vLLM actually allocates: ``num_blocks * bytes_per_block``."""
        return self.num_blocks * self.bytes_per_block

    @property
    def state_padding_bytes(self) -> int:
        """Bytes of padding in each state page (``page_bytes - state_page_bytes``)."""
        return self.page_bytes - self.state_page_bytes if self.state_page_bytes else 0

    def kv_blocks(self, num_tokens: int) -> int:
        """Block ids the attention KV of ``num_tokens`` tokens takes (all attention groups)."""
        return -(-num_tokens // self.block_size) * self.num_attention_groups

    def state_blocks(self, num_states: int = 1) -> int:
        """Block ids ``num_states`` saved recurrent states take (one per state group each)."""
        return num_states * self.num_state_groups


def aligned_block_size(
    costs: ModelCosts,
    block_size: int | None = None,
    *,
    kernel_block_size: int = CUDA_KERNEL_BLOCK_SIZE,
) -> int:
    """Attention block size vLLM 0.32 ends with for ``costs`` (hybrid alignment rule).

    ``block_size`` is ``cache_config.block_size`` before alignment (the
    ``--block-size`` flag, else the platform default, 16 on CUDA). Rule of
    ``Platform._align_hybrid_block_size`` (vllm/platforms/interface.py)::

        align = max(kernel_block_size, block_size)
        size  = align * ceil(state_page / (align * attn_page_per_token))
        size  = kernel_block_size * ceil(size / kernel_block_size)
        block = max(block_size, size)

    Without recurrent layers (or without attention layers) ``block_size`` is
    returned unchanged.

    Raises:
        UserError: non-positive sizes, or attention layers whose per-token
            pages differ (not supported here).
    """
    start = CUDA_BLOCK_SIZE if block_size is None else block_size
    _check_positive(start, "block_size")
    _check_positive(kernel_block_size, "kernel_block_size")
    attn_page = _attention_page_per_token(costs)
    state_page = _state_page(costs)
    if not attn_page or not state_page:
        return start
    align = max(kernel_block_size, start)
    size = align * _cdiv(state_page, align * attn_page)
    size = kernel_block_size * _cdiv(size, kernel_block_size)
    return max(start, size)


def block_geometry(
    costs: ModelCosts,
    capacity_bytes: int,
    *,
    block_size: int | None = None,
    kernel_block_size: int = CUDA_KERNEL_BLOCK_SIZE,
    max_model_len: int | None = None,
    mamba_cache_mode: str = "align",
) -> CacheGeometry:
    """Geometry of vLLM's KV cache for ``costs`` given ``capacity_bytes`` of KV cache memory.

    Args:
        costs: the model.
        capacity_bytes: memory vLLM gives to the KV cache (its "available KV
            cache memory"), in bytes.
        block_size: ``--block-size`` before hybrid alignment (None: 16, the
            CUDA default); see :func:`aligned_block_size`.
        kernel_block_size: the attention backend's kernel block granularity
            (16 for CUDA backends; use ``CPU_BLOCK_SIZE`` /
            ``CPU_KERNEL_BLOCK_SIZE`` to model the CPU backend).
        max_model_len: length one request must fit in for the capacity check
            (vLLM checks ``max_model_len``); None checks a single block of tokens.
        mamba_cache_mode: ``"align"`` (prefix caching on, 2 state blocks per
            state group per request) or ``"none"`` (1).

    Returns:
        The :class:`CacheGeometry`; ``num_blocks = capacity_bytes // bytes_per_block``.

    Raises:
        CapacityError: the capacity is below the null block plus the blocks one
            request needs; the message states the minimum in bytes.
        UserError: invalid arguments, or a model without attention or
            recurrent layers.
    """
    if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int):
        raise UserError(f"capacity_bytes must be an integer number of bytes, got {capacity_bytes!r}")
    geometry = _layout(costs, block_size, kernel_block_size, num_blocks=0)
    minimum = minimum_capacity_bytes(geometry, max_model_len=max_model_len, mamba_cache_mode=mamba_cache_mode)
    if capacity_bytes < minimum:
        need_len = max_model_len if max_model_len is not None else geometry.block_size
        raise CapacityError(
            f"KV cache capacity {_human(capacity_bytes)} is too small for {costs.name}: "
            f"serving one {need_len}-token request needs at least {_human(minimum)} "
            f"({minimum // geometry.bytes_per_block} blocks of {geometry.bytes_per_block} bytes: "
            f"1 null block, {_attention_blocks_needed(geometry, need_len)} KV blocks, "
            f"{geometry.num_state_groups * _states_per_request(mamba_cache_mode)} state blocks)"
        )
    return _replace_blocks(geometry, capacity_bytes // geometry.bytes_per_block)


def geometry_from_blocks(
    costs: ModelCosts,
    num_blocks: int,
    block_size: int | None = None,
    *,
    kernel_block_size: int = CUDA_KERNEL_BLOCK_SIZE,
) -> CacheGeometry:
    """Geometry for the numbers a running engine reports (``num_gpu_blocks``, ``block_size``).

    ``block_size`` is the engine's final (already aligned) block size; None
    computes it with :func:`aligned_block_size`.

    Raises:
        UserError: ``num_blocks < 1``, or a ``block_size`` whose attention
            page is smaller than one recurrent-state page (vLLM would have
            grown it; the message gives the size it would use).
    """
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
        raise UserError(f"num_blocks must be a positive integer, got {num_blocks!r}")
    if block_size is not None:
        _check_positive(block_size, "block_size")
        attn_page = _attention_page_per_token(costs)
        state_page = _state_page(costs)
        if attn_page and state_page and block_size * attn_page < state_page:
            raise UserError(
                f"block_size {block_size} gives {block_size * attn_page}-byte attention pages, smaller "
                f"than one {state_page}-byte state page of {costs.name}; vLLM would use "
                f"{aligned_block_size(costs, block_size, kernel_block_size=kernel_block_size)}"
            )
        geometry = _layout(costs, block_size, kernel_block_size, num_blocks=num_blocks, aligned=True)
    else:
        geometry = _layout(costs, None, kernel_block_size, num_blocks=num_blocks)
    return geometry


def hidden_state_block_size(geometry: CacheGeometry, bytes_per_token: int) -> int:
    """Tokens per block vLLM 0.32 gives a hidden-state KV cache group.

    ``extract_hidden_states`` speculative decoding caches ``bytes_per_token`` bytes
    per token (its hidden-state layers x ``hidden_size`` x the KV cache dtype's bytes)
    in one group of its own, added after the others with its page padded to the common
    page: the largest divisor of the groups' block size whose page fits the common page
    (``vllm/v1/core/kv_cache_utils.py``, ``get_kv_cache_groups``; when a single token
    is larger than the common page, ``_ensure_min_page_size`` first scales every group's
    block size up).

    Args:
        geometry: the layout without the hidden-state group.
        bytes_per_token: hidden-state bytes per token (>= 1).

    Returns:
        The hidden-state group's block size in tokens.

    Raises:
        UserError: ``bytes_per_token`` below 1, or above the common page (vLLM then
            changes every group's block size, which is not modelled here).
    """
    _check_positive(bytes_per_token, "hidden-state bytes per token")
    page = geometry.page_bytes
    if bytes_per_token > page:
        raise UserError(f"{bytes_per_token} hidden-state bytes per token exceed the "
                        f"{page}-byte page; vLLM then scales every group's block size, "
                        f"which this geometry model does not")
    fits = page // bytes_per_token
    return max(d for d in range(1, geometry.block_size + 1)
               if geometry.block_size % d == 0 and d <= fits)


def hidden_states_share_the_block(costs: ModelCosts, bytes_per_token: int) -> bool:
    """Whether vLLM gives a hidden-state group of ``bytes_per_token`` the block size of
    the model's groups (:func:`hidden_state_block_size` returns the block size).

    The common page is ``block_size`` tokens of one attention layer, so the whole block
    fits exactly when one token's hidden states are no larger than one token's KV in
    one attention layer, whatever the block size.
    """
    return bytes_per_token <= _attention_page_per_token(costs)


def minimum_capacity_bytes(
    geometry: CacheGeometry,
    *,
    max_model_len: int | None = None,
    mamba_cache_mode: str = "align",
) -> int:
    """Smallest capacity vLLM accepts for ``geometry``'s layout (``num_blocks`` is ignored).

    ``bytes_per_block * (1 null block + KV blocks of one max_model_len request
    + state blocks)``. Sliding-window groups are charged like full attention,
    an upper bound (vLLM bounds them by the window; no bundled config has
    sliding layers). Mirrors vLLM's
    ``_max_memory_usage_bytes_from_groups`` plus the null block that
    ``get_kv_cache_configs`` reserves before the check.
    """
    need_len = geometry.block_size if max_model_len is None else max_model_len
    _check_positive(need_len, "max_model_len")
    blocks = 1 + _attention_blocks_needed(geometry, need_len)
    blocks += geometry.num_state_groups * _states_per_request(mamba_cache_mode)
    return blocks * geometry.bytes_per_block


_BYTES_RE = re.compile(r"^\s*([0-9][0-9_]*(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*$")
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_bytes(text: str) -> int:
    """Parse a byte count: ``"4GiB"``, ``"512MiB"``, ``"1.5GB"``, ``"123456"``, ``"10 kB"``.

    Units (case-insensitive): B; kB/MB/GB/TB (powers of 1000); KiB/MiB/GiB/TiB
    (powers of 1024). A fractional result is rounded down to whole bytes.

    Raises:
        UserError: empty or malformed text, negative numbers, unknown units,
            and the ambiguous bare ``K``/``M``/``G``/``T`` (the message says to
            write ``GiB`` or ``GB``).
    """
    if not isinstance(text, str):
        raise UserError(f"byte size must be a string such as '4GiB', got {text!r}")
    match = _BYTES_RE.match(text)
    if match is None:
        raise UserError(
            f"cannot parse byte size {text!r}: expected a number and an optional unit, "
            f"e.g. '4GiB', '512MiB', '1.5GB' or '123456'"
        )
    number, unit = match.group(1), match.group(2)
    key = unit.lower()
    if key in ("k", "m", "g", "t"):
        raise UserError(
            f"ambiguous unit {unit!r} in {text!r}: write {unit.upper()}iB (powers of 1024) "
            f"or {unit.upper()}B (powers of 1000)"
        )
    if key not in _UNITS:
        raise UserError(f"unknown unit {unit!r} in {text!r}; use B, kB, MB, GB, TB, KiB, MiB, GiB or TiB")
    try:
        value = Decimal(number.replace("_", "")) * _UNITS[key]
    except InvalidOperation:  # pragma: no cover - the regex only lets digits through
        raise UserError(f"cannot parse byte size {text!r}") from None
    return int(value)


# --------------------------------------------------------------------------- #
# internals
# --------------------------------------------------------------------------- #


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_positive(value: int, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{name} must be a positive integer, got {value!r}")


def _attention_page_per_token(costs: ModelCosts) -> int:
    pages = {layer.kv_bytes_per_token for layer in costs.attention_layers}
    if len(pages) > 1:
        raise UserError(
            f"{costs.name}: attention layers with different KV bytes per token "
            f"({sorted(pages)}) are not supported by this geometry model"
        )
    return pages.pop() if pages else 0


def _state_page(costs: ModelCosts) -> int:
    return max((layer.state_bytes for layer in costs.recurrent_layers), default=0)


#: What makes two layers' specs identical: a recurrent layer's kind, conv and SSM state
#: shapes and dtypes (``()`` for attention).
_SpecDetail = tuple[()] | tuple[str, tuple[int, ...], tuple[int, ...], str | None, str | None]


def _buckets(costs: ModelCosts) -> list[tuple[str, int | None, int]]:
    """(type, sliding window, layer count) for each bucket of identical specs, in first-seen order."""
    counts: dict[tuple[str, int | None, _SpecDetail], int] = {}
    key: tuple[str, int | None, _SpecDetail]
    for layer in costs.layers:
        if layer.is_attention:
            key = ("attention", layer.sliding_window, ())
        elif layer.is_recurrent:
            # Identical MambaSpec <=> same kind, shapes and dtypes.
            key = ("state", None, (layer.kind, layer.conv_state_shape, layer.ssm_state_shape,
                                   layer.conv_dtype, layer.ssm_dtype))
        else:
            continue
        counts[key] = counts.get(key, 0) + 1
    return [(kind, window, count) for (kind, window, _), count in counts.items()]


def _layout(
    costs: ModelCosts,
    block_size: int | None,
    kernel_block_size: int,
    *,
    num_blocks: int,
    aligned: bool = False,
) -> CacheGeometry:
    attn_page = _attention_page_per_token(costs)
    state_page = _state_page(costs)
    buckets = _buckets(costs)
    if not buckets:
        raise UserError(f"{costs.name}: no attention or recurrent layer, so there is no KV cache")
    if aligned:
        assert block_size is not None
        size = block_size
    else:
        size = aligned_block_size(costs, block_size, kernel_block_size=kernel_block_size)
    attention_page = size * attn_page
    page = attention_page if attn_page else state_page
    if len(buckets) == 1:
        group_size, groups = buckets[0][2], [1]
    else:
        smallest = min(count for *_, count in buckets)
        largest = max(count for *_, count in buckets)
        group_size = largest if largest < smallest * 1.5 else smallest
        groups = [_cdiv(count, group_size) for *_, count in buckets]
    attention_groups = sum(n for n, (kind, _, _) in zip(groups, buckets, strict=True) if kind == "attention")
    sliding_groups = sum(
        n for n, (kind, window, _) in zip(groups, buckets, strict=True) if kind == "attention" and window is not None
    )
    return CacheGeometry(
        block_size=size,
        num_blocks=num_blocks,
        page_bytes=page,
        group_size=group_size,
        num_attention_groups=attention_groups,
        num_state_groups=sum(groups) - attention_groups,
        attention_page_bytes=attention_page,
        state_page_bytes=state_page,
        num_sliding_groups=sliding_groups,
    )


def _replace_blocks(geometry: CacheGeometry, num_blocks: int) -> CacheGeometry:
    return replace(geometry, num_blocks=num_blocks)


def _states_per_request(mamba_cache_mode: str) -> int:
    if mamba_cache_mode not in _MAMBA_CACHE_MODES:
        raise UserError(f"mamba_cache_mode must be one of {_MAMBA_CACHE_MODES}, got {mamba_cache_mode!r}")
    return 2 if mamba_cache_mode == "align" else 1


def blocks_needed(prompt_len: int, output_len: int, *, block_size: int, num_attention_groups: int,
                  num_state_groups: int, mamba_cache_mode: str = "align",
                  hash_block_size: int | None = None, num_speculative_tokens: int = 0,
                  num_lookahead_tokens: int | None = None,
                  async_scheduling: bool = False) -> int:
    """Most pool blocks one request holds at once in vLLM 0.32 (one pool for every group).

    KV exists for ``prompt_len + output_len - 1`` tokens (the last output
    token's KV is never computed), so each attention group holds
    ``ceil((prompt_len + output_len - 1) / block_size)`` blocks at the end;
    each state group holds 2 blocks in ``align`` mode (the running state and
    the one being written at a block boundary; ``MambaSpec.max_memory_usage_bytes``
    in ``vllm/v1/kv_cache_interface.py``), 1 otherwise. Measured on the engine in
    docs/engine-facts.md section 5. The simulator's cache model and the engine
    replay's skip rule both use this.

    With a ``hash_block_size`` finer than the block (vLLM's ``prefix_match_unit``)
    a hit inside the prompt's last block takes a private copy of that block in
    each group before the shared one is released (``_apply_cow``, reserved by
    ``get_num_blocks_to_allocate``), so an attention group may hold
    ``(prompt_len - 1) // block_size + 2`` blocks for a moment.

    With speculative decoding of ``num_speculative_tokens`` K, the last decode
    step verifies K draft tokens and each attention group holds
    ``num_lookahead_tokens`` L slots beyond them (``None``: K, EAGLE/MTP's;
    ``extract_hidden_states`` has 0): K + L tokens past the KV above; and each
    state group K more blocks in ``align`` mode (``MambaSpec.num_speculative_blocks``,
    ``MambaManager.get_num_blocks_to_allocate``). ``num_attention_groups`` counts
    every per-token group (attention and hidden states).

    With ``async_scheduling`` (vLLM's, the GPU default) a state group in ``align``
    mode holds one block more: the state block a step retires is freed only once
    the step in flight before it is processed (``allocate_slots`` frees on
    ``num_computed_tokens - num_in_flight_tokens``, ``vllm/v1/core/kv_cache_manager.py``).

    Raises:
        ValueError: non-positive lengths or block size, or an unknown mode.
    """
    if prompt_len < 1 or output_len < 1:
        raise ValueError(f"prompt_len and output_len must be >= 1, got {prompt_len}, {output_len}")
    _check_positive(block_size, "block_size")
    lookahead = num_speculative_tokens if num_lookahead_tokens is None else num_lookahead_tokens
    attention = _cdiv(prompt_len + output_len - 1 + num_speculative_tokens + lookahead,
                      block_size)
    if check_hash_block_size(hash_block_size, block_size) < block_size:
        attention = max(attention, (prompt_len - 1) // block_size + 2)
    states = _states_per_request(mamba_cache_mode)
    if mamba_cache_mode == "align":
        states += num_speculative_tokens + bool(async_scheduling)
    return num_attention_groups * attention + num_state_groups * states


def inpass_capture_limit(prompt_len: int, output_len: int, *, num_blocks: int, block_size: int,
                         num_attention_groups: int, num_state_groups: int) -> int:
    """``inpass`` checkpoint mode: most states one prefill step of a request may
    capture inside the pass.

    Each capture holds one block per state group for the step, beyond what the
    request holds in ``split`` mode (:func:`blocks_needed`, align mode); the
    limit is what the pool (``num_blocks``, vLLM's null block included) has
    left: ``(num_blocks - 1 - blocks_needed) // num_state_groups``, at least 0.
    A request that fits alone therefore always gets its step. Both the
    simulator (``core/cache/checkpoint.py``) and the plugin (``plugin/scheduler.py``) end a
    chunk at the first admitted position past the limit, as ``split`` mode would.

    Raises:
        ValueError: as :func:`blocks_needed`.
    """
    need = blocks_needed(prompt_len, output_len, block_size=block_size,
                         num_attention_groups=num_attention_groups, num_state_groups=num_state_groups)
    return max(0, (num_blocks - 1 - need) // max(1, num_state_groups))


def _attention_blocks_needed(geometry: CacheGeometry, num_tokens: int) -> int:
    # Sliding groups are charged like full ones (an upper bound, see minimum_capacity_bytes).
    return geometry.num_attention_groups * _cdiv(num_tokens, geometry.block_size)


def _human(num_bytes: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(num_bytes) >= size:
            return f"{num_bytes / size:.2f} {unit} ({num_bytes} bytes)"
    return f"{num_bytes} bytes"
