"""A campaign of bad input against the public entry points, classified (issue 34).

Each case calls one public function, constructor or CLI subcommand with one field set to a bad
or edge value and the rest valid, and its outcome is sorted into:

- **clear**: a ``ValueError``/``TypeError`` (``SpecError``, ``PresetError`` included) whose
  message names the field (or, for the CLI, exit status 2 with a one-line message naming the
  option);
- **unclear**: such an error that does not name the field;
- **traceback**: any other exception (``AttributeError``, ``ZeroDivisionError``, ...), or a
  CLI exit status other than 0, 1 (an answer: nothing meets the targets) and 2;
- **nan/inf**: an answer holding NaN or an infinity;
- **handled**: an answer to a value the field allows (listed with the case);
- **silent**: an answer to a value the field does not allow.

Surfaces: ``dcost.Server``, ``dcost.Load``, ``dcost.Bursty``, ``dcost.engine`` (scheduler
settings), ``dcost.Traffic`` and ``dcost.traffic``, ``dcost.simulate`` (a server under a load,
a plan), ``dcost.measurements.read``, ``dcost.calibrate.fit``, ``dcost.planning.Options``,
``dcost.plan`` and the CLI subcommands ``simulate``, ``plan``, ``eval``, ``measurements``.

Run: ``python experiments/bad_input_campaign.py`` (prints the table and writes
``experiments/results/bad_input_campaign.json``).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import pathlib
import sys
import tempfile

import _common as C
import jax
import numpy as np

import dcost
import dcost.calibrate
import dcost.measurements
from dcost.cli.app import main as cli_main

NAN, INF = float("nan"), float("inf")
# bad or edge values tried in every numeric field
NUMBERS = [NAN, INF, -INF, -1, 0, 1e30, 1e-30, -1e-30, 2.5, "x", "", None, True, [1, 2], 1 + 2j]
COUNTS = NUMBERS + [np.int64(-3), 10**12]
TEXT = [None, 3, "", "no-such-thing", ["vllm"], True]
CLI_NUMBERS = ["nan", "inf", "-1", "0", "1e30", "1e-30", "x", "", "2.5"]


def _names(message: str, field: str) -> bool:
    low = message.lower()
    f = field.lower().lstrip("-")
    keys = {f, f.replace("_", "-"), f.replace("-", "_"), f.replace("_", " "), f.replace("-", " ")}
    return any(k in low for k in keys)


def _finite(tree) -> bool:
    for leaf in jax.tree.leaves(tree):
        try:
            arr = np.asarray(leaf, dtype=float)
        except (TypeError, ValueError):
            continue
        if not np.all(np.isfinite(arr)):
            return False
    return True


def classify(call, field: str, valid: bool) -> tuple[str, str]:
    """``(kind, detail)`` of one call (see the module docstring)."""
    try:
        out = call()
    except (ValueError, TypeError) as err:
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        return ("clear" if _names(str(err), field) else "unclear"), msg[:160]
    except Exception as err:  # noqa: BLE001 - the campaign's point is to catch anything
        return "traceback", f"{type(err).__name__}: {str(err)[:140]}"
    if hasattr(out, "summary"):
        with contextlib.suppress(Exception):
            out = out.summary()
    if not _finite(out):
        return "nan/inf", repr(out)[:160]
    return ("handled" if valid else "silent"), repr(out)[:160]


def classify_cli(argv: list[str], option: str, valid: bool) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli_main(argv)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 2
    except Exception as exc:  # noqa: BLE001
        return "traceback", f"{type(exc).__name__}: {str(exc)[:140]}"
    text = err.getvalue().strip()
    if code == 2:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        ok = bool(lines) and _names(text, option.lstrip("-"))
        return ("clear" if ok else "unclear"), (lines[-1] if lines else "")[:160]
    if code == 1 and "Traceback" not in text:  # an answer: nothing meets the targets
        return ("handled" if valid else "silent"), (out.getvalue() + text)[-160:]
    if code != 0:
        return "traceback", f"exit {code}: {text[-160:]}"
    body = out.getvalue()
    if any(w in body for w in ("nan", "NaN", "inf ", "Infinity")):
        return "nan/inf", body[:160]
    return ("handled" if valid else "silent"), body[:160].replace("\n", " | ")


def _valid_number(v, low=None, high=None, whole=False, low_open=False) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        return False
    v = float(v)
    if not math.isfinite(v) or (whole and v != int(v)):
        return False
    if low is not None and (v < low or (low_open and v == low)):
        return False
    return high is None or v <= high


CLI_COUNTS = ("--clients", "--requests", "--max-chips", "--batch", "--chips", "--stages")


def _cli_valid(option: str, text: str) -> bool:
    """Whether a CLI value is one the option allows."""
    try:
        v = float(text)
    except ValueError:
        return False
    if not math.isfinite(v):
        return False
    if option in CLI_COUNTS:
        return v == int(v) and 1 <= v <= 1e6
    if option == "--shared-prefix":
        return 0 <= v < 64
    if option == "--memory-reserve":
        return 0 <= v < 1
    if option == "--slot-wait":
        return 0 < v < 1
    if option == "--context":  # 0 is eval's default: the step that reads no KV cache
        return v >= 0
    return v > 0


def cases(tmp: pathlib.Path):
    """Yield ``(surface, field, value, valid, call)`` (``call`` None for CLI argv cases, whose
    argv is then in ``value``)."""
    server = dcost.Server(hardware="h100-sxm", model="llama-3.1-8b", engine="vllm")
    server_fields = {
        "tensor_parallel": dict(low=1, whole=True),
        "attention_data_parallel": dict(low=1, whole=True),
        "pipeline_parallel": dict(low=1, whole=True),
        "replicas": dict(low=1, whole=True),
        "expert_parallel": dict(low=1, whole=True),
    }
    for field, rule in server_fields.items():
        for v in COUNTS:
            valid = _valid_number(v, **rule) and float(v) <= 8 and field != "expert_parallel"
            if field == "expert_parallel":
                valid = v is None
            yield ("Server", field, v, valid,
                   lambda f=field, v=v: dcost.Server(hardware="h100-sxm", model="llama-3.1-8b",
                                                     engine="vllm", **{f: v}))  # fmt: skip
    for field in ("hardware", "model", "weights", "kv_cache", "engine", "router"):
        for v in TEXT:
            valid = field in ("weights", "engine") and v is None
            yield (
                "Server",
                field,
                v,
                valid,
                lambda f=field, v=v: dcost.Server(
                    **{"hardware": "h100-sxm", "model": "llama-3.1-8b", f: v}
                ),
            )
    load_fields = {
        "prompt": dict(low=1), "output": dict(low=1), "shared_prefix": dict(low=0),
        "prompt_cv": dict(low=0), "output_cv": dict(low=0),
    }  # fmt: skip
    for field, rule in load_fields.items():
        for v in NUMBERS:
            valid = _valid_number(v, **rule)
            if field == "shared_prefix" and valid:
                valid = float(v) < 256
            yield (
                "Load",
                field,
                v,
                valid,
                lambda f=field, v=v: dcost.Load(
                    **{"prompt": 256, "output": 8, "clients": 2, "requests": 4, f: v}
                ),
            )
    for field in ("clients", "requests"):
        for v in COUNTS:
            valid = _valid_number(v, low=1, whole=True) or (field == "requests" and v is None)
            yield (
                "Load",
                field,
                v,
                valid,
                lambda f=field, v=v: dcost.Load(
                    **{"prompt": 256, "output": 8, "clients": 2, "requests": 4, f: v}
                ),
            )
    for v in [
        (),
        ((NAN, 1.0),),
        ((1.0, -1.0),),
        ((0.0, 10.0),),
        ((1.0,),),
        "x",
        ((INF, 1.0),),
        ((1.0, 1e30),),
        [(1.0, 10.0)],
        None,
    ]:
        valid = isinstance(v, (tuple, list)) and v == [(1.0, 10.0)]
        yield ("Load", "stages", v, valid,
               lambda v=v: dcost.Load(prompt=256, output=8, stages=v))  # fmt: skip
    for v in ["poisson", "constant", "bursty", "", None, 3, dcost.Bursty(cv=2.0)]:
        valid = v in ("poisson", "constant") or isinstance(v, dcost.Bursty)
        yield (
            "Load",
            "arrival",
            v,
            valid,
            lambda v=v: dcost.Load(prompt=256, output=8, stages=[(1.0, 10.0)], arrival=v),
        )
    for v in NUMBERS:
        yield ("Bursty", "cv", v, _valid_number(v, low=0, low_open=True),
               lambda v=v: dcost.Bursty(cv=v))  # fmt: skip
    engine_fields = {
        "max_num_seqs": dict(low=1, whole=True),
        "max_num_batched_tokens": dict(low=1, whole=True),
        "gpu_memory_utilization": dict(low=0, high=1, low_open=True),
    }
    for field, rule in engine_fields.items():
        for v in COUNTS:
            valid = _valid_number(v, **rule)
            yield (
                "engine",
                field,
                v,
                valid,
                lambda f=field, v=v: dcost.engine("vllm", hardware="h100-sxm", **{f: v}),
            )
    for v in [True, False, "yes", 1, None, NAN]:
        yield (
            "engine",
            "prefix_caching",
            v,
            isinstance(v, bool),
            lambda v=v: dcost.engine("vllm", hardware="h100-sxm", prefix_caching=v),
        )
    for field in ("name", "hardware", "version"):
        for v in TEXT:
            valid = field == "version" and v is None
            args = {"name": "vllm", "hardware": "h100-sxm", field: v}
            yield ("engine", field, v, valid, lambda a=args: dcost.engine(**a))
    yield ("engine", "no_such_setting", 1, False,
           lambda: dcost.engine("vllm", hardware="h100-sxm", no_such_setting=1))  # fmt: skip
    traffic_fields = {
        "rate": dict(low=0, low_open=True), "prompt_tokens": dict(low=1),
        "output_tokens": dict(low=1), "prompt_cv": dict(low=0), "output_cv": dict(low=0),
        "prefix_hit": dict(low=0, high=0.999),
    }  # fmt: skip
    for field, rule in traffic_fields.items():
        for v in NUMBERS:
            # a finite number in range, or a list of them (many scenarios in one call)
            valid = _valid_number(v, **rule) or (
                isinstance(v, list) and all(_valid_number(x, **rule) for x in v)
            )
            args = {"rate": 1.0, "prompt_tokens": 100.0, "output_tokens": 10.0, field: v}
            yield ("Traffic", field, v, valid, lambda a=args: dcost.Traffic(**a))
            yield ("traffic", field, v, valid,
                   lambda f=field, v=v: dcost.traffic("chat", **{f: v}))  # fmt: skip
    load = dcost.Load(prompt=64, output=4, clients=2, requests=4)
    for v in COUNTS:
        yield (
            "simulate(server)",
            "seed",
            v,
            _valid_number(v, low=0, whole=True),
            lambda v=v: dcost.simulate(server, load, seed=v),
        )
    for v in NUMBERS:
        yield (
            "simulate(server)",
            "warmup",
            v,
            _valid_number(v, low=0, high=0.49),
            lambda v=v: dcost.simulate(server, load, warmup=v),
        )
    for v in [None, 3, "x", load, dcost.traffic("chat")]:
        yield ("simulate(server)", "load", v, v is load, lambda v=v: dcost.simulate(server, v))
    for v in [None, 3, "plan", server.__class__]:
        yield ("simulate", "plan", v, False, lambda v=v: dcost.simulate(v))
    # a disaggregated deployment: the transfer's seconds, the load, the pools
    from dcost.planning.server import simulate_disaggregated

    open_load = dcost.Load(prompt=64, output=4, stages=((4.0, 2.0),))
    for v in NUMBERS:
        valid = _valid_number(v, low=0)
        yield ("simulate_disaggregated", "transfer", v, valid,
               lambda v=v: simulate_disaggregated(server, server, open_load,
                                                  transfer=lambda p: v))  # fmt: skip
    for v in [None, 3, "x", load, open_load, dcost.traffic("chat")]:
        yield ("simulate_disaggregated", "load", v, v is open_load,
               lambda v=v: dcost.simulate((server, server), v))  # fmt: skip
    for v in [None, 3, "x", server]:
        yield ("simulate_disaggregated", "decode", v, v is server,
               lambda v=v: simulate_disaggregated(server, v, open_load))  # fmt: skip
    good = C.ROOT / "tests" / "data" / "measurements" / "vllm_bench_serve.json"
    for field in ("tensor_parallel", "concurrency", "gpus", "pipeline_parallel",
                  "expert_parallel", "attention_data_parallel"):  # fmt: skip
        for v in COUNTS:
            valid = v is None or _valid_number(v, low=1, whole=True)
            yield ("measurements.read", field, v, valid,
                   lambda f=field, v=v: dcost.measurements.read(
                       good, hardware="h100-sxm", model="llama-3.1-8b", engine="vllm",
                       **{f: v}))  # fmt: skip
    for field in ("hardware", "model", "engine", "on_unsupported", "kv_cache"):
        for v in TEXT:
            valid = v is None and field == "kv_cache"
            args = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "engine": "vllm", field: v}
            yield (
                "measurements.read",
                field,
                v,
                valid,
                lambda a=args: dcost.measurements.read(good, **a),
            )
    for v in [tmp / "missing.json", tmp, 3, None, "", tmp / "empty.json"]:
        (tmp / "empty.json").write_text("")
        yield (
            "measurements.read",
            "path",
            v,
            False,
            lambda v=v: dcost.measurements.read(
                v, hardware="h100-sxm", model="llama-3.1-8b", engine="vllm"
            ),
        )
    eng = dcost.engine("vllm", hardware="h100-sxm")
    for v in [[], None, 3, "x", [{}], [{"metric": "tpot"}], [None], ({"a": 1},)]:
        yield ("calibrate.fit", "records", v, False, lambda v=v: dcost.calibrate.fit(v, eng))
    for v in [None, "vllm", 3, server]:
        yield (
            "calibrate.fit",
            "engine",
            v,
            False,
            lambda v=v: dcost.calibrate.fit([{"metric": "tpot"}], v),
        )
    for field in ("chips", "chunks", "attention", "max_chips", "draft_tokens"):
        for v in [(-8,), (0,), (2.5,), (NAN,), ("xx",), (), 0, -1, None, (10**12,)]:
            valid = (field == "chips" and v is None) or (field == "draft_tokens" and v == (0,))
            yield (
                "planning.Options",
                field,
                v,
                valid,
                lambda f=field, v=v: dcost.planning.Options(**{f: v}),
            )
    # the CLI: one option at a time with a bad value
    cli = {
        "simulate": (["simulate", "--hardware", "h100-sxm", "--model", "llama-3.1-8b",
                      "--engine", "vllm", "--clients", "2", "--requests", "4", "--prompt", "64",
                      "--output", "4"],
                     ["--clients", "--requests", "--prompt", "--output", "--shared-prefix"]),
        "plan": (["plan", "--hardware", "h100-sxm", "--model", "llama-3-70b", "--traffic",
                  "chat", "--rate", "10", "--engine", "none"],
                 ["--rate", "--max-chips", "--memory-reserve", "--slot-wait"]),
        "eval": (["eval", "--hardware", "h100-sxm", "--model", "llama-3-70b", "--batch", "64",
                  "--chips", "8"], ["--batch", "--chips", "--context", "--stages"]),
    }  # fmt: skip
    for name, (base, options) in cli.items():
        for opt in options:
            for v in CLI_NUMBERS:
                argv = [*base]
                if opt in argv:
                    argv[argv.index(opt) + 1] = v
                else:
                    argv += [opt, v]
                yield (f"cli {name}", opt, argv, _cli_valid(opt, v), None)
    for v in CLI_NUMBERS:
        argv = [*cli["simulate"][0][:-8], "--rate", "4", "--seconds", "2", "--prompt", "64",
                "--output", "4", "--decode-replicas", v]  # fmt: skip
        valid = _cli_valid("--clients", v)
        yield ("cli simulate", "--decode-replicas", argv, valid, None)
    for v in ["x", "nan", "-1", "0"]:
        yield ("cli measurements", "--tensor-parallel",
               ["measurements", str(good), "--hardware", "h100-sxm", "--model", "llama-3.1-8b",
                "--engine", "vllm", "--tensor-parallel", v], False, None)  # fmt: skip


def compute() -> dict:
    counts: dict[str, int] = {}
    by_surface: dict[str, dict[str, int]] = {}
    notable = []
    with tempfile.TemporaryDirectory() as d:
        for surface, field, value, valid, call in cases(pathlib.Path(d)):
            if call is None:
                kind, detail = classify_cli(value, field, valid)
                shown = " ".join(value)
            else:
                kind, detail = classify(call, field, valid)
                shown = repr(value)[:60]
            counts[kind] = counts.get(kind, 0) + 1
            row = by_surface.setdefault(surface, {})
            row[kind] = row.get(kind, 0) + 1
            detail = detail.replace(str(C.ROOT), "<checkout>").replace(d, "<tmp>")
            shown = shown.replace(str(C.ROOT), "<checkout>").replace(d, "<tmp>")
            if kind not in ("clear", "handled"):
                notable.append(dict(surface=surface, field=field, value=shown, kind=kind,
                                    detail=detail))  # fmt: skip
    total = sum(counts.values())
    bad = total - counts.get("handled", 0)
    return dict(total=total, bad_inputs=bad, counts=counts, by_surface=by_surface,
                clear_share=counts.get("clear", 0) / max(bad, 1), notable=notable)  # fmt: skip


def main() -> int:
    results = compute()
    kinds = ("clear", "unclear", "traceback", "nan/inf", "silent", "handled")
    print(f"{'surface':22s}" + "".join(f"{k:>10s}" for k in kinds))
    for surface, row in results["by_surface"].items():
        print(f"{surface:22s}" + "".join(f"{row.get(k, 0):10d}" for k in kinds))
    print(f"{'all':22s}" + "".join(f"{results['counts'].get(k, 0):10d}" for k in kinds))
    print(
        f"{results['total']} cases, {results['bad_inputs']} bad: "
        f"{100 * results['clear_share']:.1f} % clear errors"
    )
    for n in results["notable"]:
        print(f"  {n['kind']:9s} {n['surface']}.{n['field']} = {n['value']}: {n['detail']}")
    out = C.RESULTS / "bad_input_campaign.json"
    out.write_text(json.dumps(C.jsonable(results), indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out.relative_to(C.ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
