"""The built-in admission policies and the registry of admission policies by name.

A new policy is one :class:`~vllm_admission.core.admission.AdmissionPolicy` subclass and
one :func:`register_admission` call at the end of this module, or, from another package,
one entry point in the group :data:`ENTRY_POINT_GROUP`. Registration order is the order
shown to users (and ``auto``'s candidate order).

Sources: vLLM 0.32 ``vllm/v1/core/single_type_kv_cache_manager.py``
(``MambaManager.reachable_block_mask``: what ``vllm`` keeps), ``vllm/config/cache.py``
(``prefix_cache_retention_interval``); Marconi (Pan et al., MLSys 2025) section 4.1
(``marconi``).
"""

from __future__ import annotations

from vllm_admission.core.admission.base import AdmissionPolicy, HitProbe
from vllm_admission.core.admission.kinds import CheckpointKind
from vllm_admission.core.layout import check_retention_interval
from vllm_admission.core.registry import PolicyRegistry

__all__ = [
    "ADMISSION_POLICIES",
    "ENTRY_POINT_GROUP",
    "BlockAdmission",
    "DenseAdmission",
    "LastAdmission",
    "MarconiAdmission",
    "NoAdmission",
    "VllmAdmission",
    "WrittenAdmission",
    "get_admission",
    "register_admission",
    "stock_admission",
]


class NoAdmission(AdmissionPolicy):
    name = "none"
    summary = "cache no recurrent state: no hybrid prefix hit is possible (the floor)"

    admitted = frozenset()


class LastAdmission(AdmissionPolicy):
    name = "last"
    summary = ("vLLM before PR 37898: states at prefill chunk ends, the prompt's last "
               "block boundary and decode block boundaries; no junction")
    auto_candidate = True

    admitted = frozenset(CheckpointKind) - {CheckpointKind.JUNCTION}


class VllmAdmission(AdmissionPolicy):
    """vLLM's own retention, as the engine is configured.

    ``prefix_cache_retention_interval`` (``vllm/config/cache.py``; applied by
    ``MambaManager.reachable_block_mask`` in
    ``vllm/v1/core/single_type_kv_cache_manager.py``):

    * ``0`` (vLLM's default): only the "reachable boundaries", the prompt's
      replay boundary (``prompt_len - 1``, block-floored) and the shared-prefix
      junction;
    * ``N > 0``: those plus every state written at a multiple of ``N`` tokens
      (a chunk end or a decode boundary that lands there; vLLM adds no chunk
      stop for them);
    * ``None``: every state written (dense).

    With a ``prefix_match_unit`` finer than the block the prompt's unit end
    (PROMPT_UNIT_END) is kept besides its last block boundary (PROMPT_END). The junction is a
    chunk stop in all three (``_mamba_block_aligned_split``).

    Args:
        retention_interval: as above. A positive value must be a multiple of
            the block size (checked where the layout is known,
            :class:`~vllm_admission.core.layout.CacheLayout`).

    Raises:
        ValueError: a negative or non-integer interval.
    """

    name = "vllm"
    summary = ("stock vLLM 0.32: the prompt's last block boundary plus the shared-prefix "
               "junction (prefix_cache_retention_interval=0; N adds every N tokens, None all)")
    vllm_native = True
    auto_candidate = True
    admitted = frozenset({CheckpointKind.JUNCTION, CheckpointKind.PROMPT_END, CheckpointKind.PROMPT_UNIT_END})

    def __init__(self, retention_interval: int | None = 0) -> None:
        check_retention_interval(retention_interval)
        self.retention_interval = retention_interval
        if retention_interval is None:
            self.admitted = frozenset(CheckpointKind)
        elif retention_interval > 0:
            self.period = retention_interval
            self.admitted = VllmAdmission.admitted | {CheckpointKind.PERIODIC}

    @classmethod
    def for_engine(cls, *, retention_interval: int | None = 0) -> AdmissionPolicy:
        return cls(retention_interval)

    def junction(self, probe: HitProbe) -> int:
        return probe.junction

    def __repr__(self) -> str:
        return f"VllmAdmission(retention_interval={self.retention_interval!r})"


class MarconiAdmission(AdmissionPolicy):
    name = "marconi"
    summary = ("Marconi at block granularity: the shared-prefix junction plus the "
               "last block boundary of the finished sequence (prompt + output)")
    auto_candidate = True
    admitted = frozenset({CheckpointKind.JUNCTION, CheckpointKind.SEQUENCE_END})

    def junction(self, probe: HitProbe) -> int:
        return probe.junction


class BlockAdmission(AdmissionPolicy):
    """Stock vLLM's admission with prompt ends on block boundaries only: the
    junction and the prompt's last block boundary (PROMPT_END), never the
    hash block inside a block (PROMPT_UNIT_END).

    Without a ``prefix_match_unit`` finer than the block this is ``vllm`` at
    retention 0. With one, it keeps what stock keeps without the unit (no state at the
    prompt's unit end, no sub-block key on the attention block), so the unit costs no cache space;
    ``auto`` weighs it against ``vllm`` only there (:attr:`sub_block_only`). When that
    pays: ``docs/results.md``, section 3.7.
    """

    name = "block"
    summary = ("stock vLLM with prompt ends on block boundaries only: under a "
               "prefix_match_unit no state at the prompt's unit end (hits stay whole blocks, no extra memory)")
    auto_candidate = True
    sub_block_only = True
    admitted = frozenset({CheckpointKind.JUNCTION, CheckpointKind.PROMPT_END})

    def junction(self, probe: HitProbe) -> int:
        return probe.junction


class DenseAdmission(AdmissionPolicy):
    name = "dense"
    summary = "a state at every block boundary (vLLM's older 'all' mode): most hits, most memory"
    auto_candidate = True
    every_block = True

    admitted = frozenset(CheckpointKind)


class WrittenAdmission(AdmissionPolicy):
    """Every state the engine writes anyway, and the shared-prefix junction.

    The states at prefill chunk ends, at the prompt's last block boundary, at decode
    block boundaries and at the junction (a chunk stop, as in ``vllm``); no other chunk
    stop. It keeps what ``last`` keeps plus the junction, and what ``vllm`` keeps plus
    the chunk ends and decode boundaries: vLLM's retention interval ``none``
    (``prefix_cache_retention_interval`` unset to ``None``, ``MambaManager.reachable_block_mask``
    in ``vllm/v1/core/single_type_kv_cache_manager.py``) as a plugin policy, so it runs
    on any engine setting and beside any eviction policy. Switched to from stock's
    ``vllm``, it drops none of the kinds of state stock keeps, which makes it the
    candidate a late switch of ``auto`` can take without losing what stock saved
    (docs/results.md 5.6). Not an ``auto`` candidate by default; ``--auto-admissions``
    (``VLLM_ADMISSION_AUTO_ADMISSIONS``) adds it.
    """

    name = "written"
    summary = ("every state the engine writes (chunk ends, prompt end, decode boundaries) "
               "and the junction: vLLM's retention interval `none` as a plugin policy")

    admitted = frozenset(CheckpointKind)

    def junction(self, probe: HitProbe) -> int:
        return probe.junction


def _check_admission(cls: type[AdmissionPolicy]) -> None:
    """What :data:`ADMISSION_POLICIES` asks of a class beyond a name and a summary.

    Raises:
        TypeError: neither ``admitted`` nor an own ``admit``.
    """
    if not hasattr(cls, "admitted") and cls.admit is AdmissionPolicy.admit:
        raise TypeError(f"{cls.__name__} must set admitted or override admit")


#: The entry-point group through which another package adds admission policies
#: (``[project.entry-points."vllm_admission.admission_policies"]``: ``name =
#: "package.module:PolicyClass"``).
ENTRY_POINT_GROUP = "vllm_admission.admission_policies"

#: Registry: name -> admission policy class, in the order shown to users
#: (:class:`~vllm_admission.core.registry.PolicyRegistry`; other packages' policies join it
#: when a front end loads the entry points).
ADMISSION_POLICIES: PolicyRegistry[AdmissionPolicy] = PolicyRegistry(
    "admission", AdmissionPolicy, ENTRY_POINT_GROUP, check=_check_admission)


def register_admission(cls: type[AdmissionPolicy]) -> type[AdmissionPolicy]:
    """Add ``cls`` under ``cls.name``, after the policies registered so far
    (:meth:`PolicyRegistry.register <vllm_admission.core.registry.PolicyRegistry.register>`).

    Returns:
        ``cls`` (usable as a class decorator).

    Raises:
        TypeError: not a concrete
            :class:`~vllm_admission.core.admission.AdmissionPolicy` subclass with a
            ``name``, a ``summary`` and ``admitted`` (or its own ``admit``).
        ValueError: the name is taken.
    """
    return ADMISSION_POLICIES.register(cls)


def get_admission(name: str, *, retention_interval: int | None = 0) -> AdmissionPolicy:
    """Build the admission policy registered under ``name`` for an engine whose
    ``prefix_cache_retention_interval`` is ``retention_interval``
    (:meth:`~vllm_admission.core.admission.AdmissionPolicy.for_engine`: only ``vllm``
    follows it).

    Raises:
        UnknownPolicyError: ``name`` is not registered; the message lists the
            valid names.
        ValueError: an invalid retention interval.
    """
    cls = ADMISSION_POLICIES.policy_class(name)
    return cls.for_engine(retention_interval=retention_interval)


def stock_admission() -> str:
    """The name of the one registered policy that is vLLM's own behaviour
    (``vllm_native``: ``vllm``).

    Raises:
        LookupError: not exactly one registered policy declares ``vllm_native``.
    """
    return ADMISSION_POLICIES.only("vllm_native", "native to vLLM")


ADMISSION_POLICIES.register_all(NoAdmission, LastAdmission, VllmAdmission, BlockAdmission, MarconiAdmission,
                                DenseAdmission, WrittenAdmission)
