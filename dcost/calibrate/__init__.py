"""Calibration of the cost model against measurements.

``local``: micro-benchmarks of this machine (F, BW) and a real decode step of a toy transformer,
compared with ``dcost.decode`` (the ``dcost calibrate`` subcommand). ``kernels``, ``host`` and
``engines``: the shipped engine profiles, rebuilt from AIConfigurator's kernel tables
(``dcost calibrate --from-aiconfigurator``). ``user``: an engine profile fitted to your own
measurements (``dcost.calibrate.fit``).
"""


def __getattr__(name):
    if name in ("fit", "calibrate", "Calibration"):
        from dcost.calibrate import user

        return getattr(user, name)
    raise AttributeError(f"module 'dcost.calibrate' has no attribute {name!r}")
