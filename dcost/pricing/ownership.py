"""The whole bill: owning chips instead of renting them, and owning against an API.

A chip bought for ``C`` dollars (GPU plus its share of the server, ``purchase_price +
server_price``) and paid off over ``n`` years at a cost of capital ``r`` costs, per hour,

    CRF(r, n)   = r / (1 - (1 + r)**-n)          # capital recovery factor (1/n at r = 0)
    capital     = C * CRF(r, n) / 8766           # $ per chip-hour (8766 hours in a year)
    hosting     = P_max/1000 * hosting_per_kw_month * 12 / 8766     # space and power provisioned
    electricity = P/1000 * PUE * electricity_price_per_kwh          # P: the chip's mean power (W)
    price_per_hour = capital + hosting + electricity

(the annuity, or capital recovery, formula: Brealey, Myers & Allen, *Principles of Corporate
Finance*, chapter 2, "annuities"; the equivalent annual cost of an asset). ``owned`` puts it in
place of ``Hardware.price_per_hour``, so every cost model, search and plan prices tokens by it;
``tco_per_token`` charges the electricity of the step's own power (``dcost.serving.power``);
``elasticities`` differentiates it with ``jax.grad``; ``breakeven`` finds the traffic at which a
fleet of owned replicas beats an API's published prices.
"""

from __future__ import annotations

from collections.abc import Mapping

import equinox as eqx
import jax
import jax.numpy as jnp

from dcost._types import FloatLeaf
from dcost.serving.power import energy, require_power
from dcost.serving.roofline import SECONDS_PER_HOUR, decode, prefill
from dcost.specs import Design, Hardware, Model, SpecError, Workload, _float, check, readable

__all__ = [
    "Ownership",
    "OwnershipCost",
    "HOURS_PER_YEAR",
    "capital_recovery_factor",
    "chip_hour_cost",
    "owned",
    "tco_per_token",
    "elasticities",
    "Breakeven",
    "breakeven",
    "ownership",
]

HOURS_PER_YEAR = 8766.0  # 365.25 days
_KW = 1000.0


class Ownership(eqx.Module):
    """What owning one chip costs (units as people state them; every field a float leaf).

    Attributes:
      purchase_price: $ per chip (the accelerator).
      server_price: $ per chip for the rest of its server and network (host, NICs, chassis,
        switches, installation).
      years: amortization period (years, > 0).
      cost_of_capital: annual rate ``r`` (fraction, 0 to 1).
      electricity_price_per_kwh: $ per kWh at the meter.
      pue: power usage effectiveness (facility power over IT power, >= 1).
      hosting_per_kw_month: $ per kW of provisioned IT power per month (space, cooling plant,
        power delivery), charged on the chip's ``max_power``.

    >>> o = Ownership(30000, 12000, 4, 0.08, 0.08, 1.3, 150)
    >>> float(o.years)
    4.0
    """

    purchase_price: FloatLeaf = eqx.field(converter=_float)
    server_price: FloatLeaf = eqx.field(converter=_float)
    years: FloatLeaf = eqx.field(converter=_float)
    cost_of_capital: FloatLeaf = eqx.field(converter=_float)
    electricity_price_per_kwh: FloatLeaf = eqx.field(converter=_float)
    pue: FloatLeaf = eqx.field(converter=_float)
    hosting_per_kw_month: FloatLeaf = eqx.field(converter=_float)

    def __check_init__(self):
        for name in ("purchase_price", "server_price", "electricity_price_per_kwh"):
            check("Ownership", name, getattr(self, name))
        check("Ownership", "hosting_per_kw_month", self.hosting_per_kw_month)
        check("Ownership", "years", self.years, low_open=True, high=100.0)
        check("Ownership", "cost_of_capital", self.cost_of_capital, high=1.0)
        check("Ownership", "pue", self.pue, low=1.0, high=10.0)

    __repr__ = readable


class OwnershipCost(eqx.Module):
    """$ per chip-hour of owning, by part (``chip_hour_cost``)."""

    capital: jax.Array
    hosting: jax.Array
    electricity: jax.Array
    total: jax.Array

    __repr__ = readable


def capital_recovery_factor(rate, years):
    """``CRF = r / (1 - (1 + r)^-n)``: the yearly payment that repays 1 dollar over ``n`` years at
    rate ``r``; ``1/n`` at ``r = 0`` (and its series ``1/n + r (n+1)/(2n)`` next to it, so the
    gradient is finite there).

    Args:
      rate: annual cost of capital ``r`` (fraction).
      years: periods ``n`` (years).

    >>> round(float(capital_recovery_factor(0.08, 4)), 6)
    0.301921
    >>> float(capital_recovery_factor(0.0, 4))
    0.25
    """
    small = rate < 1e-6
    r = jnp.where(small, 1.0, rate)
    exact = r / -jnp.expm1(-years * jnp.log1p(r))
    series = 1.0 / years + rate * (years + 1.0) / (2.0 * years)
    return jnp.where(small, series, exact)


def chip_hour_cost(own: Ownership, hardware: Hardware, power=None) -> OwnershipCost:
    """$ per chip-hour of owning ``hardware`` (module docstring).

    Args:
      own: the ownership inputs.
      hardware: a chip with ``max_power`` (W; hosting is provisioned on it).
      power: the chip's mean power (W) for the electricity; None: ``max_power`` (full load).

    >>> import dcost
    >>> c = chip_hour_cost(ownership("h100-sxm"), dcost.hardware("h100-sxm"))
    >>> 1.0 < float(c.total) < 3.0
    True
    """
    require_power(hardware, "chip_hour_cost")
    top = hardware.max_power
    assert top is not None
    watts = top if power is None else power
    capital = (
        (own.purchase_price + own.server_price)
        * capital_recovery_factor(own.cost_of_capital, own.years)
        / HOURS_PER_YEAR
    )
    hosting = top / _KW * own.hosting_per_kw_month * 12.0 / HOURS_PER_YEAR
    electricity = watts / _KW * own.pue * own.electricity_price_per_kwh
    return OwnershipCost(capital, hosting, electricity, capital + hosting + electricity)


def owned(hardware: Hardware, own: Ownership, power=None) -> Hardware:
    """``hardware`` with ``price_per_hour`` replaced by the cost of owning it
    (``chip_hour_cost(...).total``): every cost model, ``optimize`` and ``plan`` then count
    dollars of ownership. ``power`` as in ``chip_hour_cost`` (None: ``max_power``).

    >>> import dcost
    >>> h = owned(dcost.hardware("h100-sxm"), ownership("h100-sxm"))
    >>> float(h.price_per_hour) < float(dcost.hardware("h100-sxm").price_per_hour)
    True
    """
    price = chip_hour_cost(own, hardware, power).total
    return eqx.tree_at(lambda h: h.price_per_hour, hardware, price)


def tco_per_token(
    design: Design,
    hardware: Hardware,
    model: Model,
    workload: Workload,
    own: Ownership,
    smoothness=0.0,
):
    """$ per output token of an owned replica, electricity at the decode step's own power:
    ``P*G * (capital + hosting + P_chip/1000 * PUE * price_kWh) / 3600 / tokens_per_s``.

    >>> import dcost
    >>> t = tco_per_token(dcost.Design(batch=64), dcost.hardware("h100-sxm", calibrated=True),
    ...                   dcost.model("llama-3.1-8b"), dcost.Workload(1024), ownership("h100-sxm"))
    >>> 0.0 < float(t) * 1e6 < 1.0      # $ per million output tokens
    True
    """
    e = energy(design, hardware, model, workload, smoothness)
    r = decode(design, hardware, model, workload, smoothness)
    per_hour = chip_hour_cost(own, hardware, e.power_per_chip).total
    return design.chips_per_replica * per_hour / SECONDS_PER_HOUR / r.tokens_per_s


def elasticities(
    design: Design, hardware: Hardware, model: Model, workload: Workload, own: Ownership
) -> Ownership:
    """``d log(tco_per_token) / d log(field)`` for every field of ``own`` (an ``Ownership`` of
    elasticities, by ``jax.grad``): e.g. ``.electricity_price_per_kwh`` is the share of the bill
    that is electricity. At the optimal design of a ``tco`` problem these are the optimum's own
    sensitivities: no constraint depends on the ownership inputs, so the design's own move does not
    change the optimal cost to first order (envelope theorem).

    >>> import dcost
    >>> e = elasticities(dcost.Design(batch=64), dcost.hardware("h100-sxm", calibrated=True),
    ...                  dcost.model("llama-3.1-8b"), dcost.Workload(1024), ownership("h100-sxm"))
    >>> 0.0 < float(e.pue) < float(e.purchase_price) < 1.0
    True
    """

    def log_cost(o):
        return jnp.log(tco_per_token(design, hardware, model, workload, o))

    g = jax.grad(log_cost)(own)
    return jax.tree.map(lambda d, x: d * x, g, own)


class Breakeven(eqx.Module):
    """Owning against an API (``breakeven``).

    Attributes:
      traffic: output tokens/s from which one owned replica is cheaper than the API (inf: never).
      traffic_always: output tokens/s from which the owned fleet is always the cheaper: a new
        replica costs a whole one while its load is light, so just past ``k`` full replicas the
        API can win again until ``(k + 1) * traffic`` (inf: never).
      replica_capacity: output tokens/s one replica serves, prefill of the uncached prompt
        included.
      replica_cost_per_hour: $ per hour of one owned replica at full load.
      api_cost_per_output_token: the API's $ per output token, prompt tokens included.
      owned_cost_per_output_token: the full replica's $ per output token.
    """

    traffic: jax.Array
    traffic_always: jax.Array
    replica_capacity: jax.Array
    replica_cost_per_hour: jax.Array
    api_cost_per_output_token: jax.Array
    owned_cost_per_output_token: jax.Array

    __repr__ = readable


def breakeven(
    design: Design,
    hardware: Hardware,
    model: Model,
    workload: Workload,
    own: Ownership,
    prices: Mapping[str, float],
    cached_share=0.0,
) -> Breakeven:
    """The traffic at which owned replicas beat an API's prices.

    A replica's chips share their time between prefill of the uncached prompt and decode, so it
    serves ``X = 1 / (1/X_dec + (1 - h) (T_in/T_out) / X_pre)`` output tokens/s; the API charges
    ``p = p_out + (T_in/T_out) ((1 - h) p_in + h p_hit)`` per output token. A fleet for ``lambda``
    output tokens/s needs ``ceil(lambda/X)`` replicas of ``C`` $/hour, so owning is cheaper from
    ``lambda* = C / (3600 p)`` on when ``lambda* <= X`` (one replica pays for itself), and never
    (inf) when even a full replica costs more per token than the API. Past ``k`` full replicas
    the next one is paid whole: the API wins again on ``(k X, (k + 1) lambda*)`` while that is not
    empty, ``k <= K = floor(lambda* / (X - lambda*))``, so owning is always cheaper from
    ``(K + 1) lambda*`` on.

    Args:
      design, hardware, model, workload: one replica (``workload.prompt``, ``.output``: mean
        lengths).
      own: the ownership inputs.
      prices: $ per token by kind, as ``dcost.price_sheets()[name].prices``: ``"output"``,
        ``"input"`` and, when ``cached_share > 0``, ``"cache_hit"``.
      cached_share: ``h``, the share of prompt tokens the API bills as cache hits (and the owned
        replica skips the prefill of).

    >>> import dcost
    >>> b = breakeven(dcost.Design(batch=64), dcost.hardware("h100-sxm", calibrated=True),
    ...               dcost.model("llama-3.1-8b"), dcost.Workload(1024, prompt=1000, output=300),
    ...               ownership("h100-sxm"), {"input": 0.1e-6, "output": 0.4e-6})
    >>> bool(b.traffic < b.replica_capacity)
    True
    """
    for kind in ("input", "output") + (("cache_hit",) if float(cached_share) > 0 else ()):
        if kind not in prices:
            raise SpecError(
                f"breakeven: prices has no {kind!r}; give $ per token for "
                "'input', 'output' (and 'cache_hit' with cached_share > 0)"
            )
        check("breakeven", f"prices[{kind!r}]", prices[kind])
    check("breakeven", "cached_share", cached_share, high=1.0)
    ratio = workload.prompt / workload.output
    h = cached_share
    x_dec = decode(design, hardware, model, workload).tokens_per_s
    x_pre = prefill(design, hardware, model, workload).tokens_per_s
    capacity = 1.0 / (1.0 / x_dec + (1.0 - h) * ratio / x_pre)
    e = energy(design, hardware, model, workload)
    per_hour = design.chips_per_replica * chip_hour_cost(own, hardware, e.power_per_chip).total
    hit = prices.get("cache_hit", 0.0)
    api = prices["output"] + ratio * ((1.0 - h) * prices["input"] + h * hit)
    lam = per_hour / SECONDS_PER_HOUR / api
    owned_token = per_hour / SECONDS_PER_HOUR / capacity
    wins = lam < capacity
    k = jnp.floor(lam / jnp.where(wins, capacity - lam, 1.0))
    return Breakeven(
        traffic=jnp.where(lam <= capacity, lam, jnp.inf),
        traffic_always=jnp.where(wins, (k + 1.0) * lam, jnp.inf),
        replica_capacity=capacity,
        replica_cost_per_hour=per_hour,
        api_cost_per_output_token=jnp.asarray(api),
        owned_cost_per_output_token=owned_token,
    )


def ownership(name: str, **overrides) -> Ownership:
    """The assumed ownership inputs for hardware preset ``name`` (``presets/ownership.toml``:
    every number marked assumed, with how it was set); ``overrides`` replace fields.

    >>> float(ownership("b200").purchase_price)
    35000.0
    """
    from dcost.presets import PresetError, _load

    table = _load("ownership")
    chips = table["chip"]
    if name not in chips:
        raise PresetError(
            f"no ownership inputs for hardware preset {name!r}; known: {', '.join(sorted(chips))}"
            " (or build dcost.Ownership(...) yourself)"
        )
    fields = {k: float(v["value"]) for k, v in table["defaults"].items()}
    fields.update({k: float(v["value"]) for k, v in chips[name].items()})
    unknown = set(overrides) - set(fields)
    if unknown:
        raise SpecError(f"ownership: unknown field(s) {sorted(unknown)}; known: {sorted(fields)}")
    fields.update(overrides)
    return Ownership(**fields)
