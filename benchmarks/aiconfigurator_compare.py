"""dcost's engine profiles and AIConfigurator 0.12 side by side on the same silicon-sample rows.

    python benchmarks/aiconfigurator_compare.py               # 300 TPOT rows, seed 0
    python benchmarks/aiconfigurator_compare.py --rows 60     # a smaller subset
    python benchmarks/aiconfigurator_compare.py --no-install  # never create the venv
    python benchmarks/aiconfigurator_compare.py --aiconfigurator-from \
        benchmarks/results/aiconfigurator_silicon.json        # its answers of an earlier run

**The rows.** ``dcost.validation.silicon.records()`` turns AIConfigurator's measured silicon sample
(``systems/silicon_sample.csv`` of aiconfigurator-core 0.12.0) into records; of its TPOT records a
stratified subset is drawn with a fixed seed: one row of every (engine, chip, model, mode) stratum,
the rest uniformly at random, so every engine, chip, model and mode is represented.

**dcost** predicts every TPOT record with its engine's profile (``silicon.predict_all``, one
batched evaluation); the engine's fixed costs per step, layer and sequence are fitted per engine
leaving the row's model out (``dcost.calibrate.host.held_out_host``) on ALL TPOT rows of the other
models, not only on the subset, so the subset's predictions are the held-out ones of the whole
sample. Its time per prediction is that whole batched run (JIT compilation included) plus the
held-out fits, divided by the number of TPOT records.

**AIConfigurator 0.12** (ai-dynamo/aiconfigurator, PyPI ``aiconfigurator==0.12.0``, Apache-2.0) is
installed into its own virtual environment, ``benchmarks/.venv-aic/`` (never a dependency of
dcost; the script writes a ``.gitignore`` of ``*`` into it), and called there through its
public Python API, ``aiconfigurator.cli.api.cli_estimate`` (the ``aiconfigurator cli estimate``
command), by a small driver written to a temporary directory: one call per row with the row's
own configuration (model path, system, backend, isl, osl, GEMM and MoE quantization, layout,
``batch_size`` = the client concurrency for aggregated rows; the prefill and decode pools'
layouts, batch sizes and worker counts for disaggregated rows), its defaults otherwise: database
mode SILICON, the backend's current database version (0.12 only queries its version slots, not
the row's engine version), its own KV-cache and correction defaults. Checkpoints it bundles no
config for are replaced by the same architecture's bundled config (Llama 3.1 8B/70B Instruct ->
Meta-Llama-3.1-8B/70B, nvidia/Qwen3-32B-NVFP4 -> Qwen/Qwen3-32B), the quantization passed
explicitly; each row records the path used. Each call is timed (wall clock, in that process,
after a first warm-up call on the first row). A row AIConfigurator refuses is counted and
reported with its error; a row that takes longer than ``--row-timeout`` is abandoned (the
driver process is killed and restarted on the remaining rows), and the whole run stops at
``--budget`` seconds, so the script never hangs.

``--aiconfigurator-from RESULT`` takes AIConfigurator's answers (TPOT, TTFT, seconds, error) per
row from an earlier run's result file instead of running it again, so that dcost's side can be
redone after its profiles change (AIConfigurator's own answers do not depend on dcost): the rows
are that run's rows that are still TPOT records (``--rows`` and ``--seed`` are not used; a row
the sample now counts out, e.g. a repeat counted once, is dropped and counted), and the result
names the file it reused.

Writes ``benchmarks/results/aiconfigurator_silicon.json``: per row the ids, the measured TPOT,
both predictions (s), AIConfigurator's TTFT and error if any, and the summary table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import select
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "aiconfigurator_silicon.json"
AIC = "aiconfigurator==0.12.0"

# bundled AIConfigurator configs of the same architecture, for sample checkpoints it has none of
SUBSTITUTE = {
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "nvidia/Qwen3-32B-NVFP4": "Qwen/Qwen3-32B",
}

DRIVER = r"""
import json, logging, sys, sysconfig, time, warnings
logging.disable(logging.CRITICAL)
warnings.filterwarnings("ignore")
from importlib import metadata
from aiconfigurator.cli.api import cli_estimate

SUB = json.loads(sys.argv[1])
ROWS = sys.argv[2]
SITE = sysconfig.get_paths()["purelib"]  # kept out of the messages: no local path in results


def i(row, key):
    v = row.get(key) or ""
    return int(float(v)) if v != "" else None


def kwargs(row):
    path = row["model_path"]
    kw = dict(
        model_path=SUB.get(path, path),
        system_name=row["system"],
        mode=row["mode"],
        backend_name=row["backend"],
        isl=int(float(row["isl"])),
        osl=int(float(row["osl"])),
        gemm_quant_mode=row["gemm_quant_mode"] or None,
        moe_quant_mode=row["moe_quant_mode"] or None,
    )
    if row["mode"] == "agg":
        kw.update(
            batch_size=int(row["clients"]),
            tp_size=i(row, "tp_size") or 1,
            pp_size=i(row, "pp_size") or 1,
            attention_dp_size=i(row, "attention_dp_size") or 1,
            moe_tp_size=i(row, "moe_tp_size"),
            moe_ep_size=i(row, "moe_ep_size"),
        )
    else:
        for pool in ("prefill", "decode"):
            for f in ("tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size",
                      "batch_size", "num_workers"):
                kw[f"{pool}_{f}"] = i(row, f"{pool}_{f}")
        kw["tp_size"] = kw["decode_tp_size"] or 1
    return kw


print(json.dumps({"version": metadata.version("aiconfigurator")}), flush=True)
warm = False
for line in open(ROWS):
    row = json.loads(line)
    out = {"id": row["id"]}
    try:
        out["model_path_used"] = SUB.get(row["model_path"], row["model_path"])
        kw = kwargs(row)
        if not warm:  # first call loads the databases: not timed
            try:
                cli_estimate(**kw)
            except Exception:
                pass
            warm = True
        t0 = time.perf_counter()
        r = cli_estimate(**kw)
        out["seconds"] = time.perf_counter() - t0
        out["tpot_ms"] = float(r.tpot)
        out["ttft_ms"] = float(r.ttft)
        out["backend_version_used"] = getattr(r, "backend_version", None)
    except Exception as err:  # a refused row: counted and reported with its error
        msg = " ".join(str(err).split()).replace(SITE, "<site-packages>")
        out["error"] = f"{type(err).__name__}: {msg[:300]}"
    print(json.dumps(out), flush=True)
"""


# ------------------------------------------------------------------------------- the rows


def draw(tp: list[dict], n: int, seed: int) -> list[int]:
    """Indices of a stratified subset: one row per (engine, hardware, model, mode) stratum,
    then uniformly at random without replacement up to ``n``."""
    rng = np.random.default_rng(seed)
    strata: dict[tuple, list[int]] = defaultdict(list)
    for k, r in enumerate(tp):
        strata[(r["engine"], r["hardware"], r["model"], r["mode"])].append(k)
    chosen = sorted(int(rng.choice(v)) for _, v in sorted(strata.items()))
    rest = np.setdiff1d(np.arange(len(tp)), chosen)
    extra = rng.choice(rest, size=max(0, min(n - len(chosen), rest.size)), replace=False)
    return sorted(chosen + [int(e) for e in extra])


# ---------------------------------------------------------------------------------- dcost


def dcost_predictions(tp: list[dict]):
    """Held-out engine-profile TPOT predictions (s) for every TPOT record, and seconds taken."""
    from dcost.calibrate import host
    from dcost.validation import silicon

    t0 = time.perf_counter()
    P = silicon.predict_all(tp, family=False)
    bound = P.pure <= P.measured * (1 + 1e-6)
    eng = np.array([r["engine"] for r in tp])
    mod = np.array([r["model"] for r in tp])
    slopes = P.slopes
    c = host.held_out_host(P.engine_base, slopes, P.measured, eng, mod, mask=bound, balance=mod)
    pred = P.engine(*c.T)
    return np.asarray(pred), time.perf_counter() - t0, list(P.engine_label)


# ------------------------------------------------------------------------- AIConfigurator


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _has_aic(python: Path) -> bool:
    if not python.exists():
        return False
    probe = subprocess.run(
        [str(python), "-c", "import aiconfigurator.cli.api"], capture_output=True, timeout=300
    )
    return probe.returncode == 0


def ensure_aic(venv: Path, install: bool):
    """A Python that imports AIConfigurator, creating ``venv`` if needed; or (None, why)."""
    python = _venv_python(venv)
    if _has_aic(python):
        return python, None
    if not install:
        return None, f"not installed in {venv.name}/ (run once without --no-install)"
    print(f"installing {AIC} into {venv.name}/ (a separate virtual environment) ...", flush=True)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", AIC],
    ]
    for cmd in steps:
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as err:
            return None, f"`{' '.join(cmd[:4])} ...` failed: {err}"
        if cmd[0] == sys.executable:
            (venv / ".gitignore").write_text("*\n")
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            return None, f"`{' '.join(cmd[:4])} ...` failed: {tail[0]}"
    if not _has_aic(python):
        return None, "installed, but `import aiconfigurator.cli.api` fails in its venv"
    return python, None


def aic_predictions(python: Path, rows: list[dict], row_timeout: float, budget: float):
    """AIConfigurator's estimate per row (dicts in row order) and its version. Restarts the
    driver past a row that exceeds ``row_timeout``; stops at ``budget`` seconds."""
    results: dict[str, dict] = {}
    version = None
    deadline = time.monotonic() + budget
    pending = list(rows)
    with tempfile.TemporaryDirectory() as tmp:
        driver = Path(tmp) / "aic_driver.py"
        driver.write_text(DRIVER)
        while pending and time.monotonic() < deadline:
            todo = Path(tmp) / "rows.jsonl"
            todo.write_text("".join(json.dumps(r) + "\n" for r in pending))
            # rows from a file, answers on a pipe read as they come: no pipe can fill up
            proc = subprocess.Popen(
                [str(python), str(driver), json.dumps(SUBSTITUTE), str(todo)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
            )
            assert proc.stdout is not None
            fd, buf = proc.stdout.fileno(), b""
            started = False
            current = 0
            # the import and the first (warm-up) call may take longer than one row
            limit = time.monotonic() + 4 * row_timeout
            while current < len(pending):
                while b"\n" not in buf:  # unbuffered reads: select sees every byte
                    left = min(limit, deadline) - time.monotonic()
                    if left <= 0 or not select.select([fd], [], [], left)[0]:
                        break
                    chunk = os.read(fd, 1 << 16)
                    if not chunk:
                        break
                    buf += chunk
                if b"\n" not in buf:
                    break
                line, buf = buf.split(b"\n", 1)
                msg = json.loads(line)
                if not started:
                    version, started = msg["version"], True
                else:
                    results[msg["id"]] = msg
                    current += 1
                    if len(results) % 25 == 0:
                        print(f"  {len(results)} rows answered", flush=True)
                limit = time.monotonic() + (4 if current <= 1 else 1) * row_timeout
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if current < len(pending):
                stuck = pending[current]
                if time.monotonic() >= deadline:
                    why = f"not run: the {budget:.0f} s budget ran out"
                    for r in pending[current:]:
                        results[r["id"]] = {"id": r["id"], "error": why}
                    pending = []
                else:
                    why = f"no answer within {row_timeout:g} s (driver killed)"
                    if proc.returncode not in (0, -9):
                        why = f"the driver exited with status {proc.returncode}"
                    if not started:
                        why = f"the driver did not start (exit {proc.returncode})"
                    results[stuck["id"]] = {"id": stuck["id"], "error": why}
                    pending = pending[current + 1 :]
            else:
                pending = []
    for r in rows:
        results.setdefault(r["id"], {"id": r["id"], "error": "not run"})
    return [results[r["id"]] for r in rows], version


# ------------------------------------------------------------------------------- the table


def summary(pred: np.ndarray, measured: np.ndarray, seconds: float, n_rows: int) -> dict:
    ok = np.isfinite(pred) & (pred > 0)
    ratio = pred[ok] / measured[ok]
    err = np.abs(ratio - 1.0)
    return {
        "rows": int(ok.sum()),
        "of": n_rows,
        "median_abs_err": float(np.median(err)) if err.size else None,
        "p90_abs_err": float(np.quantile(err, 0.9)) if err.size else None,
        "median_ratio": float(np.median(ratio)) if err.size else None,
        "seconds_per_prediction": seconds,
    }


def _fmt(s: dict) -> str:
    def pct(x):
        return "    -" if x is None else f"{100 * x:5.1f}%"

    ratio = "  -  " if s["median_ratio"] is None else f"{s['median_ratio']:5.3f}"
    t = s["seconds_per_prediction"]
    when = "-" if t is None or not np.isfinite(t) else f"{1e3 * t:8.3f} ms"
    return (
        f"{s['rows']:>4}/{s['of']:<4} {pct(s['median_abs_err'])} {pct(s['p90_abs_err'])}  "
        f"{ratio}  {when:>11}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=300, help="rows in the subset (default 300)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--venv", type=Path, default=ROOT / "benchmarks" / ".venv-aic")
    ap.add_argument("--no-install", action="store_true", help="never create the venv")
    ap.add_argument("--row-timeout", type=float, default=60.0, help="s per AIConfigurator row")
    ap.add_argument("--budget", type=float, default=1200.0, help="s for all AIConfigurator rows")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument(
        "--aiconfigurator-from",
        type=Path,
        default=None,
        help="reuse AIConfigurator's per-row answers of an earlier result file",
    )
    args = ap.parse_args()

    from dcost.validation import silicon

    recs, _ = silicon.records()
    tp = [r for r in recs if r["metric"] == "tpot"]
    earlier, dropped = None, 0
    if args.aiconfigurator_from is not None:
        earlier = json.loads(args.aiconfigurator_from.read_text())
        index = {r["id"]: k for k, r in enumerate(tp)}
        pick = [index[row["id"]] for row in earlier["rows"] if row["id"] in index]
        dropped = len(earlier["rows"]) - len(pick)
    else:
        pick = draw(tp, args.rows, args.seed)
    raw = {row["id"]: row for row in silicon.load_rows()}
    subset = [tp[k] for k in pick]
    how = f"seed {args.seed}" if earlier is None else f"{args.aiconfigurator_from}'s rows"
    print(f"{len(tp)} TPOT records; subset of {len(subset)} ({how})", flush=True)
    if dropped:
        print(f"  {dropped} of its rows are no longer TPOT records: left out", flush=True)

    if earlier is not None:
        python, why = None, None
    else:
        python, why = ensure_aic(args.venv, install=not args.no_install)
    aic_rows = []
    for r in subset:
        rid = r["id"][len("silicon-") : -len("-tpot")]
        row = dict(raw[rid])
        row["clients"] = (
            silicon.source_field(row["silicon_data_source"], "silicon_concurrency")
            or (row["batch_size"])
        )
        aic_rows.append(row)
    if earlier is not None:
        by_id = {row["id"]: row for row in earlier["rows"]}
        theirs = []
        for r in subset:
            old = by_id[r["id"]]
            t = {"id": old["row_id"], "seconds": old["aiconfigurator_seconds"]}
            if old["aiconfigurator_error"] is not None:
                t = {"id": old["row_id"], "error": old["aiconfigurator_error"]}
            else:
                t["tpot_ms"] = old["aiconfigurator_tpot_s"] * 1e3
                if old["aiconfigurator_ttft_s"] is not None:
                    t["ttft_ms"] = old["aiconfigurator_ttft_s"] * 1e3
                t["model_path_used"] = old["aiconfigurator_model_path"]
            theirs.append(t)
        version = earlier["aiconfigurator"]["version"]
        aic_wall = earlier["aiconfigurator_wall_seconds"]
        print(f"AIConfigurator: its answers of {args.aiconfigurator_from}", flush=True)
    elif python is None:
        print(f"AIConfigurator: {why}", flush=True)
        theirs, version = [{"id": row["id"], "error": why} for row in aic_rows], None
        aic_wall = 0.0
    else:
        print(
            f"AIConfigurator: predicting {len(aic_rows)} rows in {args.venv.name}/ ...", flush=True
        )
        t0 = time.perf_counter()
        theirs, version = aic_predictions(python, aic_rows, args.row_timeout, args.budget)
        aic_wall = time.perf_counter() - t0

    print(
        "dcost: predicting every TPOT record (held-out fixed costs need all of them) ...",
        flush=True,
    )
    ours_all, dcost_s, labels = dcost_predictions(tp)
    ours = ours_all[pick]
    measured = np.array([r["value"] for r in subset])
    aic = np.array([t["tpot_ms"] * 1e-3 if "tpot_ms" in t else np.nan for t in theirs])
    aic_times = [t["seconds"] for t in theirs if "seconds" in t]
    aic_s = float(np.median(aic_times)) if aic_times else None
    both = np.isfinite(aic) & (aic > 0) & np.isfinite(ours)

    table: dict[str, dict] = {}
    engines = sorted({r["engine"] for r in subset})
    groups = [("all", np.ones(len(subset), bool))]
    groups += [(e, np.array([r["engine"] for r in subset]) == e) for e in engines]
    groups += [(m, np.array([r["mode"] for r in subset]) == m) for m in ("agg", "disagg")]
    label = f"AIConfigurator {version or '0.12'}"
    print()
    print(
        f"TPOT on the same silicon rows (both answered: {int(both.sum())} of {len(subset)}); "
        "|pred/measured - 1|"
    )
    print(f"{'group':<8} {'tool':<22} {'rows':>9} {'median':>6} {'p90':>6}  ratio  per prediction")
    for name, g in groups:
        m = g & both
        a = summary(aic[m], measured[m], aic_s, int(g.sum()))
        d = summary(ours[m], measured[m], dcost_s / len(tp), int(g.sum()))
        table[name] = {"aiconfigurator": a, "dcost": d}
        print(f"{name:<8} {label:<22} {_fmt(a)}")
        print(f"{'':<8} {'dcost (held out)':<22} {_fmt(d)}")
    d_own = summary(ours, measured, dcost_s / len(tp), len(subset))
    print(
        f"dcost on all {len(subset)} subset rows (those AIConfigurator refused too): {_fmt(d_own)}"
    )
    errors: dict[str, int] = defaultdict(int)
    for t in theirs:
        if "error" in t:
            errors[t["error"][:160]] += 1
    print(f"AIConfigurator refused or failed {sum(errors.values())} rows:")
    for e, k in sorted(errors.items(), key=lambda kv: -kv[1]):
        print(f"  {k:>4}  {e}")
    print(
        f"time per prediction: AIConfigurator median of {len(aic_times)} timed calls "
        f"(wall {aic_wall:.0f} s incl. start-up); dcost {dcost_s:.1f} s for all {len(tp)} "
        f"TPOT records in one batched run (JIT and held-out fits included) / {len(tp)}"
    )

    out = {
        "benchmark": "benchmarks/aiconfigurator_compare.py",
        "command": "python benchmarks/aiconfigurator_compare.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "aiconfigurator": {
            "version": version,
            "install": AIC,
            "unavailable": why,
            **(
                {
                    "answers_from": str(args.aiconfigurator_from),
                    # the run that asked AIConfigurator (carried over a reuse of a reuse)
                    "answers_run": earlier["aiconfigurator"].get("answers_run", earlier["date"]),
                    "answers_command": earlier["aiconfigurator"].get(
                        "answers_command", earlier["command"]
                    ),
                    "rows_no_longer_records": dropped,
                }
                if earlier is not None
                else {}
            ),
        },
        "seed": args.seed if earlier is None else earlier["seed"],
        "tpot_records": len(tp),
        "subset": len(subset),
        "dcost_seconds_all_records": dcost_s,
        "aiconfigurator_wall_seconds": aic_wall,
        "table": table,
        "dcost_all_subset_rows": d_own,
        "aiconfigurator_errors": dict(errors),
        "rows": [
            {
                "id": r["id"],
                "row_id": row["id"],
                "engine": r["engine"],
                "engine_version": r.get("engine_version"),
                "hardware": r["hardware"],
                "model": r["model"],
                "mode": r["mode"],
                "concurrency": r["concurrency"],
                "measured_tpot_s": float(measured[k]),
                "dcost_tpot_s": float(ours[k]),
                "dcost_profile": labels[pick[k]],
                "aiconfigurator_tpot_s": None if not np.isfinite(aic[k]) else float(aic[k]),
                "aiconfigurator_ttft_s": theirs[k].get("ttft_ms", np.nan) * 1e-3
                if "ttft_ms" in theirs[k]
                else None,
                "measured_ttft_s": float(row["silicon_ttft_ms"]) * 1e-3,
                "aiconfigurator_seconds": theirs[k].get("seconds"),
                "aiconfigurator_model_path": theirs[k].get("model_path_used"),
                "aiconfigurator_error": theirs[k].get("error"),
            }
            for k, (r, row) in enumerate(zip(subset, aic_rows, strict=True))
        ],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
