"""Traffic: how many requests arrive, and how long their prompts and answers are.

A ``Traffic`` is Poisson arrivals at ``rate`` requests/s whose prompt and output lengths are
**lognormal** with the given means and coefficients of variation (``cv = sd / mean``):

.. math:: \\ln X \\sim \\mathcal{N}(\\mu, \\sigma^2), \\qquad \\sigma^2 = \\ln(1 + cv^2),
          \\qquad \\mu = \\ln \\bar X - \\sigma^2 / 2

(so ``E[X] = mean`` and ``sd(X) = cv * mean`` exactly). The lognormal is the usual fit to the
right-skewed length distributions of production traces (e.g. ServeGen, arXiv:2505.09999, sec. 3:
input and output lengths of language workloads are heavy-tailed). ``cv = 0`` is a fixed length.
Prompt and output lengths are drawn independently. ``Traffic.from_sample`` takes an empirical
sample of (prompt, output) pairs instead: the means and cvs are the sample's, and a simulation
resamples the pairs themselves.

``prefix_hit`` is the fraction of prompt tokens already in the prefix cache: a request prefills
only ``(1 - prefix_hit) * prompt`` tokens (its first ``prefix_hit`` share is cached), while its
KV cache still holds, and a disaggregated pool still transfers, the whole prompt.
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from dcost._toml import read_toml
from dcost._types import FloatLeaf, OptionalFloatLeaf
from dcost.presets import PresetError
from dcost.specs import SpecError, _float, check, readable

__all__ = ["Traffic", "traffic", "traffic_names", "traffic_card"]


class Traffic(eqx.Module):
    """A stream of requests: Poisson arrivals, lognormal prompt and output lengths.

    Attributes:
      rate: arrivals ``lambda`` (requests/s, > 0).
      prompt_tokens: mean prompt length ``E[T_in]`` (tokens, >= 1).
      output_tokens: mean output length ``E[T_out]`` (tokens, >= 1; the first comes from the
        prefill).
      prompt_cv: coefficient of variation of the prompt length (>= 0; 0 = fixed length).
      output_cv: coefficient of variation of the output length (>= 0).
      prefix_hit: fraction of prompt tokens found in the prefix cache (0 <= h < 1).
      prompt_sample, output_sample: an empirical sample of lengths (tokens), paired, or None.

    >>> import dcost
    >>> t = dcost.Traffic(10.0, 2000, 200, prompt_cv=1.0, prefix_hit=0.25)
    >>> float(t.prefill_tokens), round(float(t.prompt_moment2) / 2000**2, 3)
    (1500.0, 2.0)
    """

    rate: FloatLeaf = eqx.field(converter=_float)
    prompt_tokens: FloatLeaf = eqx.field(converter=_float)
    output_tokens: FloatLeaf = eqx.field(converter=_float)
    prompt_cv: FloatLeaf = eqx.field(default=0.0, converter=_float)
    output_cv: FloatLeaf = eqx.field(default=0.0, converter=_float)
    prefix_hit: FloatLeaf = eqx.field(default=0.0, converter=_float)
    prompt_sample: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    output_sample: OptionalFloatLeaf = eqx.field(default=None, converter=_float)

    __repr__ = readable

    def __check_init__(self):
        check("Traffic", "rate", self.rate, low_open=True)
        check("Traffic", "prompt_tokens", self.prompt_tokens, low=1.0)
        check("Traffic", "output_tokens", self.output_tokens, low=1.0)
        check("Traffic", "prompt_cv", self.prompt_cv)
        check("Traffic", "output_cv", self.output_cv)
        check("Traffic", "prefix_hit", self.prefix_hit, high=0.999)
        for name in ("prompt_sample", "output_sample"):
            sample = getattr(self, name)
            if sample is not None:
                check("Traffic", name, sample, low=1.0)
        if (self.prompt_sample is None) != (self.output_sample is None):
            raise SpecError(
                "Traffic.prompt_sample and Traffic.output_sample must be given together "
                "(paired lengths), or neither"
            )
        if self.prompt_sample is not None and self.output_sample is not None:
            if self.prompt_sample.shape != self.output_sample.shape:
                raise SpecError(
                    f"Traffic.prompt_sample has shape {self.prompt_sample.shape} and "
                    f"output_sample {self.output_sample.shape}: they must be paired, one shape"
                )

    @classmethod
    def from_sample(cls, rate, prompt_tokens, output_tokens, *, prefix_hit=0.0) -> Traffic:
        """Traffic whose lengths are an empirical sample of paired (prompt, output) lengths.

        The means and cvs are the sample's (population standard deviation); a simulation draws
        pairs from the sample with replacement.

        >>> t = Traffic.from_sample(5.0, [100, 300], [10, 30])
        >>> float(t.prompt_tokens), float(t.prompt_cv), float(t.output_cv)
        (200.0, 0.5, 0.5)
        """
        p = np.asarray(prompt_tokens, dtype=float).ravel()
        o = np.asarray(output_tokens, dtype=float).ravel()
        if p.size == 0 or p.shape != o.shape:
            raise SpecError(
                f"Traffic.from_sample: prompt_tokens ({p.size} values) and output_tokens "
                f"({o.size} values) must be paired samples of one non-zero length"
            )
        for name, x in (("prompt_sample", p), ("output_sample", o)):
            check("Traffic", name, x, low=1.0)
        return cls(
            rate,
            p.mean(),
            o.mean(),
            prompt_cv=p.std() / p.mean(),
            output_cv=o.std() / o.mean(),
            prefix_hit=prefix_hit,
            prompt_sample=p,
            output_sample=o,
        )

    @property
    def prefill_tokens(self):
        """Mean prompt tokens a request prefills, ``(1 - h) E[T_in]`` (tokens)."""
        return (1.0 - self.prefix_hit) * self.prompt_tokens

    @property
    def prompt_moment2(self):
        """``E[T_in^2] = E[T_in]^2 (1 + cv^2)`` (tokens^2)."""
        return jnp.square(self.prompt_tokens) * (1.0 + jnp.square(self.prompt_cv))

    def lognormal(self, which: str):
        """``(mu, sigma)`` of ``ln T`` for ``which`` = "prompt" or "output"."""
        mean, cv = (
            (self.prompt_tokens, self.prompt_cv)
            if which == "prompt"
            else (self.output_tokens, self.output_cv)
        )
        sigma2 = jnp.log1p(jnp.square(cv))
        return jnp.log(mean) - 0.5 * sigma2, jnp.sqrt(sigma2)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` paired (prompt, output) lengths, whole tokens >= 1 (NumPy, for simulation).

        Lognormal draws are rounded to the nearest whole token (at least 1); an empirical sample
        is resampled with replacement.

        >>> t = Traffic(1.0, 1000, 100, prompt_cv=0.5, output_cv=1.0)
        >>> p, o = t.sample(np.random.default_rng(0), 200_000)
        >>> bool(abs(p.mean() / 1000 - 1) < 0.01), bool(abs(o.std() / o.mean() - 1.0) < 0.03)
        (True, True)
        """
        if self.prompt_sample is not None and self.output_sample is not None:
            idx = rng.integers(0, self.prompt_sample.shape[-1], size=n)
            return (
                np.asarray(self.prompt_sample, dtype=float)[idx],
                np.asarray(self.output_sample, dtype=float)[idx],
            )
        out = []
        for which in ("prompt", "output"):
            mu, sigma = (float(v) for v in self.lognormal(which))
            x = np.exp(mu + sigma * rng.standard_normal(n))
            out.append(np.maximum(1.0, np.rint(x)))
        return out[0], out[1]


_FIELDS = ("rate", "prompt_tokens", "output_tokens", "prompt_cv", "output_cv", "prefix_hit")


@functools.cache
def _cards() -> dict:
    return read_toml("dcost.planning", "traffic.toml")


def traffic_names() -> list[str]:
    """Names of the traffic presets."""
    return sorted(_cards())


def traffic_card(name: str) -> dict:
    """The raw preset entry (numbers with their sources) for traffic ``name``."""
    cards = _cards()
    if name not in cards:
        raise PresetError(f"unknown traffic preset {name!r}; known: {', '.join(sorted(cards))}")
    return cards[name]


def traffic(name: str, **overrides) -> Traffic:
    """The traffic preset ``name`` as a ``dcost.Traffic`` (its lengths; the rate is a
    placeholder of 1 request/s unless given).

    Args:
      name: a preset from ``traffic_names()``.
      **overrides: replace fields, e.g. ``traffic("chat", rate=200.0)``.

    >>> import dcost
    >>> t = dcost.traffic("chat", rate=200.0)
    >>> float(t.rate), round(float(t.prompt_tokens)), round(float(t.output_tokens))
    (200.0, 1155, 211)
    """
    card = traffic_card(name)
    fields = {
        f: float(card[f]["value"]) if isinstance(card[f], dict) else float(card[f])
        for f in _FIELDS
        if f in card
    }
    fields.setdefault("rate", 1.0)
    unknown = set(overrides) - set(_FIELDS)
    if unknown:
        raise SpecError(
            f"traffic({name!r}): unknown field(s) {', '.join(sorted(unknown))}; "
            f"allowed: {', '.join(_FIELDS)}"
        )
    fields.update(overrides)
    rate = fields.pop("rate")
    prompt = fields.pop("prompt_tokens")
    output = fields.pop("output_tokens")
    return Traffic(rate, prompt, output, **fields)
