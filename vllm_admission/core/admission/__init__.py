"""Admission policies: which recurrent-state checkpoints enter the prefix cache.

A hybrid model's prefix hit needs every attention KV block of the prefix and a recurrent
state saved exactly at the prefix's end. vLLM 0.32 in ``align`` mode writes a state only
where a prefill chunk ends (and, in decode, where the running state crosses a block
boundary), so a policy has two levers at block-aligned token positions: where a chunk
must end (``stops``) and which written states get a block hash (``admit``). The simulator
and the vLLM plugin call the same objects, per request through one
:class:`RequestAdmission`.

=================  ===================================================================
module             contents
=================  ===================================================================
``base``           the policy API: :class:`HitProbe` (what the lookup found),
                   :class:`AdmissionPolicy` (hooks, declared and derived attributes),
                   :class:`AdmissionDecision` and its members ``SKIP``, ``ADMIT``,
                   ``TENTATIVE``, ``HOST``
``kinds``          :class:`CheckpointKind` and :func:`checkpoint_kinds` (why a state
                   was written at a position), :func:`prompt_ends`, :func:`sequence_end`
``policies``       the built-in policies (the names of :data:`ADMISSION_POLICIES`
                   before any other package registers one) and the registry:
                   :data:`ADMISSION_POLICIES`, :func:`register_admission`,
                   :func:`get_admission`, :func:`stock_admission`
``request``        :class:`RequestAdmission`: one request's stops, decisions,
                   checkpoints and block values
=================  ===================================================================

The blocks' FLOP values (Marconi's valuation: :class:`SegmentCosts`,
:func:`segment_values`, :func:`block_value`) live in :mod:`vllm_admission.core.block_values`
and are re-exported here.

Sources: Marconi (Pan et al., MLSys 2025) section 4.1; vLLM 0.32
``vllm/v1/core/sched/scheduler.py`` (``_mamba_block_aligned_split``),
``vllm/v1/core/kv_cache_manager.py`` (``get_computed_blocks``),
``vllm/v1/core/kv_cache_coordinator.py`` (``replay_boundaries``),
``vllm/v1/core/single_type_kv_cache_manager.py`` (``MambaManager``).
"""

from vllm_admission.core.admission.base import (
    ADMIT,
    HOST,
    SKIP,
    TENTATIVE,
    AdmissionDecision,
    AdmissionPolicy,
    HitProbe,
)
from vllm_admission.core.admission.kinds import (
    CheckpointKind,
    checkpoint_kinds,
    prompt_ends,
    sequence_end,
)
from vllm_admission.core.admission.policies import (
    ADMISSION_POLICIES,
    ENTRY_POINT_GROUP,
    BlockAdmission,
    DenseAdmission,
    LastAdmission,
    MarconiAdmission,
    NoAdmission,
    VllmAdmission,
    WrittenAdmission,
    get_admission,
    register_admission,
    stock_admission,
)
from vllm_admission.core.admission.request import RequestAdmission
from vllm_admission.core.block_values import SegmentCosts, block_value, segment_values
from vllm_admission.core.registry import UnknownPolicyError

__all__ = [
    "ADMISSION_POLICIES",
    "ADMIT",
    "ENTRY_POINT_GROUP",
    "HOST",
    "SKIP",
    "TENTATIVE",
    "AdmissionDecision",
    "AdmissionPolicy",
    "BlockAdmission",
    "CheckpointKind",
    "DenseAdmission",
    "HitProbe",
    "LastAdmission",
    "MarconiAdmission",
    "NoAdmission",
    "RequestAdmission",
    "SegmentCosts",
    "UnknownPolicyError",
    "VllmAdmission",
    "WrittenAdmission",
    "block_value",
    "checkpoint_kinds",
    "get_admission",
    "prompt_ends",
    "register_admission",
    "segment_values",
    "sequence_end",
    "stock_admission",
]
