"""Whole-run energy measurements (``energy.toml``) and how far dcost's power model is from them.

Each record is a serving run as in ``records.toml`` whose metric is ``energy_per_output_token``
(J) or ``power_per_gpu`` (W, mean over the run). ``predict`` builds the run's replica with the
calibrated family profile (``dcost.validation.case``) and evaluates ``dcost.energy`` on it:

    aggregated:  J/output token = E_decode + (T_in / T_out) * E_prefill   # prompts shared out
                 W per GPU      = mean of decode and prefill power, weighted by their time
    decode pool: E_decode;  prefill pool: E_prefill (J per input token)

The records are held out of every fit: the activity coefficients come from kernel power alone
(``dcost.calibrate.power``). ``summary`` gives the median and p90 of ``|predicted/measured - 1|``.

>>> recs = load()
>>> len(recs) >= 4
True
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from importlib import resources

import numpy as np

from dcost.serving.power import energy
from dcost.validation.cases import case

__all__ = ["METRICS", "load", "predict", "errors", "summary"]

METRICS = ("energy_per_output_token", "power_per_gpu")


def load() -> list[dict]:
    """The shipped whole-run energy records (``energy.toml``), each checked like a serving
    record (its metric one of ``METRICS``)."""
    text = resources.files(__package__).joinpath("energy.toml").read_text(encoding="utf-8")
    records = tomllib.loads(text)["record"]
    for r in records:
        if r.get("metric") not in METRICS:
            raise ValueError(
                f"energy record {r.get('id')!r}: metric = {r.get('metric')!r} is not allowed: "
                f"it must be one of {', '.join(METRICS)}"
            )
        if not isinstance(r.get("value"), (int, float)) or not r["value"] > 0:
            raise ValueError(
                f"energy record {r.get('id')!r}: value = {r.get('value')!r} must be a positive "
                "number (J or W)"
            )
    return records


def predict(record: Mapping) -> float:
    """The record's metric (J per output token, or W per GPU) as dcost predicts it with the
    calibrated family profile and the shipped ``POWER_FIT``."""
    run = dict(record, metric="output_throughput_per_gpu", value=1.0)
    c = case(run, calibrated=True)
    args = (c.design, c.hardware, c.model, c.workload)
    serving = record["serving"]
    if serving == "prefill":
        e = energy(*args, step="prefill")
        if record["metric"] == "power_per_gpu":
            return float(e.power_per_chip)
        raise ValueError(
            f"energy record {record.get('id')!r}: a prefill pool has no energy_per_output_token"
        )
    dec = energy(*args, step="decode")
    if serving == "decode":
        if record["metric"] == "power_per_gpu":
            return float(dec.power_per_chip)
        return float(dec.energy_per_token)
    pre = energy(*args, step="prefill")
    ratio = float(record["prompt_tokens"]) / float(record["output_tokens"])
    if record["metric"] == "energy_per_output_token":
        return float(dec.energy_per_token + ratio * pre.energy_per_token)
    # time-weighted mean power: seconds per output token in each phase
    t_dec = 1.0 / float(dec.power_per_replica / dec.energy_per_token)
    t_pre = ratio / float(pre.power_per_replica / pre.energy_per_token)
    return float((dec.power_per_chip * t_dec + pre.power_per_chip * t_pre) / (t_dec + t_pre))


def errors(records: list[Mapping] | None = None) -> list[dict]:
    """Per record: ``id``, ``hardware``, ``model``, ``metric``, measured, predicted and
    ``ratio = predicted / measured``."""
    chosen: list = load() if records is None else list(records)
    out = []
    for r in chosen:
        p = predict(r)
        out.append(
            {
                "id": r["id"],
                "hardware": r["hardware"],
                "model": r["model"],
                "metric": r["metric"],
                "measured": float(r["value"]),
                "predicted": p,
                "ratio": p / float(r["value"]),
            }
        )
    return out


def summary(records: list[Mapping] | None = None) -> dict:
    """Median and p90 of ``|predicted/measured - 1|`` per metric over the held-out records, with
    the rows (``errors``)."""
    rows = errors(records)
    out: dict = {"rows": rows}
    for metric in METRICS:
        e = np.asarray([abs(r["ratio"] - 1.0) for r in rows if r["metric"] == metric])
        if e.size:
            out[metric] = {
                "n": int(e.size),
                "median": float(np.median(e)),
                "p90": float(np.percentile(e, 90)),
            }
    return out
