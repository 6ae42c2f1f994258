"""The serving cost model: one decode or prefill step, term by term.

``roofline`` (the step and its closed forms), ``moe`` (experts touched, all-to-all), ``pipeline``
(stage hops and latency), ``queueing`` (batch departures, simulated). The public names are
re-exported by ``dcost``; import the modules for the pieces.
"""
