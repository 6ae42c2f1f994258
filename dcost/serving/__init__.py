"""The serving cost model: one decode, prefill or mixed step, term by term.

``roofline`` (the step and its closed forms), ``moe`` (experts touched, imbalance, all-to-all),
``collectives`` (alpha-beta all-reduce, all-gather, reduce-scatter, all-to-all), ``attention`` (the
attention layout), ``speculative`` (draft tokens and acceptance), ``mixed`` (continuous batching
with chunked prefill, KV transfer), ``pipeline`` (stage hops and latency), ``queueing`` (batch
departures, simulated). The public names are re-exported by ``dcost``; import the modules for the
pieces. ``docs/serving_v2.md`` derives every term of version 2.
"""
