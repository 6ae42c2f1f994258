"""Published price sheets (``dcost/presets/price_sheets.toml``) and their serving conventions."""

from __future__ import annotations

import dataclasses
import functools

from dcost._toml import read_toml
from dcost.pricing.fit import PriceFit, fit_prices
from dcost.pricing.model import KINDS, PER_MILLION, Serving
from dcost.serving.roofline import SECONDS_PER_HOUR
from dcost.specs import SpecError

__all__ = ["PriceSheet", "price_sheets", "serving_for", "fit_sheet"]


@dataclasses.dataclass(frozen=True)
class PriceSheet:
    """One published price sheet (SI units) with its source.

    Attributes:
      name: the key in ``price_sheets.toml``.
      provider, model: who sells what.
      prices: kind -> $ per token (``cache_storage``: $ per token-second).
      page: the public page the prices come from.
      published: when the page says the prices took effect (or what dates it).
      retrieved: when they were looked up.
      serving: overrides of the default serving convention for this sheet.
      prior: anchors, name -> (median, factor).
      notes: free text (what each price means, caveats, the source of each anchor).
    """

    name: str
    provider: str
    model: str
    prices: dict
    page: str
    published: str
    retrieved: str
    serving: dict
    prior: dict
    notes: str


_SERVING_FIELDS = (
    "chips",
    "batch",
    "context",
    "context_long",
    "bytes_per_param",
    "sparsity",
    "attn_flops_per_kv_byte",
    "cache_hold_s",
    "smoothness",
)


@functools.cache
def _sheets_toml() -> dict:
    return read_toml("dcost.presets", "price_sheets.toml")


def _per_token(kind: str, value: float) -> float:
    """$/M tokens (storage: $/M tokens/hour) as people read them -> SI."""
    si = float(value) * PER_MILLION
    return si / SECONDS_PER_HOUR if kind == "cache_storage" else si


def price_sheets() -> dict:
    """The published price sheets of ``dcost/presets/price_sheets.toml``, in SI units.

    >>> import dcost
    >>> sheets = dcost.pricing.price_sheets()
    >>> all(s.prices["output"] > s.prices["input"] for s in sheets.values())
    True
    """
    table = _sheets_toml()
    out = {}
    for name, entry in table.items():
        if name == "assumptions":
            continue
        prices = {}
        for key, value in entry["prices"].items():
            kind = "cache_storage" if key == "cache_storage_per_hour" else key
            if kind not in KINDS:
                raise ValueError(f"price_sheets.toml [{name}]: unknown price kind {key!r}")
            prices[kind] = _per_token(kind, value)
        prior = {
            k: (float(v["value"]), float(v["factor"])) for k, v in entry.get("anchors", {}).items()
        }
        out[name] = PriceSheet(
            name,
            entry["provider"],
            entry["model"],
            prices,
            entry["page"],
            entry["published"],
            entry["retrieved"],
            dict(entry.get("serving", {})),
            prior,
            entry.get("notes", ""),
        )
    return out


def serving_for(sheet: PriceSheet | None = None) -> Serving:
    """The serving convention of ``price_sheets.toml`` (its ``[assumptions]``), with the sheet's
    overrides applied (a ``price_per_hour`` override replaces the chip's price)."""
    from dcost.presets import hardware

    base = dict(_sheets_toml()["assumptions"])
    base.update(sheet.serving if sheet is not None else {})
    name = base.pop("hardware")
    price = base.pop("price_per_hour", None)
    chip = hardware(name) if price is None else hardware(name, price_per_hour=float(price))
    unknown = [k for k in base if k not in _SERVING_FIELDS and k != "note"]
    if unknown:
        raise SpecError(f"unknown serving assumption {unknown}; known: {list(_SERVING_FIELDS)}")
    return Serving(chip, **{k: float(v) for k, v in base.items() if k in _SERVING_FIELDS})


def fit_sheet(sheet: PriceSheet, **kwargs) -> PriceFit:
    """``fit_prices`` of one published sheet under its serving convention and anchors."""
    prior = dict(sheet.prior)
    prior.update(kwargs.pop("prior", {}) or {})
    return fit_prices(sheet.prices, serving_for(sheet), prior=prior, **kwargs)
