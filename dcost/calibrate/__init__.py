"""Calibration of the cost model against measurements.

``local``: micro-benchmarks of this machine (F, BW) and a real decode step of a toy transformer,
compared with ``dcost.decode`` (the ``dcost calibrate`` subcommand).
"""
