"""The ``vllm-admission`` command line.

Subcommands:

* ``simulate``: trace-replay sweeps over policies and capacities;
* ``demo``: ``simulate`` on the built-in synthetic workload and model;
* ``make-tiny-model`` / ``replay``: the real vLLM engine side (need vLLM);
* ``fidelity``: the same requests through the engine and the simulator,
  compared request by request (needs vLLM).

One module per subcommand family: :mod:`~vllm_admission.cli.simulate`,
:mod:`~vllm_admission.cli.replay`, :mod:`~vllm_admission.cli.fidelity`.

Bad input (unknown policy, impossible capacity, malformed trace, non-hybrid
model, a path that is missing or not allowed) ends with one
``vllm-admission: error: ...`` line and exit status 2: the errors of
:data:`USER_ERRORS`, whose base is :class:`~vllm_admission.core.errors.UserError`.
Any other exception is a bug, not the input's fault: it propagates with its
traceback (exit status 1), a plain ``ValueError`` from a broken internal
invariant included. Argparse's own usage errors keep their exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from vllm_admission.cli.fidelity import add_fidelity_parser, run_fidelity_cli
from vllm_admission.cli.replay import add_replay_parser, run_replay
from vllm_admission.cli.simulate import add_simulate_args, run_simulate
from vllm_admission.core.errors import UserError
from vllm_admission.core.policies import load_policy_plugins
from vllm_admission.sim.sweep import RayUnavailableError

log = logging.getLogger("vllm_admission")

#: What ``main`` prints as one ``vllm-admission: error:`` line (exit status 2): errors in
#: what the user gave (``UserError``: unknown policy, model config, capacity, trace, flag
#: values, ...), Ray missing for ``--executor ray``, and the OS errors of a path the user
#: named. Not bare ``ValueError`` or ``OSError``: those, like every other exception, keep
#: their traceback, so that a broken invariant is seen as the bug it is.
USER_ERRORS = (UserError, RayUnavailableError, FileNotFoundError, PermissionError,
               IsADirectoryError, NotADirectoryError)

#: The packages the engine side needs (vLLM and what it brings); a missing one is a
#: one-line error, not a traceback.
ENGINE_PACKAGES = ("vllm", "torch", "transformers", "safetensors", "tokenizers")

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-admission",
        description="Prefix-cache admission and eviction for hybrid models in vLLM: "
                    "simulate policies on traces, or run them in a real engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="replay a trace through the cache model for "
                                          "every (admission, eviction, capacity)")
    add_simulate_args(sim, demo=False)
    demo = sub.add_parser("demo", help="simulate the built-in synthetic workload on Qwen3-Next")
    add_simulate_args(demo, demo=True)

    from vllm_admission.engine.tiny_model import TINY_MODEL_ARCHS, TINY_MODEL_SIZES

    tiny = sub.add_parser("make-tiny-model",
                          help="write a small random-weight hybrid (Qwen3-Next GDN or Nemotron-H "
                               "Mamba2) that runs on CPU vLLM")
    tiny.add_argument("dir", help="output directory")
    tiny.add_argument("--arch", choices=TINY_MODEL_ARCHS, default=TINY_MODEL_ARCHS[0],
                      help="qwen3-next: Gated DeltaNet + attention (default); "
                           "nemotron-h: Mamba2 + attention + MLP")
    tiny.add_argument("--max-model-len", type=int, default=131072)
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--mtp", action="store_true",
                      help="also write one MTP layer (vLLM's speculative_config method 'mtp')")
    tiny.add_argument("--size", choices=TINY_MODEL_SIZES, default=TINY_MODEL_SIZES[0],
                      help="tiny: the smallest model that runs (default); bench: the same "
                           "cache geometry with enough compute per token that prefill "
                           "dominates time to first token (make bench-serve)")

    add_replay_parser(sub)
    add_fidelity_parser(sub)
    return parser


def _make_tiny_model(args: argparse.Namespace) -> int:
    from vllm_admission.engine.tiny_model import make_tiny_model

    path = make_tiny_model(args.dir, arch=args.arch, max_position_embeddings=args.max_model_len,
                           seed=args.seed, mtp=args.mtp, size=args.size)
    print(f"{args.size} {args.arch} hybrid model{' with an MTP layer' if args.mtp else ''} "
          f"in {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    load_policy_plugins()   # other packages' policies, before any name is listed or checked
    parser = build_parser()
    args = parser.parse_args(argv)
    handlers = {"simulate": run_simulate, "demo": run_simulate,
                "make-tiny-model": _make_tiny_model, "replay": run_replay,
                "fidelity": run_fidelity_cli}
    try:
        return handlers[args.command](args)
    except USER_ERRORS as exc:
        print(f"vllm-admission: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top not in ENGINE_PACKAGES:
            raise
        print(f"vllm-admission: error: '{args.command}' needs {top}, which is not installed "
              f"here (make install installs vLLM's CPU build with it; on a GPU machine: "
              f"pip install 'vllm>=0.32,<0.34')", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("vllm-admission: interrupted", file=sys.stderr)
        return 130
