"""A second cache tier in host memory: vLLM 0.32's ``OffloadingConnector``, scheduler side.

vLLM's ``OffloadingConnector`` (``distributed/kv_transfer/kv_connector/v1/offloading/
scheduler.py``) with its CPU manager (``v1/kv_offload/cpu/manager.py``) keeps copies of
KV blocks and recurrent states in host memory and loads them back on a prefix hit. This
module models what decides hits there, one request at a time, with one engine block per
host chunk (the connector's default ``blocks_per_chunk=1``); docs/engine-facts.md
section 14 lists the facts with their sources, and :class:`HostTier` states them where
they are used.

* A **key** is ``(block hash, KV cache group index)``: the GPU block hash of the chunk's
  last block, per group (``make_offload_key``).
* Every chunk costs the same host bytes, one block id's stride of the KV cache (all
  layer slots), rounded up to the host page (``CPUOffloadingSpec``:
  ``cpu_bytes_to_use // round_up(bytes per block, page size)`` chunks).
* The **host policy** is vLLM's ``CachePolicy`` interface
  (``v1/kv_offload/cpu/policies/base.py``); :class:`HostLRU` is vLLM's ``lru``, and
  :class:`HostEviction` runs one of the project's registered eviction policies there (the
  engine loads it through ``cache_policy_module_path``). A policy learns of use only when
  a chunk is inserted and when a request finishes (the keys it loaded, stored or found
  stored, head of the prompt last), never at a lookup.

Pure Python: no vLLM, no torch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

from vllm_admission.core.errors import UserError

if TYPE_CHECKING:
    from vllm_admission.core.eviction import EvictionPolicy

__all__ = ["H2D_BYTES_PER_SECOND", "HOST_PAGE_BYTES", "HostEviction", "HostLRU", "HostRequest",
           "HostTier", "check_host_admission", "check_host_tier", "host_chunks", "host_policy_names",
           "make_host_policy"]

#: Host-to-device bytes per second the load times assume: an H100's PCIe 5.0 x16 link,
#: nominal, one direction (32 GT/s x 16 lanes / 8 bits = 64 GB/s; NVIDIA's H100 datasheet
#: gives "PCIe Gen5: 128 GB/s", both directions together).
H2D_BYTES_PER_SECOND = 64e9

#: The host page a chunk is rounded up to (vLLM's ``SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT``
#: is ``mmap.PAGESIZE``: 4 KiB on x86-64 and most Arm servers).
HOST_PAGE_BYTES = 4096


#: A host chunk's key in the host tier modelled here: ``(block hash, KV cache group index)``.
#: The host policies take any hashable key (in the engine, vLLM's ``OffloadKey`` bytes).
HostKey: TypeAlias = tuple[int, int]


def host_chunks(host_bytes: int, bytes_per_block: int, page_bytes: int = HOST_PAGE_BYTES) -> int:
    """Chunks a host tier of ``host_bytes`` holds, one engine block each
    (``CPUOffloadingSpec.__init__``: ``cpu_bytes_to_use // round_up(kv_bytes_per_chunk,
    BLOCK_SIZE_ALIGNMENT)``).

    Args:
        host_bytes: the tier's bytes (vLLM's ``cpu_bytes_to_use``), >= 0.
        bytes_per_block: bytes of one block id across every layer slot (the
            ``CacheLayout.bytes_per_block``), >= 1.
        page_bytes: the host page a chunk is rounded up to.

    Raises:
        UserError: a negative ``host_bytes`` or a block size below one byte.
    """
    if isinstance(host_bytes, bool) or not isinstance(host_bytes, int) or host_bytes < 0:
        raise UserError(f"the host tier's bytes must be an integer >= 0, got {host_bytes!r}")
    if bytes_per_block < 1 or page_bytes < 1:
        raise UserError(f"bytes per block and host page must be >= 1, got {bytes_per_block}, "
                        f"{page_bytes}")
    chunk = -(-bytes_per_block // page_bytes) * page_bytes
    return host_bytes // chunk


class HostLRU:
    """vLLM's ``lru`` host policy (``v1/kv_offload/cpu/policies/lru.py``
    ``LRUCachePolicy``): evicts the least recently used idle chunk.

    A use is an insertion, or a request's finish, which uses its keys from the tail of
    the prompt to its head (so a shared head outlives the tails). The order is kept in
    an ``OrderedDict`` (oldest first) instead of vLLM's ranked heap; the order is the
    same.
    """

    name = "lru"

    def __init__(self) -> None:
        self._order: OrderedDict[Hashable, None] = OrderedDict()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._order

    def __len__(self) -> int:
        return len(self._order)

    def insert(self, key: Hashable) -> None:
        self._order[key] = None

    def touch(self, keys: Iterable[Hashable]) -> None:
        """Use ``keys``, the last one most recently."""
        order = self._order
        for key in keys:
            if key in order:
                order.move_to_end(key)

    def on_request_finished(self, keys_head_first: Sequence[Hashable],
                            reused: AbstractSet[Hashable] = frozenset()) -> None:
        """A request finished: use its keys from the tail to the head (``reused`` plays
        no part in LRU)."""
        self.touch(reversed(keys_head_first))

    def discard(self, key: Hashable) -> None:
        self._order.pop(key, None)

    def evict(self, n: int, protected: AbstractSet[Hashable]) -> list[Hashable] | None:
        """The ``n`` least recently used keys not in ``protected``, removed; ``None``
        (nothing removed) when there are fewer."""
        chosen: list[Hashable] = []
        for key in self._order:
            if len(chosen) == n:
                break
            if key not in protected:
                chosen.append(key)
        if len(chosen) < n:
            return None
        for key in chosen:
            del self._order[key]
        return chosen

    def clone(self) -> HostLRU:
        other = HostLRU()
        other._order = self._order.copy()
        return other


class HostEviction:
    """One of the project's registered eviction policies as a host policy: the host
    tier's side of vLLM's ``CachePolicy`` interface (``v1/kv_offload/cpu/policies/
    base.py``) over an :class:`~vllm_admission.core.eviction.EvictionPolicy`. The plugin
    runs the same object inside vLLM's ``CPUOffloadingManager``
    (``vllm_admission.plugin.boundary.host_policy``), so simulator and engine agree.

    The GPU pool's events map onto the host tier's as follows:

    * a chunk is a candidate from its insertion (``add``); a key gets an integer id as
      a GPU block has one (a victim's id is given to the next key inserted, last freed
      first), and a policy that :attr:`~EvictionPolicy.needs_keys` is told the key
      (``on_cache``) first, so ghost lists work by key;
    * a request's finish uses its keys from the tail of the prompt to its head, as
      vLLM's ``lru`` does: each is withdrawn and made a candidate again (``remove``,
      ``add``), and one the request reused (loaded, or found stored; vLLM's
      ``reused_keys``) counts as a prefix hit in between (``on_hit``);
    * ``evict(n, protected)`` pops ``n`` victims; protected keys (the store's own keys,
      and in the engine chunks pinned by a transfer) are withdrawn for the call and
      made candidates again after it, so they count as used then.

    The policy's clock (``now``) is the number of requests finished so far. Policies that
    read FLOP values, the future or each request's prompt (``flop``, ``belady``,
    ``conversation``) get none of these from vLLM's host-policy calls and are refused
    (:func:`check_host_tier`).

    Args:
        policy: a fresh eviction policy.
    """

    def __init__(self, policy: EvictionPolicy) -> None:
        self.policy = policy
        self.name = policy.name
        self._ids: dict[Hashable, int] = {}
        self._keys: dict[int, Hashable] = {}
        self._free_ids: list[int] = []
        self._next_id = 0
        self.now = 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def insert(self, key: Hashable) -> None:
        """Hold ``key``; it is a candidate from now on. KeyError if already held."""
        if key in self._ids:
            raise KeyError(key)
        if self._free_ids:
            cid = self._free_ids.pop()
        else:
            cid = self._next_id
            self._next_id += 1
        self._ids[key] = cid
        self._keys[cid] = key
        if self.policy.needs_keys:
            self.policy.on_cache(cid, key)
        self.policy.add(cid, self.now)

    def discard(self, key: Hashable) -> None:
        """Drop ``key`` without evicting it (a failed store's cleanup); absent keys are
        ignored."""
        cid = self._ids.pop(key, None)
        if cid is None:
            return
        del self._keys[cid]
        policy = self.policy
        if cid in policy:
            policy.remove(cid)
        if policy.needs_hits:
            policy.forget(cid)
        self._free_ids.append(cid)

    def on_request_finished(self, keys_head_first: Sequence[Hashable],
                            reused: AbstractSet[Hashable] = frozenset()) -> None:
        """A request finished: use its held keys from the tail to the head, hits first
        for the ``reused`` ones."""
        self.now += 1
        policy, now, ids = self.policy, self.now, self._ids
        hits = policy.needs_hits
        for key in reversed(keys_head_first):
            cid = ids.get(key)
            if cid is None:
                continue
            if cid in policy:
                policy.remove(cid)
            if hits and key in reused:
                policy.on_hit(cid, now)
            policy.add(cid, now)

    def evict(self, n: int, protected: AbstractSet[Hashable]) -> list[Hashable] | None:
        """Remove and return ``n`` keys in the policy's eviction order, none of them in
        ``protected``; ``None`` (nothing changed) when fewer are evictable."""
        if n <= 0:
            return []
        policy, ids = self.policy, self._ids
        held = [ids[k] for k in protected if k in ids and ids[k] in policy]
        if len(policy) - len(held) < n:
            return None
        for cid in held:
            policy.remove(cid)
        victims = policy.pop_n(n, self.now)
        for cid in held:
            policy.add(cid, self.now)
        out: list[Hashable] = []
        for cid in victims:
            key = self._keys.pop(cid)
            del ids[key]
            out.append(key)
        self._free_ids.extend(victims)
        return out

    def clone(self) -> HostEviction:
        other = HostEviction.__new__(HostEviction)
        other.__dict__.update(self.__dict__)
        other.policy = self.policy.clone()
        other._ids = dict(self._ids)
        other._keys = dict(self._keys)
        other._free_ids = list(self._free_ids)
        return other


#: A host policy (:func:`make_host_policy`).
HostPolicy: TypeAlias = HostLRU | HostEviction


def _host_capable(cls: type[EvictionPolicy]) -> bool:
    return not (cls.needs_values or cls.needs_future or cls.needs_requests)


def host_policy_names() -> list[str]:
    """The host policies the host tier runs: vLLM's ``lru`` (:class:`HostLRU`), then every
    registered eviction policy that needs nothing vLLM's host-policy calls do not give
    (:class:`HostEviction`), in registry order. Read from the registry at each call."""
    from vllm_admission.core.eviction import EVICTION_POLICIES
    return [HostLRU.name] + [name for name, cls in EVICTION_POLICIES.items()
                             if name != HostLRU.name and _host_capable(cls)]


def make_host_policy(name: str) -> HostPolicy:
    """A fresh host policy by name (:func:`host_policy_names`).

    Raises:
        UserError: see :func:`check_host_tier`.
    """
    check_host_tier(name)
    if name == HostLRU.name:
        return HostLRU()
    from vllm_admission.core.eviction import get_eviction
    return HostEviction(get_eviction(name))


def check_host_tier(policy: str, *, partial_hash_hits: bool = False,
                    speculative_tokens: int = 0) -> None:
    """Refuse what a host tier is not modelled with: the one check the cache model, the
    tier and the simulator's sweep share.

    Args:
        policy: the host policy name.
        partial_hash_hits: the pool's ``hash_block_size`` is below its block size.
        speculative_tokens: draft tokens per step of any speculative method (0: none).

    Raises:
        UserError: a policy not in :func:`host_policy_names` (a registered one that needs
            FLOP values, the future or the prompts says so), or a hash block finer than
            the block or speculative decoding beside the tier (vLLM then adds
            partial-tail and EAGLE rules the model does not have).
    """
    names = host_policy_names()
    if policy not in names:
        from vllm_admission.core.eviction import EVICTION_POLICIES
        cls = EVICTION_POLICIES.get(policy)
        if cls is not None:
            needs = [what for flag, what in ((cls.needs_values, "FLOP values"),
                                             (cls.needs_future, "the future"),
                                             (cls.needs_requests, "each request's prompt"))
                     if flag]
            raise UserError(f"eviction policy {policy!r} cannot run in the host tier: it "
                            f"needs {' and '.join(needs)}, which vLLM's host-policy calls "
                            f"do not give; choose from {', '.join(names)}")
        raise UserError(f"unknown host policy {policy!r}; choose from {', '.join(names)}")
    if partial_hash_hits or speculative_tokens:
        raise UserError("a host tier is modelled without speculative decoding and with "
                        "whole-block hashes only")


def check_host_admission(name: str | None, has_host: bool) -> None:
    """Refuse a host admission policy (per-tier admission) that cannot run.

    Args:
        name: a registered admission policy name, or ``None`` (none).
        has_host: whether there is a host tier.

    Raises:
        UnknownPolicyError: ``name`` is not a registered admission policy (``auto``
            chooses GPU admission only).
        UserError: a host admission policy without a host tier.
    """
    if name is None:
        return
    from vllm_admission.core.admission import get_admission
    get_admission(name)
    if not has_host:
        raise UserError(f"host admission {name!r} needs a host tier (a host capacity, or "
                        f"vLLM's OffloadingConnector)")


@dataclass(slots=True)
class HostRequest:
    """One request's dealings with the host tier (the connector's ``RequestOffloadState``
    and the manager's ``_RequestCacheAccess``).

    Attributes:
        next_chunk: index of the next attention chunk to offer for storing.
        seen: the keys the request loaded, stored or found stored, first-seen order,
            each with its position (tokens up to its end).
        inserted: the keys the request's stores inserted.
        reused: the keys it loaded or found stored that it had not inserted itself
            (vLLM's ``reused_keys``).
    """

    next_chunk: int = 0
    seen: dict[HostKey, int] = field(default_factory=dict)
    inserted: set[HostKey] = field(default_factory=set)
    reused: set[HostKey] = field(default_factory=set)


#: A finished request's deferred work (:meth:`HostTier.finish`): the request, its hashes,
#: how far to store, the attention groups and the block size.
_Finished: TypeAlias = tuple[HostRequest, Sequence[int], int, tuple[int, ...], int]


class HostTier:
    """The host tier of an ``OffloadingConnector`` with ``num_chunks`` chunks.

    Args:
        num_chunks: capacity in chunks (:func:`host_chunks`), >= 1.
        policy: a host policy name in :func:`host_policy_names`.
        bytes_per_chunk: bytes one chunk moves (for the byte counters).

    Counters (cumulative): ``stored``, ``loaded`` and ``evicted`` chunks, ``failed_stores``
    (store calls refused for want of idle chunks: vLLM's
    ``vllm:kv_offload_allocation_failure``), ``hit_tokens`` (tokens loaded).

    Raises:
        UserError: fewer than one chunk, or an unknown policy name.
    """

    def __init__(self, num_chunks: int, policy: str = "lru", bytes_per_chunk: int = 0) -> None:
        if num_chunks < 1:
            raise UserError(f"a host tier of {num_chunks} chunks holds nothing; give it at "
                            f"least one block's bytes")
        self.policy = make_host_policy(policy)
        self.num_chunks = num_chunks
        self.policy_name = policy
        self.bytes_per_chunk = bytes_per_chunk
        self.stored = self.loaded = self.evicted = self.failed_stores = self.hit_tokens = 0
        #: The last finished request's deferred work (:meth:`finish`), or ``None``.
        self._finished: _Finished | None = None
        #: Chunks a transfer holds, which the policy may not evict (vLLM's nonzero
        #: ``ref_cnt``): inserted this step, inserted the step before (the worker submits
        #: a store at the start of the next step and it completes at that step's end),
        #: loaded this step (a load completes within its step on the CPU worker).
        self._fresh: set[HostKey] = set()
        self._writing: set[HostKey] = set()
        self._loading: set[HostKey] = set()

    def clone(self) -> HostTier:
        other = HostTier.__new__(HostTier)
        other.__dict__.update(self.__dict__)
        other.policy = self.policy.clone()
        if self._finished is not None:
            req, hashes, upto, attn_groups, block_size = self._finished
            other._finished = (HostRequest(req.next_chunk, dict(req.seen), set(req.inserted),
                                           set(req.reused)), hashes, upto, attn_groups, block_size)
        other._fresh, other._writing = set(self._fresh), set(self._writing)
        other._loading = set(self._loading)
        return other

    def __len__(self) -> int:
        return len(self.policy)

    # -- steps -----------------------------------------------------------
    def next_step(self) -> None:
        """An engine step begins: last step's stores are being written, the ones before
        are done, loads are done."""
        self._writing, self._fresh = self._fresh, set()
        self._loading.clear()

    def settle(self) -> None:
        """At least one engine step ran without stores (a decode step): every transfer is
        done."""
        self._fresh.clear()
        self._writing.clear()
        self._loading.clear()

    # -- lookup ----------------------------------------------------------
    def hit_end(self, hashes: Sequence[int], start: int, prompt_len: int, block_size: int,
                attn_groups: Sequence[int], state_groups: Sequence[int]) -> int:
        """Where a prefix hit ends with the host tier, in tokens: ``start`` (the engine's
        own hit, block-aligned) or more.

        ``_lookup_complete_chunks``: the hit may reach ``prompt_len - 1`` tokens floored
        to the block (the state groups are "sliding window" groups there, and align
        mode rounds to the chunk); each attention group extends it by consecutive host
        chunks from ``start``; then it ends at the highest block boundary above
        ``start`` where every state group has a host state. A hit shorter than one
        block beyond ``start`` counts as none.
        """
        B = block_size
        last = min((prompt_len - 1) // B, len(hashes))
        first = start // B
        if last <= first:
            return start
        policy = self.policy
        for g in attn_groups:
            k = first
            while k < last and (hashes[k], g) in policy:
                k += 1
            last = k
            if last <= first:
                return start
        for i in range(last - 1, first - 1, -1):
            h = hashes[i]
            if all((h, g) in policy for g in state_groups):
                return (i + 1) * B
        return start

    def load(self, req: HostRequest, hashes: Sequence[int], start: int, end: int, block_size: int,
             attn_groups: Sequence[int], state_groups: Sequence[int]) -> int:
        """Load ``[start, end)``: the attention chunks there and the states at ``end``
        (``update_state_after_alloc``, ``prepare_load``); they count as the request's
        reuses. Later stores of the request begin at ``end``. Returns the chunks loaded."""
        B = block_size
        keys = [((hashes[i], g), (i + 1) * B) for g in attn_groups
                for i in range(start // B, end // B)]
        keys += [((hashes[end // B - 1], g), end) for g in state_groups]
        for key, pos in keys:
            req.seen.setdefault(key, pos)
            if key not in req.inserted:
                req.reused.add(key)
            self._loading.add(key)
        req.next_chunk = end // B
        self.loaded += len(keys)
        self.hit_tokens += end - start
        return len(keys)

    # -- stores ----------------------------------------------------------
    def store(self, req: HostRequest, keys: Sequence[tuple[HostKey, int]]) -> bool:
        """One ``prepare_store`` call: ``keys`` are ``(key, position)`` pairs. Keys
        already held count as the request's reuses; the missing ones are inserted, all or
        none, evicting idle chunks the policy picks (never one of ``keys``). Returns
        ``False`` when they do not fit (nothing stored; vLLM retries at the request's
        next step). Chunks in transfer (:meth:`next_step`) are not evicted either."""
        policy = self.policy
        new: list[HostKey] = []
        for key, pos in keys:
            req.seen.setdefault(key, pos)
            if key not in policy:
                new.append(key)
            elif key not in req.inserted:
                req.reused.add(key)
        if not new:
            return True
        over = len(new) - (self.num_chunks - len(policy))
        if over > 0:
            protected = {key for key, _ in keys}
            protected |= self._fresh
            protected |= self._writing
            protected |= self._loading
            evicted = policy.evict(over, protected)
            if evicted is None:
                self.failed_stores += 1
                return False
            self.evicted += len(evicted)
        for key in new:
            policy.insert(key)
        req.inserted.update(new)
        self._fresh.update(new)
        self.stored += len(new)
        return True

    def store_chunks(self, req: HostRequest, hashes: Sequence[int], upto: int,
                     attn_groups: Sequence[int], block_size: int) -> None:
        """Offer the attention chunks ``[req.next_chunk, upto)`` of every attention
        group, one call (``_build_store_jobs``); on success the next offer starts at
        ``upto``, else the same chunks are offered again next time."""
        first = req.next_chunk
        if upto <= first:
            return
        B = block_size
        keys = [((hashes[i], g), (i + 1) * B) for g in attn_groups for i in range(first, upto)]
        if self.store(req, keys):
            req.next_chunk = upto

    def finish(self, req: HostRequest, hashes: Sequence[int], upto: int,
               attn_groups: Sequence[int], block_size: int) -> None:
        """The request is done. Its last store pass (the prompt's attention chunks, so a
        retry of a refused store) and the policy's use of its keys wait for the engine's
        next step (``build_connector_meta`` handles ``finished_req_ids`` then): the next
        request's first step (:meth:`flush`), after that step's own stores."""
        self.flush()
        self._finished = (req, hashes, upto, tuple(attn_groups), block_size)

    def flush(self) -> None:
        """Run the finished request's deferred work, if any: its last store pass, then its
        keys, ordered by position (ties in group order), used from the tail to the head
        (``CPUOffloadingManager.on_request_finished``, ``order_request_keys``)."""
        pending, self._finished = self._finished, None
        if pending is None:
            return
        req, hashes, upto, attn_groups, block_size = pending
        self.store_chunks(req, hashes, upto, attn_groups, block_size)
        ordered = sorted(req.seen.items(), key=lambda kv: (kv[1], kv[0][1]))
        self.policy.on_request_finished([key for key, _ in ordered], req.reused)
        req.seen.clear()
        req.reused.clear()
        req.inserted.clear()
