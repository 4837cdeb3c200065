"""What an engine configuration lets the plugin run: the start-up checks and the run plan.

One decision, :func:`plan_for`, from the plugin's settings and the
:class:`EngineFacts` that matter to it (speculative decoding,
how blocks get hashes, the KV cache group kinds, a FLOP model), taken twice
with the same code: before the model loads, from vLLM's ``VllmConfig`` alone
(:func:`preflight`, what a ``VllmConfig`` already tells), and when the
scheduler is built, from the live engine (:meth:`EngineSetup._admission_facts`,
which also sees the KV cache groups). A setting it cannot run is refused in
one line naming the setting and the feature in the way; ``auto`` leaves out the
candidates it cannot run instead, with one warning.

:class:`EngineSetup` is a mixin of
:class:`~vllm_admission.plugin.scheduler.AdmissionScheduler`: its methods read
the vLLM ``Scheduler`` they are mixed into (``cache_config``,
``kv_cache_config``, ``kv_cache_manager``, ``vllm_config``,
``block_size``, ``hash_block_size``, ``use_eagle_block_drop``) and decide, once,
at ``__init__``:

* whether the plugin has anything to do (:meth:`~EngineSetup._admission_inert_reason`);
* the core's view of the pool and its settings (:meth:`~EngineSetup._admission_geometry`,
  the :class:`~vllm_admission.core.layout.CacheLayout` built once here);
* the run's policy decisions (:meth:`~EngineSetup._admission_plan`, the core's
  :class:`~vllm_admission.core.run.RunPlan`), after leaving out of ``auto`` what
  the engine cannot run and refusing, in one line naming the feature in the way
  (:class:`~vllm_admission.plugin.env.SettingsError`), a fixed
  setting it cannot run;
* the FLOP model (:meth:`~EngineSetup._admission_costs`) and the ``inpass``
  mode's own checks (:meth:`~EngineSetup._admission_setup_inpass`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.v1.kv_cache_interface import MambaSpec

from vllm_admission.core.adaptive import AUTO, candidate_policies
from vllm_admission.core.admission import get_admission
from vllm_admission.core.cache import CHECKPOINT_MODES
from vllm_admission.core.cache.host import host_policy_names
from vllm_admission.core.eviction import (
    engine_eviction_policies,
    eviction_class,
)
from vllm_admission.core.layout import (
    PER_TOKEN_KINDS,
    STATE,
    CacheLayout,
    HostTierSpec,
    PoolSpec,
    SchedulingSpec,
    SpeculationSpec,
)
from vllm_admission.core.run import RunPlan
from vllm_admission.core.settings import STOCK_SETTINGS, Settings, SettingsError, env_name
from vllm_admission.plugin import inpass
from vllm_admission.plugin.boundary import hooks
from vllm_admission.plugin.kv_cache import (
    exports_prompt_end_state,
    group_kinds,
    smallest_cacheable_prefix,
)
from vllm_admission.plugin.offload_config import host_tier

if TYPE_CHECKING:  # names only (vLLM is Any to mypy; the scheduler imports it at run time)
    from vllm.config import CacheConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import KVCacheConfig

__all__ = ["EngineFacts", "EngineSetup", "plan_for", "preflight", "prefill_tokens",
           "BLOCK_SIZES_PROBLEM", "HIDDEN_STATES_METHOD", "MODELLED_KEY_PROBLEMS",
           "SPECULATIVE_PROBLEM", "SUB_BLOCK_PROBLEMS", "support_problems"]

logger = logging.getLogger("vllm_admission")

#: The key problem of a hash block size below the block size (``prefix_match_unit``), in the
#: words both checks use (:meth:`EngineFacts.from_vllm_config`, the scheduler's).
HASH_UNIT_PROBLEM = "a prefix_match_unit below the block size (sub-block hash keys)"

#: The key problems that come with a hash block size below the block size. The core models
#: them (``HybridPrefixCache``'s ``hash_block_size``); the plugin tells a hash-keyed
#: eviction policy the keys ``cache_partial_block`` and ``move_block_hashes`` give, as
#: the core does. Only ``inpass`` still cannot run there.
SUB_BLOCK_PROBLEMS = (HASH_UNIT_PROBLEM, "partial hash hits")

#: The key problem of speculative decoding (Mamba speculative blocks, never cached):
#: modelled under EAGLE/MTP (``HybridPrefixCache``'s ``num_speculative_tokens``).
SPECULATIVE_PROBLEM = "Mamba speculative blocks"

#: The key problem of KV cache groups of different block sizes (the hidden-state group of
#: ``extract_hidden_states`` on most real models): not modelled.
BLOCK_SIZES_PROBLEM = "KV cache groups of different block sizes"

#: The key problems the core models, for every admission and eviction policy.
MODELLED_KEY_PROBLEMS = (*SUB_BLOCK_PROBLEMS, SPECULATIVE_PROBLEM)

#: The speculative method that caches per-token hidden states in a KV cache group of their
#: own (vLLM's ``HiddenStateCacheSpec``) and drafts the sampled token: modelled without
#: EAGLE's rules (``HybridPrefixCache``'s ``eagle=False``).
HIDDEN_STATES_METHOD = "extract_hidden_states"


@dataclass(frozen=True)
class EngineFacts:
    """What in an engine's configuration decides which policies can run.

    Attributes:
        mamba_cache_mode: vLLM's ``cache_config.mamba_cache_mode`` (non-stock
            admission needs ``"align"``).
        eagle: EAGLE/MTP speculative decoding (vLLM drops the last matched
            block and keeps EAGLE groups, ``kv_cache_coordinator.py``).
        speculative_method: vLLM's ``speculative_config.method`` (``None``:
            no speculative decoding).
        key_problems: why blocks do not get exactly one hash per full block
            in ``BlockPool.cache_full_blocks`` (smaller hash block sizes, partial hash
            hits, Mamba speculative blocks), where the core keys by block.
        unsupported_group_kinds: KV cache group kinds besides full attention, Mamba/GDN
            state and hidden states (sliding window, ...).
        flop_model_error: why there is no FLOP model of the architecture
            (``None``: there is one).
    """

    mamba_cache_mode: str = "align"
    eagle: bool = False
    speculative_method: str | None = None
    key_problems: tuple[str, ...] = ()
    unsupported_group_kinds: tuple[str, ...] = ()
    flop_model_error: str | None = None

    @property
    def unmodelled_key_problems(self) -> list[str]:
        """The :attr:`key_problems` the core does not model (none of
        :data:`MODELLED_KEY_PROBLEMS`): no policy but stock's runs with them."""
        return [p for p in self.key_problems if p not in MODELLED_KEY_PROBLEMS]

    @classmethod
    def from_vllm_config(cls, vllm_config: Any) -> EngineFacts:
        """The facts a ``VllmConfig`` gives before the model loads.

        The block size is final only after the KV cache is sized (vLLM raises
        it for a hybrid model's state page), so a ``prefix_match_unit`` is
        known to split blocks only when it is below the configured block
        size; the scheduler checks the rest against the live KV cache groups.
        """
        cc = vllm_config.cache_config
        spec = vllm_config.speculative_config
        costs, flop_model_error = _cost_model(vllm_config.model_config.hf_config)
        keys = []
        prefix_match_unit = getattr(cc, "prefix_match_unit", None)
        if prefix_match_unit is not None and prefix_match_unit < cc.block_size:
            keys.append(HASH_UNIT_PROBLEM)
        if spec is not None and int(getattr(vllm_config, "num_speculative_tokens", 0) or 0) > 0 \
                and not getattr(cc, "use_replayssm", False):
            keys.append(SPECULATIVE_PROBLEM)
        if spec is not None and str(spec.method) == HIDDEN_STATES_METHOD \
                and not _hidden_states_share_the_block(costs, spec):
            keys.append(BLOCK_SIZES_PROBLEM)
        return cls(mamba_cache_mode=str(cc.mamba_cache_mode),
                   eagle=spec is not None and spec.use_eagle(),
                   speculative_method=None if spec is None else str(spec.method),
                   key_problems=tuple(keys),
                   flop_model_error=flop_model_error)


def _hidden_states_share_the_block(costs: Any, spec: Any) -> bool:
    """Whether ``extract_hidden_states``'s group (``spec``: vLLM's speculative config)
    gets the block size of the model's groups
    (:func:`~vllm_admission.core.geometry.hidden_states_share_the_block`, with the KV
    cache in the model dtype); ``True`` where the cost model cannot tell (``costs``
    ``None``, or attention pages the geometry model does not take: the scheduler then
    checks the live groups)."""
    from vllm_admission.core.errors import UserError
    from vllm_admission.core.geometry import hidden_states_share_the_block

    if costs is None:
        return True
    draft = getattr(spec, "draft_model_config", None)
    layers = getattr(getattr(draft, "hf_config", None), "eagle_aux_hidden_state_layer_ids",
                     None) or ()
    try:
        return hidden_states_share_the_block(costs,
                                             costs.hidden_state_bytes_per_token(len(layers)))
    except UserError:
        return True


def _cost_model(hf_config: Any) -> tuple[Any, str | None]:
    """The architecture's ``ModelCosts`` and ``None``, or ``None`` and why there is none."""
    from vllm_admission.core.costs import ModelConfigError, ModelCosts

    try:
        return ModelCosts.from_config(hf_config.to_dict()), None
    except ModelConfigError as exc:
        return None, str(exc)


def support_problems(facts: EngineFacts, policy: str) -> list[str]:
    """The engine features in the way of admission ``policy`` (none for ``vllm``)."""
    if get_admission(policy).vllm_native:
        return []
    problems = []
    if facts.mamba_cache_mode != "align":
        problems.append(f"mamba_cache_mode={facts.mamba_cache_mode!r} (needs 'align')")
    problems += facts.unmodelled_key_problems
    if SPECULATIVE_PROBLEM in facts.key_problems and not (
            facts.eagle or facts.speculative_method == HIDDEN_STATES_METHOD):
        problems.append(f"speculative decoding other than EAGLE/MTP and {HIDDEN_STATES_METHOD}")
    if facts.unsupported_group_kinds:
        problems.append(f"KV cache groups {', '.join(sorted(set(facts.unsupported_group_kinds)))}")
    return problems


def _check_supported(facts: EngineFacts, policy: str) -> None:
    problems = support_problems(facts, policy)
    if problems:
        raise SettingsError(
            f"{env_name('admission')}={policy} cannot run with {'; '.join(problems)} "
            f"(valid here: vllm)")


def plan_for(config: Settings, facts: EngineFacts) -> RunPlan:
    """The run's policy decisions (the core's :class:`RunPlan`) for ``config`` on an
    engine with ``facts``: ``auto``'s candidates less those the engine cannot run
    (one warning each side).

    Raises:
        SettingsError: a setting this engine cannot run (one line).
    """
    if facts.unsupported_group_kinds and config.wants_changes():
        raise SettingsError(
            f"vllm_admission supports full-attention and Mamba/GDN KV cache groups only; "
            f"this model also has {', '.join(sorted(set(facts.unsupported_group_kinds)))} (valid here: "
            f"{STOCK_SETTINGS})")
    adaptive = AUTO in (config.admission, config.eviction)
    admissions, evictions = candidate_policies(config.admission, config.eviction,
                                               sub_block=HASH_UNIT_PROBLEM in facts.key_problems,
                                               admissions=config.auto.admissions)
    if config.admission == AUTO:
        problems = {name: support_problems(facts, name) for name in admissions}
        dropped = [name for name in admissions if problems[name]]
        if dropped:
            reasons = sorted({p for name in dropped for p in problems[name]})
            logger.warning("vllm_admission: auto admission leaves out %s here (%s)",
                           ", ".join(dropped), "; ".join(reasons))
        admissions = tuple(name for name in admissions if not problems[name])
    for name in admissions:
        _check_supported(facts, name)
    unmodelled = facts.unmodelled_key_problems
    if config.eviction == AUTO and unmodelled and any(
            eviction_class(e).needs_keys for e in evictions):
        dropped = [e for e in evictions if eviction_class(e).needs_keys]
        evictions = tuple(e for e in evictions if e not in dropped)
        logger.warning("vllm_admission: auto eviction leaves out %s here (%s)",
                       ", ".join(dropped), "; ".join(unmodelled))
    for name in evictions:
        if eviction_class(name).needs_keys and unmodelled:
            valid = ", ".join(n for n in engine_eviction_policies()
                              if not eviction_class(n).needs_keys)
            raise SettingsError(
                f"{env_name('eviction')}={name} cannot run with "
                f"{'; '.join(unmodelled)} (valid here: {valid})")
    plan = RunPlan.of(admissions, evictions, adaptive=adaptive, alpha=config.alpha,
                      checkpoint=config.checkpoint)
    if plan.needs_flops and facts.flop_model_error is not None and not scores_by_tokens(plan):
        flop_users = [e for e in plan.evictions if eviction_class(e).needs_values]
        valid = ", ".join(n for n in engine_eviction_policies()
                          if not eviction_class(n).needs_values)
        raise SettingsError(
            f"{env_name('eviction')}={flop_users[0] if flop_users else config.eviction} needs "
            f"a FLOP model of this architecture: {facts.flop_model_error} (valid here: {valid})")
    return plan


def scores_by_tokens(plan: RunPlan) -> bool:
    """Whether ``plan`` can run without a FLOP model, ``auto`` scoring its candidates by
    prompt tokens saved (:func:`prefill_tokens`): no tuner and no candidate that
    values blocks by FLOPs."""
    return plan.adaptive and not plan.reads_values and not plan.tuned


def prefill_tokens(end: int, start: int) -> float:
    """The tokens computed to prefill ``[start, end)``: ``auto``'s score unit on an
    architecture without a FLOP model (``end - start``; a module-level function, so
    it pickles for the shadow process)."""
    return float(end - start)


def preflight(vllm_config: Any, config: Settings) -> None:
    """Refuse, before the model loads, a setting the engine ``vllm_config``
    describes cannot run: :func:`plan_for` on :meth:`EngineFacts.from_vllm_config`,
    and the ``inpass`` mode's checks that need only the config. Nothing for a
    model without recurrent layers or with prefix caching off (the plugin then
    stays out of the way). The scheduler checks again with the live engine.

    Raises:
        SettingsError: one line naming the setting and what is in the way.
    """
    if not (vllm_config.cache_config.enable_prefix_caching
            and getattr(vllm_config.model_config, "is_hybrid", False)):
        return
    facts = EngineFacts.from_vllm_config(vllm_config)
    plan_for(config, facts)
    if config.checkpoint == "inpass":
        _refuse_inpass(inpass.inpass_problems(vllm_config) + list(facts.key_problems))


def _refuse_inpass(problems: list[str]) -> None:
    if problems:
        raise SettingsError(
            f"{env_name('checkpoint')}=inpass cannot run with {'; '.join(problems)} "
            f"(valid here: split; valid values: {', '.join(CHECKPOINT_MODES)})")


class EngineSetup:
    """Start-up checks and decisions of the ``AdmissionScheduler`` (module docstring).

    Every method is named ``_admission_*`` so that none can clash with vLLM's own.
    """

    if TYPE_CHECKING:
        # What the methods read of the vLLM ``Scheduler`` this is mixed into (set by its
        # ``__init__``, vLLM 0.32 ``v1/core/sched/scheduler.py``), and what they set.
        vllm_config: VllmConfig
        scheduler_config: SchedulerConfig
        cache_config: CacheConfig
        kv_cache_config: KVCacheConfig
        kv_cache_manager: KVCacheManager
        block_size: int
        hash_block_size: int
        use_eagle_block_drop: bool
        num_spec_tokens: int
        #: ``inpass`` mode's per-request capture plans (``None``: ``split`` mode).
        _admission_inpass: dict[str, tuple[int, list[int]]] | None

    def _admission_facts(self) -> EngineFacts:
        """The :class:`EngineFacts` of this engine, from its live objects."""
        kinds = group_kinds(self.kv_cache_manager.coordinator.single_type_managers)
        return EngineFacts(
            mamba_cache_mode=str(self.cache_config.mamba_cache_mode),
            eagle=self._admission_eagle(),
            speculative_method=(None if self.vllm_config.speculative_config is None
                                else str(self.vllm_config.speculative_config.method)),
            key_problems=tuple(self._admission_key_problems()),
            unsupported_group_kinds=tuple(k for k in kinds if k not in (STATE, *PER_TOKEN_KINDS)),
            flop_model_error=_cost_model(self.vllm_config.model_config.hf_config)[1])

    def _admission_eagle(self) -> bool:
        """Whether the engine runs EAGLE/MTP speculative decoding (vLLM drops the last
        matched block and keeps EAGLE groups, ``kv_cache_coordinator.py``)."""
        return bool(self.use_eagle_block_drop or self.kv_cache_manager.coordinator.eagle_group_ids)

    def _admission_plan(self, config: Settings) -> RunPlan:
        """:func:`plan_for` this engine (its :meth:`_admission_facts`).

        Raises:
            SettingsError: a setting this engine cannot run (one line).
        """
        plan = plan_for(config, self._admission_facts())
        if config.alpha is not None and not any(eviction_class(e).tunable
                                                for e in plan.evictions):
            logger.warning("vllm_admission: %s=%g has no effect: no eviction "
                           "policy this engine may run (%s) has an alpha (flop has one)",
                           env_name("alpha"), config.alpha, ", ".join(plan.evictions))
        return plan

    def _admission_inert_reason(self) -> str | None:
        if not self.cache_config.enable_prefix_caching:
            return "prefix caching is off"
        kinds = group_kinds(self.kv_cache_manager.coordinator.single_type_managers)
        if STATE not in kinds:
            return "the model has no recurrent (Mamba/GDN) layers"
        if all(k == STATE for k in kinds):
            return "the model has no attention layers"
        return None

    def _admission_geometry(self, config: Settings) -> CacheLayout:
        kinds = group_kinds(self.kv_cache_manager.coordinator.single_type_managers)
        groups = self.kv_cache_config.kv_cache_groups
        bytes_per_block = max(g.kv_cache_spec.page_size_bytes * len(g.layer_names) for g in groups)
        host_chunks, host_policy = host_tier(self)
        spec = int(self.num_spec_tokens or 0)
        if host_chunks and (spec or self.hash_block_size != self.block_size
                            or host_policy not in host_policy_names()):
            # The core models a host tier without these: auto's shadows run without it.
            logger.warning("vllm_admission: the host tier (%d chunks) is left out of the "
                           "policy replays: they model it without speculative decoding, with "
                           "whole-block hashes and the host policies %s", host_chunks,
                           ", ".join(host_policy_names()))
            host_chunks = 0
        host_admission = config.host_admission
        if host_admission is not None and not host_chunks:
            logger.warning("vllm_admission: %s=%s does nothing: "
                           "there is no host tier (vLLM's OffloadingConnector) the policy "
                           "replays model", env_name("host_admission"), host_admission)
            host_admission = None
        return CacheLayout(
            pool=PoolSpec(num_blocks=self.kv_cache_config.num_blocks, block_size=self.block_size,
                          group_kinds=kinds, bytes_per_block=int(bytes_per_block),
                          hash_block_size=self.hash_block_size,
                          retention_interval=self.cache_config.prefix_cache_retention_interval),
            scheduling=SchedulingSpec(
                chunk_size=int(self.scheduler_config.max_num_batched_tokens),
                checkpoint=config.checkpoint,
                prompt_end_export=self._admission_vllm_exports_checkpoint(),
                async_scheduling=bool(self.scheduler_config.async_scheduling)),
            speculation=SpeculationSpec(num_speculative_tokens=spec, eagle=self._admission_eagle()),
            host=HostTierSpec(chunks=host_chunks, policy=host_policy or "lru",
                              admission=host_admission))

    def _admission_log_smallest_prefix(self, geometry: CacheLayout) -> None:
        """Log the shortest prefix that can hit, per KV cache group; warn when a
        prompt must be longer than a quarter of ``max_model_len`` to hit at all."""
        coordinator = self.kv_cache_manager.coordinator
        prefix, per_group = smallest_cacheable_prefix(
            coordinator.single_type_managers, scheduler_block_size=self.block_size,
            hash_block_size=self.hash_block_size,
            partial_hash_hits=bool(getattr(coordinator, "enable_partial_hash_hits", False)))
        groups = " ".join(f"{k}{g}={n}" for g, (k, n) in enumerate(zip(geometry.pool.group_kinds,
                                                                        per_group, strict=True)))
        logger.info("vllm_admission: smallest cacheable prefix: %d tokens (per KV cache group: "
                    "%s; a hit ends where every group can reuse a block), so only prompts of "
                    "%d tokens or more can hit (vLLM recomputes at least the last prompt token)",
                    prefix, groups, prefix + 1)
        max_model_len = int(self.vllm_config.model_config.max_model_len)
        if 4 * (prefix + 1) > max_model_len:
            logger.warning("vllm_admission: prompts shorter than %d tokens never hit the prefix "
                           "cache, more than a quarter of max_model_len=%d", prefix + 1,
                           max_model_len)

    def _admission_check_supported(self, policy: str) -> None:
        """Refuse admission ``policy`` where this engine cannot run it (one line)."""
        _check_supported(self._admission_facts(), policy)

    def _admission_key_problems(self) -> list[str]:
        """Engine features under which a block's hash is not one full block's,
        given once by ``BlockPool.cache_full_blocks`` (partial entries, Mamba
        speculative blocks): the core's cache model has one key per block.

        vLLM's own one-checkpoint-per-prefill export
        (:meth:`_admission_vllm_exports_checkpoint`) is not among them: with
        hash and group block sizes equal to the scheduler's (checked here) the
        exported state sits at a block boundary, in the block of that position,
        and gets that block's full-block hash in ``cache_full_blocks`` like any
        other state (the policy's mask decides whether it does).
        """
        problems = []
        partial = bool(getattr(self.kv_cache_manager.coordinator, "enable_partial_hash_hits",
                               False))
        if any(g.kv_cache_spec.block_size != self.block_size
               for g in self.kv_cache_config.kv_cache_groups):
            problems.append(BLOCK_SIZES_PROBLEM)
        elif self.hash_block_size != self.block_size:
            problems.append(HASH_UNIT_PROBLEM if partial
                            else "a hash block size below the block size without partial hits")
        if partial:
            problems.append("partial hash hits")
            if self._admission_vllm_exports_checkpoint():
                problems.append("vLLM's prefill checkpoint export with sub-block hash keys")
        for g in self.kv_cache_config.kv_cache_groups:
            spec = g.kv_cache_spec
            if isinstance(spec, MambaSpec) and spec.num_speculative_blocks:
                problems.append(SPECULATIVE_PROBLEM)
                break
        return problems

    def _admission_vllm_exports_checkpoint(self) -> bool:
        """Whether vLLM writes the prompt-end state from inside the last prefill chunk
        (:func:`~vllm_admission.plugin.kv_cache.exports_prompt_end_state`). The plugin
        takes the exported state as the prompt-end (``last``) checkpoint: the admission
        policy decides whether its block keeps a hash, exactly as for a state written at a
        chunk end; the policy's other checkpoints still end chunks."""
        return exports_prompt_end_state(self.kv_cache_config, self.cache_config)

    def _admission_prefill_cost(self, plan: RunPlan) -> Callable[[int, int], float]:
        """The prefill cost ``f(end, start)`` the plan's tuner, values or ``auto``
        scores read: the model's FLOPs, or tokens (:func:`prefill_tokens`) for
        ``auto`` on an architecture the cost model does not know (one warning;
        :func:`plan_for` has refused the plans that need FLOPs)."""
        from vllm_admission.core.costs import ModelConfigError, ModelCosts

        try:
            return ModelCosts.from_config(
                self.vllm_config.model_config.hf_config.to_dict()).prefill_flops
        except ModelConfigError as exc:
            logger.warning("vllm_admission: no FLOP model of this architecture (%s); auto scores "
                           "its candidates by prompt tokens saved instead of prefill FLOPs", exc)
            return prefill_tokens

    def _admission_setup_inpass(self) -> None:
        """Check that ``inpass`` can run here and install its runner hooks.

        Raises:
            SettingsError: one line naming what is in the way and the
                valid values.
        """
        problems = inpass.inpass_problems(self.vllm_config)
        problems += inpass.state_layer_problems(
            g.kv_cache_spec for g in self.kv_cache_config.kv_cache_groups)
        problems += self._admission_key_problems()
        if self._admission_vllm_exports_checkpoint():
            # Both would write states into the checkpoint columns of one step.
            problems.append("vLLM's own prefill checkpoint export "
                            "(num_prefill_checkpoint_blocks)")
        _refuse_inpass(problems)
        hooks.install_inpass_runner()
        self._admission_inpass = {}
