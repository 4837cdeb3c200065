"""One registry type for both kinds of policy: name -> class, and the entry points of other
packages loaded when a front end asks; and :class:`PolicyClass`, what every registered class
declares.

:data:`~vllm_admission.core.admission.ADMISSION_POLICIES` and
:data:`~vllm_admission.core.eviction.registry.EVICTION_POLICIES` are :class:`PolicyRegistry`
objects. Importing the package registers the built-in policies only; the classes other
installed packages declare in a registry's entry-point group are registered by
:meth:`PolicyRegistry.load_entry_points`, which the front ends call
(:func:`vllm_admission.core.policies.load_policy_plugins`: the CLI, the plugin's settings,
the tests), as pytest and pluggy load theirs (``load_setuptools_entrypoints``), and which a
lookup of an unknown name calls before it gives up, so a policy from another package runs
through the Python API too without an import-time scan.

Two rules hold for the declarations of both kinds (:class:`PolicyClass`). **Own
declarations** are not inherited: a class states them in its body or has them off, so a
subclass registered under a new name claims neither its parent's identity (vLLM's own
behaviour) nor a place in ``auto``. **Derived flags** are computed from the hooks a class
overrides (:func:`overrides`), never declared by hand, so a flag and the code it describes
cannot disagree.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, Generic, TypeVar

from vllm_admission.core.errors import UserError

__all__ = ["PolicyClass", "PolicyRegistry", "UnknownPolicyError", "overrides"]

P = TypeVar("P")

_log = logging.getLogger("vllm_admission")


class PolicyClass:
    """The declarations shared by :class:`~vllm_admission.core.admission.AdmissionPolicy` and
    :class:`~vllm_admission.core.eviction.EvictionPolicy`.

    A subclass lists its kind's own declarations in :attr:`OWN_DECLARATIONS`; each one a
    class does not state in its own body is set to ``False`` when the class is created.
    """

    #: Registry name: the CLI word and the value of ``VLLM_ADMISSION_POLICY`` (admission)
    #: or ``VLLM_ADMISSION_EVICTION`` (eviction).
    name: ClassVar[str]
    #: One line for ``--help`` and the docs.
    summary: ClassVar[str]
    #: Declared: whether ``auto`` chooses among this policy (off unless declared).
    auto_candidate: ClassVar[bool] = False
    #: The declarations a class states for itself (not inherited).
    OWN_DECLARATIONS: ClassVar[tuple[str, ...]] = ("auto_candidate",)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for attr in cls.OWN_DECLARATIONS:
            if attr not in cls.__dict__:
                setattr(cls, attr, False)


def overrides(cls: type, base: type, hook: str) -> bool:
    """Whether ``cls`` (or a class between it and ``base``) overrides ``base``'s ``hook``:
    the attribute found on ``cls`` without running descriptors is not ``base``'s own."""
    return inspect.getattr_static(cls, hook) is not inspect.getattr_static(base, hook)


class UnknownPolicyError(UserError):
    """A policy name that is not registered; the message lists the valid ones."""


class PolicyRegistry(Mapping[str, type[P]], Generic[P]):
    """Registered policy classes of one kind, by name, in registration order.

    A read-only mapping (``in``, iteration, ``[name]``, ``items()``) over what is
    registered now; :meth:`register` adds, :meth:`load_entry_points` adds what other
    packages declare, :meth:`policy_class` looks a name up for a user.

    Args:
        kind: ``"admission"`` or ``"eviction"`` (in messages).
        base: the class every policy of this kind subclasses.
        group: the entry-point group other packages declare policies in
            (``[project.entry-points."<group>"]``: ``name = "package.module:Class"``).
        check: more checks of a class being registered, raising ``TypeError`` or
            ``ValueError`` with a one-line reason.
    """

    # ``base`` is ``type``, not ``type[P]``: it is the abstract base class, which mypy
    # accepts for ``type[P]`` only when concrete.
    def __init__(self, kind: str, base: type, group: str,
                 check: Callable[[type[P]], None] | None = None) -> None:
        self.kind = kind
        self.base = base
        self.group = group
        self._check = check
        self._classes: dict[str, type[P]] = {}
        self._entry_points_loaded = False

    # -- Mapping -------------------------------------------------------------
    def __getitem__(self, name: str) -> type[P]:
        return self._classes[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._classes)

    def __len__(self) -> int:
        return len(self._classes)

    def __repr__(self) -> str:
        return f"PolicyRegistry({self.kind!r}, {list(self._classes)})"

    # -- registration ----------------------------------------------------------
    def register(self, cls: type[P]) -> type[P]:
        """Add ``cls`` under ``cls.name``, after the policies registered so far.
        Registering the same class again under its name is a no-op.

        Returns:
            ``cls`` (usable as a class decorator).

        Raises:
            TypeError: not a concrete subclass of the registry's base class with the
                class attributes ``name`` and ``summary`` (strings), or what the
                registry's own check refuses.
            ValueError: the name is taken, or what the registry's own check refuses.
        """
        if not (isinstance(cls, type) and issubclass(cls, self.base)) or inspect.isabstract(cls):
            raise TypeError(f"{cls!r} is not a concrete {self.base.__name__} subclass")
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name or not isinstance(getattr(cls, "summary", None), str):
            raise TypeError(f"{cls.__name__} must set the class attributes name and summary")
        if self._classes.get(name) is cls:
            return cls
        if name in self._classes:
            raise ValueError(f"{self.kind} policy {name!r} is already registered")
        if self._check is not None:
            self._check(cls)
        self._classes[name] = cls
        return cls

    def register_all(self, *classes: type[P]) -> None:
        """:meth:`register` each of ``classes``, in order."""
        for cls in classes:
            self.register(cls)

    def only(self, declaration: str, what: str) -> str:
        """The name of the one registered class whose class attribute ``declaration`` is
        true (``vllm_native``, ``vllm_order``: the policy stock vLLM runs).

        Raises:
            LookupError: not exactly one registered class declares it; the message reads
                "expected one <kind> policy <what>, found <names>".
        """
        names = [n for n, c in self._classes.items() if getattr(c, declaration)]
        if len(names) != 1:
            raise LookupError(f"expected one {self.kind} policy {what}, found {names}")
        return names[0]

    def load_entry_points(self) -> list[str]:
        """Register every class the installed packages declare in the registry's
        entry-point group (once per process; later calls return ``[]``). An entry that
        fails to import or to register is left out with one warning naming it, its
        package and the reason; an entry's name must be its class's ``name``.

        Returns:
            The names registered by this call.
        """
        if self._entry_points_loaded:
            return []
        self._entry_points_loaded = True
        from importlib.metadata import entry_points

        added = []
        for ep in entry_points(group=self.group):
            where = f"{ep.value} ({ep.dist.name if ep.dist else 'unknown package'})"
            try:
                cls = ep.load()
                if getattr(cls, "name", None) != ep.name:
                    raise ValueError(f"the entry is named {ep.name!r}, the class "
                                     f"{getattr(cls, 'name', None)!r}")
                self.register(cls)
            except Exception as exc:  # noqa: BLE001 - another package's fault, said in one line
                _log.warning("vllm_admission: policy entry point %s = %s left out: %s: %s",
                             ep.name, where, type(exc).__name__, exc)
                continue
            added.append(ep.name)
        return added

    def policy_class(self, name: str) -> type[P]:
        """The class registered under ``name``; an unknown name first loads the entry
        points (once), then raises.

        Raises:
            UnknownPolicyError: ``name`` is registered nowhere; the message lists the
                valid names.
        """
        if name not in self._classes:
            self.load_entry_points()
        try:
            return self._classes[name]
        except KeyError:
            valid = ", ".join(self._classes)
            raise UnknownPolicyError(f"unknown {self.kind} policy {name!r}; valid: {valid}") from None
