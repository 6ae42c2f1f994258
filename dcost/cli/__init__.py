"""The ``dcost`` command line (``dcost.cli.app.main``); one module per subcommand."""

from dcost.cli.app import main, run

__all__ = ["main", "run"]
