"""The ``dcost`` command line: one entry point, one module per subcommand.

Every subcommand module has ``add_parsers(subparsers)``; a handler returns the exit code. A bad
argument or value prints one line and exits with code 2. Only the module of the subcommand asked
for is imported (``dcost eval`` does not import the searches and Optax); ``dcost --help`` and an
unknown subcommand import them all.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from typing import NoReturn

from dcost.cli.common import Parser

__all__ = ["main", "run", "build_parser"]

# subcommand -> the module in dcost.cli that registers it, in the order `dcost --help` lists them
_SUBCOMMANDS = {
    "presets": "presets",
    "eval": "evaluate",
    "train": "training",
    "lifetime": "training",
    "optimize": "search",
    "grid": "search",
    "plan": "plan",
    "calibrate": "calibrate",
    "warmup": "warmup",
    "validate": "validate",
    "measurements": "measurements",
    "engines": "engines",
    "simulate": "simulate",
    "serve": "serve",
    "daemon": "daemon",
}


def _modules(argv) -> list[str]:
    """The modules to register: the named subcommand's alone, else all of them."""
    first = next((a for a in argv if not a.startswith("-")), None) if argv is not None else None
    if first in _SUBCOMMANDS and not {"-h", "--help"} & set(argv[: argv.index(first)]):
        return [_SUBCOMMANDS[first]]
    return list(dict.fromkeys(_SUBCOMMANDS.values()))


def build_parser(argv=None) -> argparse.ArgumentParser:
    """The ``dcost`` parser: every subcommand, or only the one ``argv`` names."""
    parser = Parser(prog="dcost", description="Cost models of LLM serving and training.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name in _modules(argv):
        importlib.import_module(f"dcost.cli.{name}").add_parsers(sub)
    return parser


def main(argv=None) -> int:
    """Run the CLI; returns the exit code (0 ok, 2 bad argument or value)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
    except (ValueError, KeyError) as err:  # bad values found past parsing: one line, exit 2
        msg = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"dcost: error: {msg}", file=sys.stderr)
        return 2


def run(argv=None) -> NoReturn:
    """The console script (``dcost``, ``python -m dcost``): ``main``, then the process ends at
    once with its exit code (``os._exit``), stdout and stderr flushed first.

    A normal interpreter exit tears JAX's runtime down (the loaded executables, their thread
    pools), which took 0.25-0.3 s of a 1.5 s warm ``dcost optimize`` on 2 cores, for nothing:
    every file dcost writes (stored programs, JAX's cache, figures, tables) is written and closed
    before ``main`` returns. An exception leaves the usual way (traceback, normal exit); ``main``
    itself, called in process (tests, ``dcost warmup``), returns as before.

    The objects the imports made (JAX's, equinox's, dcost's modules) are moved out of the cyclic
    collector's sight first (``gc.freeze``): they live as long as the process, and scanning them
    again at every full collection cost 0.05-0.1 s of a 0.9 s warm ``dcost optimize``.
    """
    gc.freeze()
    code = main(argv)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more to say
            pass
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
