"""``dcost plan --scenarios FILE.csv``: a CSV of planning questions in, a CSV of plans out.

    dcost plan --scenarios roadmap.csv --out plans.csv

Each row of the file is one question (``dcost.Scenario``), columns by name in a header line:

- ``model``, ``chip`` (or ``hardware``): presets (``dcost presets``); required.
- ``traffic``: a traffic preset (chat, code-completion, ...); or ``prompt`` and ``output`` (mean
  tokens) without it; ``prompt_cv``, ``output_cv``, ``prefix_hit`` override either.
- ``rate``: arrivals (requests/s); an empty cell or no column takes ``--rate``.
- ``ttft``, ``tpot``: targets such as ``2s@p99`` and ``50ms@p90`` (default ``--ttft``/``--tpot``).
- ``mode``: aggregated, disaggregated or best (default ``--mode``).
- ``engine``: vllm, sglang, trtllm or none (step times from that engine's profile on the chip).

The plans (``dcost.plan_sweep``: rows that ask the same question of different traffic are
planned as one batch, sharded over the process's JAX devices, and over processes with
``--coordinator``) are written to ``--out`` (else printed) as CSV, one row per scenario in the
file's order: its ``line``, the scenario's columns, then ``plan_mode``, ``feasible``,
``chips``, ``aggregated_replicas``, ``prefill_replicas``, ``decode_replicas``, ``layout``,
``cost_per_hour`` ($), ``cost_per_million_input`` and ``cost_per_million_output`` ($ per
million tokens), ``binding`` and ``message``. A bad file is refused (exit 2) with the file, the
line and the column of the first bad cell.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import pathlib

from dcost.cli.common import non_negative, positive

__all__ = ["COLUMNS", "OUTPUT_COLUMNS", "read_scenarios", "cmd_sweep"]

COLUMNS = (
    "model",
    "chip",
    "hardware",
    "traffic",
    "rate",
    "prompt",
    "output",
    "prompt_cv",
    "output_cv",
    "prefix_hit",
    "ttft",
    "tpot",
    "mode",
    "engine",
)
"""Columns a scenario file may have (``chip`` and ``hardware`` are one column by two names)."""
OUTPUT_COLUMNS = (
    "plan_mode",
    "feasible",
    "chips",
    "aggregated_replicas",
    "prefill_replicas",
    "decode_replicas",
    "layout",
    "cost_per_hour",
    "cost_per_million_input",
    "cost_per_million_output",
    "binding",
    "message",
)
_ENGINES = ("vllm", "sglang", "trtllm", "none")


class _Bad(ValueError):
    pass


def _fraction(text: str) -> float:
    v = non_negative(text)
    if v >= 1:
        raise argparse.ArgumentTypeError(f"must be < 1, got {text!r}")
    return v


def read_scenarios(path, defaults) -> list[tuple[int, dict, object]]:
    """The scenarios of a CSV file: ``(line, cells, dcost.Scenario)`` per row.

    ``defaults`` holds ``rate`` (None: the column is required), ``ttft``, ``tpot``, ``mode``
    (as ``dcost plan``'s options hold them). Raises ``ValueError`` naming the file, the line and
    the column of the first bad cell.
    """
    from dcost.cli.plan import parse_slo
    from dcost.planning.sweep import Scenario
    from dcost.planning.traffic import Traffic, traffic, traffic_names
    from dcost.presets import hardware_names, model_names

    path = pathlib.Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: cannot read the scenario file ({err})") from None
    try:
        lines = list(csv.reader(io.StringIO(text), strict=True))
    except csv.Error as err:
        raise ValueError(f"{path}: not a CSV file ({err})") from None
    numbered = [(i + 1, row) for i, row in enumerate(lines) if any(c.strip() for c in row)]
    if not numbered:
        raise ValueError(f"{path}: empty scenario file (a header line, then one row per scenario)")
    header_line, header = numbered[0]
    names = [c.strip().lower() for c in header]

    def bad(line, col, message):
        name = names[col] if col < len(names) else ""
        return _Bad(f"{path}, line {line}, column {col + 1} ({name}): {message}")

    for j, name in enumerate(names):
        if name not in COLUMNS:
            raise bad(header_line, j, f"unknown column {name!r}; allowed: {', '.join(COLUMNS)}")
        if names.index(name) != j or (
            name in ("chip", "hardware") and {"chip", "hardware"} <= set(names)
        ):
            raise bad(header_line, j, f"column {name!r} given twice")
    for need in ("model", "chip"):
        have = need in names or (need == "chip" and "hardware" in names)
        if not have:
            raise ValueError(
                f"{path}, line {header_line}: no {need!r} column (the header names "
                f"{', '.join(names)}; a scenario needs model, chip and traffic columns)"
            )
    if "traffic" not in names and not {"prompt", "output"} <= set(names):
        raise ValueError(
            f"{path}, line {header_line}: no 'traffic' column (a preset name), nor both "
            "'prompt' and 'output' (mean tokens)"
        )
    chip_col = names.index("chip") if "chip" in names else names.index("hardware")
    if len(numbered) == 1:
        raise ValueError(f"{path}: no scenario below the header (line {header_line})")
    out: list[tuple[int, dict, object]] = []
    for line, row in numbered[1:]:
        if len(row) != len(names):
            raise _Bad(
                f"{path}, line {line}: {len(row)} cells, but the header (line {header_line}) "
                f"names {len(names)} columns"
            )
        cells = {name: row[j].strip() for j, name in enumerate(names)}
        cells["chip"] = row[chip_col].strip()

        def cell(name, parse, default=None, line=line, cells=cells):
            if name not in names or cells[name] == "":
                return default
            j = names.index(name)
            try:
                return parse(cells[name])
            except (argparse.ArgumentTypeError, ValueError) as err:
                raise bad(line, j, f"{cells[name]!r}: {err}") from None

        def choice(known, what):
            def parse(text):
                if text not in known:
                    raise ValueError(f"unknown {what}; known: {', '.join(known)}")
                return text

            return parse

        model = cell("model", choice(model_names(), "model"))
        chip = cell("chip" if "chip" in names else "hardware", choice(hardware_names(), "chip"))
        for name, value in (("model", model), ("chip", chip)):
            if value is None:
                j = names.index(name) if name in names else chip_col
                raise bad(line, j, "empty cell: every scenario names its " + name)
        preset = cell("traffic", choice(traffic_names(), "traffic preset"))
        rate = cell("rate", positive, defaults["rate"])
        if rate is None:
            j = names.index("rate") if "rate" in names else len(names)
            raise _Bad(
                f"{path}, line {line}, column {j + 1} (rate): no rate (requests/s): give a "
                "rate column or --rate"
            )
        fields = {
            key: value
            for key, value in (
                ("prompt_tokens", cell("prompt", positive)),
                ("output_tokens", cell("output", positive)),
                ("prompt_cv", cell("prompt_cv", non_negative)),
                ("output_cv", cell("output_cv", non_negative)),
                ("prefix_hit", cell("prefix_hit", _fraction)),
            )
            if value is not None
        }
        if preset is None and not {"prompt_tokens", "output_tokens"} <= set(fields):
            missing = "traffic" if "traffic" in names else "prompt"
            raise bad(
                line,
                names.index(missing),
                "empty cell: give a traffic preset, or both prompt and output (mean tokens)",
            )
        try:
            t = traffic(preset, rate=rate, **fields) if preset else Traffic(rate, **fields)
        except ValueError as err:
            raise _Bad(f"{path}, line {line}: {err}") from None
        engine = cell("engine", choice(_ENGINES, "engine"), "none")
        scenario = Scenario(
            model=model,
            hardware=chip,
            traffic=t,
            ttft_slo=cell("ttft", parse_slo, defaults["ttft"]),
            tpot_slo=cell("tpot", parse_slo, defaults["tpot"]),
            mode=cell(
                "mode", choice(("aggregated", "disaggregated", "best"), "mode"), defaults["mode"]
            ),
            engine=None if engine == "none" else engine,
        )
        out.append((line, cells, scenario))
    return out


def _number(x: float) -> str:
    return "" if not math.isfinite(x) else repr(float(x))


def _row(line: int, cells: dict, p) -> dict:
    replicas = {pool.role: pool.replicas for pool in p.pools}
    return {
        "line": line,
        **{k: v for k, v in cells.items() if k != "hardware"},
        "plan_mode": p.mode,
        "feasible": str(p.feasible).lower(),
        "chips": p.chips if p.feasible else "",
        "aggregated_replicas": replicas.get("aggregated", ""),
        "prefill_replicas": replicas.get("prefill", ""),
        "decode_replicas": replicas.get("decode", ""),
        "layout": "; ".join(f"{pool.role}: {pool.describe()}" for pool in p.pools),
        "cost_per_hour": _number(p.cost_per_hour),
        "cost_per_million_input": _number(p.cost_per_million_input),
        "cost_per_million_output": _number(p.cost_per_million_output),
        "binding": p.binding or "",
        "message": p.message,
    }


def cmd_sweep(args) -> int:
    """``dcost plan --scenarios``: exit 0 when every scenario was planned (feasible or not; the
    ``feasible`` column says which), 2 for a bad file or option."""
    import jax

    from dcost.planning.sweep import ScenarioError, plan_sweep
    from dcost.search._jit import prefer_fast_compile

    if args.coordinator is not None:
        jax.distributed.initialize(
            coordinator_address=args.coordinator,
            num_processes=args.num_processes,
            process_id=args.process_id,
        )
    from dcost.planning.planner import Options

    unused = [
        flag
        for flag, used in (
            ("--hardware", args.hardware is not None),
            ("--model", args.model is not None),
            ("--calibrated", args.calibrated),
            ("--precision", args.precision != "auto"),
            ("--json", args.json),
            ("--simulate", args.simulate != 0),
            ("--confidence", args.confidence is not None),
            ("--engine", args.engine not in ("all", "none")),
            ("--profile", args.profile is not None),
        )
        if used
    ]
    if unused:
        raise ValueError(
            f"{', '.join(unused)}: not used with --scenarios (the file's columns name the chip, "
            "model and engine of each scenario)"
        )
    if args.max_chips < 1:
        raise ValueError(f"--max-chips must be >= 1, got {args.max_chips}")
    defaults = {"rate": args.rate, "ttft": args.ttft, "tpot": args.tpot, "mode": args.mode}
    rows = read_scenarios(args.scenarios, defaults)
    try:
        with prefer_fast_compile():
            plans = plan_sweep(
                [s for _, _, s in rows],
                block=args.block,
                acceptance=args.acceptance,
                max_utilisation=args.max_utilisation,
                options=Options(max_chips=args.max_chips),
            )
    except ScenarioError as err:
        line = rows[err.index][0]
        raise ValueError(f"{args.scenarios}, line {line}: {str(err).split(': ', 2)[-1]}") from None
    if jax.process_index() != 0:
        return 0
    names = ["line", *(c for c in COLUMNS if c != "hardware" and any(c in r[1] for r in rows))]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[*names, *OUTPUT_COLUMNS], lineterminator="\n")
    writer.writeheader()
    for (line, cells, _), p in zip(rows, plans, strict=True):
        writer.writerow(_row(line, cells, p))
    if args.out is None:
        print(buffer.getvalue(), end="")
    else:
        pathlib.Path(args.out).write_text(buffer.getvalue(), encoding="utf-8")
        feasible = int(sum(p.feasible for p in plans))
        print(f"{len(plans)} plans ({feasible} feasible) written to {args.out}")
    return 0


def add_arguments(p) -> None:
    """``--scenarios``, ``--out``, ``--block`` and the ``jax.distributed`` options on
    ``dcost plan``'s parser."""
    p.add_argument(
        "--scenarios",
        metavar="FILE.csv",
        default=None,
        help="plan every row of a CSV file (columns model, chip, traffic, rate, ttft, tpot, "
        "mode, engine; see docs) and write a CSV of plans; --hardware/--model then unused",
    )
    p.add_argument("--out", metavar="FILE.csv", default=None, help="with --scenarios: write here")
    p.add_argument(
        "--block",
        type=int,
        default=256,
        help="with --scenarios: most scenarios per unit of work (a power of two >= 16)",
    )
    p.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        default=None,
        help="with --scenarios: join jax.distributed (every process runs the same command)",
    )
    p.add_argument("--num-processes", type=int, default=None, help="with --coordinator")
    p.add_argument("--process-id", type=int, default=None, help="with --coordinator")
