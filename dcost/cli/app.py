"""The ``dcost`` command line: one entry point, one module per subcommand.

Every subcommand module has ``add_parsers(subparsers)``; a handler returns the exit code. A bad
argument or value prints one line and exits with code 2.
"""

from __future__ import annotations

import argparse
import sys

from dcost.cli import calibrate, evaluate, presets, search, training
from dcost.cli.common import Parser

__all__ = ["main", "build_parser"]

_SUBCOMMANDS = (presets, evaluate, training, search, calibrate)


def build_parser() -> argparse.ArgumentParser:
    """The ``dcost`` parser with every subcommand registered."""
    parser = Parser(prog="dcost", description="Cost models of LLM serving and training.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in _SUBCOMMANDS:
        module.add_parsers(sub)
    return parser


def main(argv=None) -> int:
    """Run the CLI; returns the exit code (0 ok, 2 bad argument or value)."""
    parser = build_parser()
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
