"""vLLM's hidden-states connector on the CPU platform: the one step it does with CUDA.

vLLM 0.32's ``ExampleHiddenStatesConnector``
(``distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py``) writes
each finished request's per-token hidden states, which ``extract_hidden_states``
speculative decoding caches in a KV cache group of their own (``HiddenStateCacheSpec``),
to a safetensors file. Its scheduler side runs anywhere; its worker side copies the
states out of the KV cache on a CUDA stream into pinned host memory, which the CPU build
has neither of (``RuntimeError: pin_memory=True requires a CUDA or other accelerator
backend``).

:class:`CPUHiddenStatesConnector` is that connector with the copy done in place: on CPU
the KV cache already is host memory, so the states are gathered by the same slot mapping
and written by the connector's own writer threads, under its own file locks. Nothing
else changes, so the files, the ``hidden_states_path`` transfer parameter and the
delayed block free are vLLM's. Use it through vLLM's out-of-tree connector loading::

    --kv-transfer-config '{"kv_connector": "CPUHiddenStatesConnector",
        "kv_connector_module_path": "vllm_admission.plugin.repairs.cpu_hidden_states",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": "/tmp/hidden"}}'

with ``--speculative-config '{"method": "extract_hidden_states",
"num_speculative_tokens": 1, "draft_model_config": {"hf_config":
{"eagle_aux_hidden_state_layer_ids": [...]}}}'``. Read a file back with vLLM's
``load_hidden_states``; :func:`hidden_states_connector_config` builds the dictionary.

Upstream: no upstream issue found as of 2026-11 (the connector came with vLLM PR #33736,
GPU only). A worker-side copy that skips the CUDA stream and pinned memory on the CPU
platform would retire this module.
"""

from __future__ import annotations

import fcntl
import os
from functools import partial
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)

__all__ = ["CPUHiddenStatesConnector", "hidden_states_connector_config"]


class _Done:
    """A copy that finished when it was made (stands in for a CUDA event)."""

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


class CPUHiddenStatesConnector(ExampleHiddenStatesConnector):
    """``ExampleHiddenStatesConnector`` whose worker copies the states on the host.

    The extracted tensor has shape ``(num_prompt_tokens, num_hidden_states,
    hidden_size)`` (vLLM's layout of the cache-only layer, one row per token); the
    file holds it as ``"hidden_states"`` beside the request's ``"token_ids"``.
    """

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slots = (offsets.reshape(1, -1) + block_ids.reshape(-1, 1) * self._block_size).flatten()
        num_tokens = pending.token_ids.shape[0]
        tensors = {
            # A copy: the blocks go back to the pool once the request is reported done.
            "hidden_states": extract_from_kv_cache(self._kv_cache, slots, num_tokens).clone(),
            "token_ids": pending.token_ids.clone(),
        }
        if pending.req_id in self._req_futures:
            raise RuntimeError(f"a hidden-state write for request {pending.req_id} is in flight")
        os.makedirs(os.path.dirname(pending.filename) or ".", exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC,
                              0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = _Done()
        future = self._executor.submit(self._write_tensors, tensors, done, pending.filename,
                                       lock_fd)
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))


def hidden_states_connector_config(storage_path: str | os.PathLike) -> dict[str, Any]:
    """vLLM's ``kv_transfer_config`` for :class:`CPUHiddenStatesConnector`, writing
    one ``<request id>.safetensors`` file per finished request under ``storage_path``."""
    return {"kv_connector": CPUHiddenStatesConnector.__name__,
            "kv_connector_module_path": __name__,
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": str(storage_path)}}
