"""Published timings of collective kernels, and what dcost's all-to-all term predicts for them.

The serving records (``records.toml``) time whole steps, where a collective's time is mixed with
every other term of the step. The kernels timed alone pin the collective term by itself:
``collectives.toml`` holds one ``[[measurement]]`` per timed MoE dispatch or combine (DeepEP's
low-latency kernels on H800, 8 to 256 ranks), and ``predict`` evaluates
``dcost.serving.moe.all_to_all_time`` for it.

One direction of an all-to-all is half of the term's per-layer pair (``moe_layers = 1/2``): each
of the ``n`` tokens on each of ``G`` ranks sends ``k`` copies of ``d`` values of ``b`` bytes, a
copy for a rank of the sender's scale-up domain over the scale-up link and any other over the
scale-out link, both links at once:

.. math::
    V = n k d b \\tfrac{G-1}{G}, \\quad s = \\frac{\\min(G, S) - 1}{G - 1}

    t = \\max\\Big(m_{up}\\alpha_{up} + \\frac{V s}{U\\eta_{up}},\\
                   m_{out}\\alpha_{out} + \\frac{V (1-s)}{O\\eta_{out}}\\Big)

(``all_to_all_time`` with ``dedup = 0``: the low-latency kernels send each copy straight to its
expert's rank). Pure physics (peak links, no latency) is a lower bound on every measured time;
``fit_links`` fits the four link fields (``scaleup_efficiency``, ``scaleout_efficiency``,
``scaleup_latency``, ``scaleout_latency``) to measured kernels by least squares on log time.

References: DeepEP (DeepSeek-AI, 2025), README "Low-latency kernels with pure RDMA"; the
alpha-beta model of collectives (Thakur et al., IJHPCA 2005).

>>> ms = load()
>>> len(ms), sorted({m["op"] for m in ms})
(12, ['combine', 'dispatch'])
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from importlib import resources

import numpy as np

__all__ = ["LINK_FIELDS", "OPS", "load", "check", "predict", "with_links", "fit_links", "summary"]

OPS = ("dispatch", "combine")
"""The timed kernels: the MoE all-to-all's two directions."""
LINK_FIELDS = ("scaleup_efficiency", "scaleout_efficiency", "scaleup_latency", "scaleout_latency")
"""The ``Hardware`` fields ``fit_links`` fits (fractions, seconds)."""
_TEXT = ("id", "source_id", "source", "quote", "hardware", "family", "model")


def load() -> list[dict]:
    """The shipped collective-kernel measurements (``collectives.toml``), in file order."""
    text = resources.files(__package__).joinpath("collectives.toml").read_text(encoding="utf-8")
    return tomllib.loads(text).get("measurement", [])


def _fail(m: Mapping, field: str, allowed: str):
    raise ValueError(
        f"collective measurement {m.get('id', '<no id>')!r}: field {field!r} = "
        f"{m.get(field)!r}; {allowed}"
    )


def check(m: Mapping) -> None:
    """Raise ``ValueError`` naming the measurement, the field, its value and what is allowed if
    ``m`` breaks the schema (text fields non-empty, ``op`` one of ``OPS``, ``ranks`` an integer
    >= 2, ``tokens_per_rank`` a positive integer, ``bytes_per_value`` and ``value`` positive,
    ``dedup`` in [0, 1])."""
    for field in _TEXT:
        if not isinstance(m.get(field), str) or not m[field].strip():
            _fail(m, field, "must be a non-empty string")
    if m.get("op") not in OPS:
        _fail(m, "op", f"allowed: {', '.join(OPS)}")
    for field, low in (("ranks", 2), ("tokens_per_rank", 1)):
        v = m.get(field)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            _fail(m, field, f"must be an integer >= {low}")
    for field in ("bytes_per_value", "value"):
        v = m.get(field)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            _fail(m, field, "must be a positive number (bytes; seconds)")
    v = m.get("dedup")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
        _fail(m, "dedup", "must be a number in [0, 1]")


def _hardware(m: Mapping, calibrated: bool):
    from dcost import presets

    return presets.hardware(m["hardware"], calibrated=calibrated)


def _inputs(measurements: Sequence[Mapping]):
    """``(model, tokens, ranks, bytes_per_value, dedup)`` of the measurements: the model preset
    they share (its ``d_model`` and ``experts_active``) and one array entry per measurement."""
    from dcost import presets

    models = {m["model"] for m in measurements}
    if len(models) != 1:
        raise ValueError(f"collective measurements: one model at a time, got {sorted(models)}")
    ranks = np.array([float(m["ranks"]) for m in measurements])
    return (
        presets.model(measurements[0]["model"]),
        ranks * np.array([float(m["tokens_per_rank"]) for m in measurements]),
        ranks,
        np.array([float(m["bytes_per_value"]) for m in measurements]),
        np.array([float(m["dedup"]) for m in measurements]),
    )


def _times(inputs, hardware):
    """Predicted seconds of every measurement (``_inputs``) on one chip's ``hardware``: one
    vmapped evaluation of ``all_to_all_time``, one direction (``moe_layers = 1/2``)."""
    import equinox as eqx
    import jax

    from dcost.serving.moe import all_to_all_time

    model, tokens, ranks, per_value, dedup = inputs

    def one(n, g, b, dd):
        net = eqx.tree_at(lambda x: x.act_bytes, model, b)
        return all_to_all_time(n, 0.5, g, hardware, net, dedup=dd)

    return jax.vmap(one)(tokens, ranks, per_value, dedup)


def with_links(hardware, links: Mapping[str, float]):
    """``hardware`` with the ``LINK_FIELDS`` set from ``links`` (SI units; other keys ignored)
    and log-depth all-to-all rounds (``tree_collectives = 1``, as the calibrated profiles)."""
    import equinox as eqx

    return eqx.tree_at(
        lambda x: tuple(getattr(x, f) for f in LINK_FIELDS) + (x.tree_collectives,),
        hardware,
        tuple(links[f] for f in LINK_FIELDS) + (1.0,),
        is_leaf=lambda x: x is None,
    )


def predict(
    measurements: Sequence[Mapping],
    calibrated: bool = False,
    links: Mapping[str, float] | None = None,
) -> np.ndarray:
    """dcost's time (s) for each measurement: ``all_to_all_time`` of one direction on the
    measurement's chip, pure physics (``calibrated=False``: peak links, no latency, a bound) or
    with the shipped profile of the chip's family (``calibrated=True``); ``links`` (e.g.
    ``fit_links``'s result) replaces the link fields (``with_links``).

    >>> ms = load()
    >>> bool(np.all(predict(ms) <= np.array([m["value"] for m in ms])))
    True
    """
    for m in measurements:
        check(m)
    chips = {m["hardware"] for m in measurements}
    if len(chips) != 1:
        raise ValueError(f"collective measurements: one chip at a time, got {sorted(chips)}")
    hardware = _hardware(measurements[0], calibrated)
    if links is not None:
        hardware = with_links(hardware, links)
    return np.asarray(_times(_inputs(measurements), hardware))


def fit_links(
    measurements: Sequence[Mapping], steps: int = 2000, learning_rate: float = 0.05
) -> dict[str, float]:
    """The four ``LINK_FIELDS`` that make ``all_to_all_time`` fit the measured kernels best:
    least squares of ``log t_pred - log t_measured`` over the measurements, with Adam (Optax)
    in unconstrained coordinates (logit of an efficiency, log of a latency), starting from
    efficiencies 0.8 and latencies 10 us, with log-depth rounds (``with_links``). A fit of the
    term's shape, in sample: judge it on measurements it did not see
    (``experiments/deepep_all_to_all.py`` leaves each ``ranks`` out in turn).

    Returns ``{field: value}`` (SI units) and ``"rms"``, the root mean square of the log errors.
    """
    import jax
    import jax.numpy as jnp
    import optax

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"fit_links: steps = {steps!r} must be a whole number >= 1")
    if not learning_rate > 0:
        raise ValueError(f"fit_links: learning_rate = {learning_rate!r} must be > 0")
    for m in measurements:
        check(m)
    base = _hardware(measurements[0], calibrated=False)
    inputs = _inputs(measurements)
    log_y = jnp.log(jnp.asarray([float(m["value"]) for m in measurements]))

    def links(z):
        return (jax.nn.sigmoid(z[0]), jax.nn.sigmoid(z[1]), jnp.exp(z[2]), jnp.exp(z[3]))

    def loss(z):
        h = with_links(base, dict(zip(LINK_FIELDS, links(z), strict=True)))
        return jnp.mean((jnp.log(_times(inputs, h)) - log_y) ** 2)

    opt = optax.adam(optax.cosine_decay_schedule(learning_rate, steps, alpha=0.01))
    z0 = jnp.asarray([np.log(4.0), np.log(4.0), np.log(1e-5), np.log(1e-5)])

    @jax.jit
    def run(z):
        def step(carry, _):
            z, state = carry
            grad = jax.grad(loss)(z)
            updates, state = opt.update(grad, state, z)
            return (optax.apply_updates(z, updates), state), None

        (z, _), _ = jax.lax.scan(step, (z, opt.init(z)), None, length=steps)
        return z, loss(z)

    z, final = run(z0)
    values = [float(v) for v in links(z)]
    return {**dict(zip(LINK_FIELDS, values, strict=True)), "rms": float(np.sqrt(float(final)))}


def summary(measurements: Sequence[Mapping] | None = None) -> dict:
    """How dcost's all-to-all term meets the measured kernels (default: the shipped ones), per
    chip: ``{hardware: {kernels, bound_holds, pure: {min, max}, calibrated: {min, max,
    median}}}``, each ratio predicted over measured time (``bound_holds``: the share of pure
    predictions at or below the measured time)."""
    ms = load() if measurements is None else list(measurements)
    out: dict = {}
    for chip in sorted({m["hardware"] for m in ms}):
        group = [m for m in ms if m["hardware"] == chip]
        y = np.array([float(m["value"]) for m in group])
        pure, cal = predict(group) / y, predict(group, calibrated=True) / y
        out[chip] = {
            "kernels": len(group),
            "bound_holds": float(np.mean(pure <= 1.0 + 1e-6)),
            "pure": {"min": float(pure.min()), "max": float(pure.max())},
            "calibrated": {
                "min": float(cal.min()),
                "max": float(cal.max()),
                "median": float(np.median(cal)),
            },
        }
    return out
