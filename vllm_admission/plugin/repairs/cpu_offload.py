"""vLLM's OffloadingConnector on the CPU platform: a host tier whose copies run on the host.

vLLM 0.32's ``OffloadingConnector`` (``distributed/kv_transfer/kv_connector/v1/offloading/``)
keeps a second tier of KV blocks and recurrent states in host memory. Its scheduler side
(which chunks to store, what a lookup finds, the host eviction policy) is plain Python;
its worker side is an ``OffloadingSpec``'s worker, and vLLM's own
(``v1/kv_offload/cpu/spec.py`` ``CPUOffloadingSpec.get_worker``) refuses every platform
but CUDA and XPU, because it copies on streams with a batched-copy kernel.

:class:`HostCopyOffloadingSpec` is that spec with a worker that copies with plain tensor
indexing, synchronously, on the host: on the CPU build the "GPU" KV cache already is
host memory, so a store is a row gather from the KV cache into the host tier's buffer and
a load the scatter back. Everything else (the scheduler side, the host policy, the
chunk arithmetic, capacity from ``cpu_bytes_to_use``) is vLLM's. It is loaded through
vLLM's out-of-tree spec hook (``spec_name`` + ``spec_module_path``, ``v1/kv_offload/
factory.py``), so nothing in vLLM is patched::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 1073741824,
            "spec_name": "HostCopyOffloadingSpec",
            "spec_module_path": "vllm_admission.plugin.repairs.cpu_offload"}}'

:func:`~vllm_admission.plugin.offload_config.offloading_connector_config` builds that
dictionary (the CLI's ``--offload BYTES``).
The copies are synchronous, so a load finishes within the step that submits it; the
connector still reports it one ``get_finished`` later, as it would an asynchronous one.
On a CUDA or XPU build the spec defers to vLLM's own worker.

Upstream: no upstream issue found as of 2026-11 for a CPU-platform worker of
``CPUOffloadingSpec`` (vLLM PR #43070, the XPU one, was closed). A worker that copies on
the host when there is no device stream would retire this module.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from vllm.platforms import current_platform
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from vllm_admission.plugin.offload_config import offloading_connector_config

__all__ = ["HostCopyOffloadingSpec", "HostCopyWorker", "offloading_connector_config"]


class HostCopyWorker(OffloadingWorker):
    """Moves KV pages between the engine's KV cache and a host buffer, synchronously.

    Args:
        kv_caches: vLLM's canonical view of the KV cache: per tensor an int8
            ``(num_blocks, page_size_bytes)`` view (its row stride may exceed the page),
            and per KV cache group the references (tensor index, unpadded page bytes)
            of its layers (``v1/kv_offload/base.py`` ``CanonicalKVCaches``).
        blocks_per_chunk: engine blocks per host chunk (``blocks_per_chunk`` of the
            connector's extra config).
        num_chunks: host chunks (``cpu_bytes_to_use`` // bytes per chunk, computed by
            ``CPUOffloadingSpec``).

    The host buffer is one int8 tensor per canonical tensor, of shape
    ``(num_chunks * blocks_per_chunk, page_size_bytes)``: one row per engine block, so
    ``num_chunks * blocks_per_chunk * sum(page_size_bytes)`` bytes in all.
    """

    def __init__(self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int,
                 num_chunks: int) -> None:
        self._blocks_per_chunk = int(blocks_per_chunk)
        self._device = [t.tensor for t in kv_caches.tensors]
        self._host = [torch.zeros((num_chunks * self._blocks_per_chunk, t.page_size_bytes),
                                  dtype=torch.int8, device="cpu")
                      for t in kv_caches.tensors]
        self._refs = [[(ref.tensor_idx, ref.page_size_bytes) for ref in refs]
                      for refs in kv_caches.group_data_refs]
        self._finished: list[TransferResult] = []

    def _host_rows(self, chunks: np.ndarray, skip: int, count: int) -> torch.Tensor:
        """Rows of the host buffer for ``count`` blocks starting ``skip`` blocks into
        the first of ``chunks`` (vLLM's sub-block enumeration, ``gpu_worker.py``
        ``compute_sub_block_ptrs``)."""
        per = self._blocks_per_chunk
        rows = (chunks.astype(np.int64)[:, None] * per + np.arange(per)[None, :]).ravel()
        return torch.from_numpy(rows[skip:skip + count].copy())

    def _transfer(self, job_id: int, gpu: GPULoadStoreSpec, host: LoadStoreSpec,
                  store: bool) -> bool:
        if not isinstance(host, BlockIDsLoadStoreSpec):
            raise TypeError(f"the host tier takes chunk ids, not {type(host).__name__}")
        start = time.perf_counter()
        moved = 0
        gpu_at = host_at = 0
        for group, (size, first) in enumerate(zip(gpu.group_sizes, gpu.block_indices, strict=True)):
            if size == 0:
                continue
            skip = int(first) % self._blocks_per_chunk
            num_chunks = -(-(size + skip) // self._blocks_per_chunk)
            blocks = torch.from_numpy(gpu.block_ids[gpu_at:gpu_at + size].astype(np.int64))
            rows = self._host_rows(host.block_ids[host_at:host_at + num_chunks], skip, size)
            gpu_at += size
            host_at += num_chunks
            for tensor_idx, page in self._refs[group]:
                device, buffer = self._device[tensor_idx], self._host[tensor_idx]
                if store:
                    buffer[rows, :page] = device[blocks, :page]
                else:
                    device[blocks, :page] = buffer[rows, :page]
                moved += size * page
        if gpu_at != len(gpu.block_ids) or host_at != len(host.block_ids):
            raise ValueError(f"transfer {job_id}: {len(gpu.block_ids)} blocks and "
                             f"{len(host.block_ids)} chunks do not match the group sizes "
                             f"{list(gpu.group_sizes)}")
        self._finished.append(TransferResult(job_id=job_id, success=True, transfer_size=moved,
                                             transfer_time=time.perf_counter() - start))
        return True

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec,
                     dst_spec: LoadStoreSpec) -> bool:
        """Copy the engine blocks of ``src_spec`` into the host chunks of ``dst_spec``."""
        return self._transfer(job_id, src_spec, dst_spec, store=True)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec,
                    dst_spec: GPULoadStoreSpec) -> bool:
        """Copy the host chunks of ``src_spec`` into the engine blocks of ``dst_spec``."""
        return self._transfer(job_id, dst_spec, src_spec, store=False)

    def get_finished(self) -> list[TransferResult]:
        """The transfers done since the last call (all of them: copies are synchronous)."""
        done, self._finished = self._finished, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        """Nothing to wait for: every submitted copy has finished."""
        return None

    def shutdown(self) -> None:
        self._finished.clear()
        self._host.clear()
        self._device.clear()


class HostCopyOffloadingSpec(CPUOffloadingSpec):
    """vLLM's ``CPUOffloadingSpec`` with :class:`HostCopyWorker` on platforms without a
    device stream (the CPU build). Capacity, the host manager and its eviction policy are
    the parent's."""

    # The parent sets it (vLLM types it CPUOffloadingWorker | None); here it may be a HostCopyWorker.
    _worker: OffloadingWorker | None

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if current_platform.is_cuda_alike() or current_platform.is_xpu():
            return super().get_worker(kv_caches)
        if self._worker is None:
            self._worker = HostCopyWorker(kv_caches, self.blocks_per_chunk, self.num_chunks)
        return self._worker
