"""Variants of the ``mix`` eviction (``core/eviction/mix.py``), run by ``vllm-admission simulate``.

Each variant is the same class with other options, registered under a name of its own for
this process only (the simulator's CLI takes policy names, not options), so that one sweep
runs them beside the registered policies::

    PYTHONPATH=. python simulations/mix_variants.py --trace T --model M \\
        --capacity 32GiB,64GiB --admission vllm,last \\
        --eviction lru,mix,mix-lru-reuse --out /tmp/mix --no-progress

Names (``docs/results.md`` section 3.4 reports them):

* ``mix-random``, ``mix-heaviest``: LeCaR's experts, the expert drawn at random (seeded) /
  always the heaviest one, instead of the default smooth round robin;
* ``mix-adaptive``: LeCaR's experts with Cacheus's adaptive learning rate;
* ``mix-lr01``, ``mix-lr09``: learning rate 0.1 / 0.9;
* ``mix-lru-reuse``, ``mix-lru-s3fifo``, ``mix-reuse-s3fifo``, ``mix-lru-lfu-reuse``,
  ``mix-all``: other experts (``all``: ``lru``, ``lfu``, ``reuse``, ``s3fifo``);
* ``mix-g4``, ``mix-reuse-s3fifo-g4``: ghost histories 4x the cache (LeCaR: 1x);
* ``mix-floor``, ``mix-reuse-s3fifo-floor``: no weight below 0.05 (LeCaR: none);
* ``mix-lru-s3fifo-adaptive``, ``mix-reuse-s3fifo-adaptive``: those, adaptive.

``--auto-with NAME`` (before the simulate options) adds eviction ``NAME`` to ``auto``'s
candidates for this process (``core.adaptive.AUTO_EVICTIONS``), to measure whether it earns a
place there (``auto_candidate``)::

    PYTHONPATH=. python simulations/mix_variants.py --auto-with mix --trace T --model M \
        --capacity 32GiB --admission auto --eviction auto --out /tmp/auto-mix

The variants exist in this process and the workers it forks (``--jobs`` on Linux).
"""

from __future__ import annotations

import sys

from vllm_admission.cli import main
from vllm_admission.core.eviction import ExpertMixEviction, register_eviction

VARIANTS: dict[str, dict] = {
    "mix-random": {"choice": "random"},
    "mix-heaviest": {"choice": "heaviest"},
    "mix-adaptive": {"adaptive": True},
    "mix-lr01": {"learning_rate": 0.1},
    "mix-lr09": {"learning_rate": 0.9},
    "mix-lru-reuse": {"experts": ("lru", "reuse")},
    "mix-lru-s3fifo": {"experts": ("lru", "s3fifo")},
    "mix-reuse-s3fifo": {"experts": ("reuse", "s3fifo")},
    "mix-lru-lfu-reuse": {"experts": ("lru", "lfu", "reuse")},
    "mix-all": {"experts": ("lru", "lfu", "reuse", "s3fifo")},
    "mix-g4": {"ghost_factor": 4.0},
    "mix-floor": {"min_weight": 0.05},
    "mix-reuse-s3fifo-floor": {"experts": ("reuse", "s3fifo"), "min_weight": 0.05},
    "mix-reuse-s3fifo-g4": {"experts": ("reuse", "s3fifo"), "ghost_factor": 4.0},
    "mix-lru-s3fifo-adaptive": {"experts": ("lru", "s3fifo"), "adaptive": True},
    "mix-reuse-s3fifo-adaptive": {"experts": ("reuse", "s3fifo"), "adaptive": True},
}


def variant(name: str, options: dict) -> type[ExpertMixEviction]:
    """``ExpertMixEviction`` with ``options`` as defaults, named ``name``."""
    def __init__(self, **kw):
        ExpertMixEviction.__init__(self, **{**options, **kw})
    return type(f"Mix_{name.replace('-', '_')}", (ExpertMixEviction,),
                {"name": name, "summary": f"mix with {options}", "__init__": __init__})


def register_variants() -> None:
    """Register every variant (once per process)."""
    for name, options in VARIANTS.items():
        register_eviction(variant(name, options))


def add_auto_candidate(name: str) -> None:
    """Make eviction ``name`` one of ``auto``'s candidates in this process."""
    from vllm_admission.core import adaptive

    if name not in adaptive.AUTO_EVICTIONS:
        adaptive.AUTO_EVICTIONS = (*adaptive.AUTO_EVICTIONS, name)


if __name__ == "__main__":
    register_variants()
    argv = sys.argv[1:]
    if argv[:1] == ["--auto-with"]:
        add_auto_candidate(argv[1])
        argv = argv[2:]
    sys.exit(main(["simulate", *argv]))
