"""How long a person waits: the dcost command line cold and warm, and the public API's first calls.

    python benchmarks/cli_latency.py             # everything; peers installed on first use
    python benchmarks/cli_latency.py --quick     # presets, eval, optimize; no peers, no API table
    python benchmarks/cli_latency.py --no-peers  # dcost only
    python benchmarks/cli_latency.py --only plan "plan, next question" simulate

Three tables, every figure from a subprocess run under a timeout (``--timeout``, default 600 s):

1. **Processes.** ``python -c "import dcost"`` and each subcommand (``presets``, ``eval``,
   ``optimize``, ``grid``, ``train``, ``lifetime``, ``warmup``, ``plan``, ``simulate``) as a
   whole process, end to end (the ``dcost`` console script beside the interpreter, else
   ``python -m dcost``): *cold* against an empty persistent compilation cache
   (``DCOST_CACHE_DIR`` pointed at a fresh temporary directory; ``plan, next question``, another
   model, chip and traffic, and ``plan, another profile``, the same question on vLLM's profile,
   against the cache the README's ``plan`` left) and *warm* on the
   runs after it against the same directory (the median
   of ``--warm-runs``, default 3, each run's wall time printed beneath). Wall time and CPU
   time (user + system of the child, from ``getrusage``) are both printed: on a shared machine the
   wall time moves with the other work, the CPU time much less.
2. **Peers on the same question** (llama-3-70b on 8 x H100, time per output token <= 50 ms):
   ``dcost optimize`` restricted to 8 chips and one stage, llm-analysis's ``infer`` command
   (cli99/llm-analysis, an analytical estimator: one design, no search) and aiconfigurator's
   ``cli default`` (NVIDIA's configurator, searching its measured performance database for the
   best configuration at ``--tpot 50``). The peers are installed from PyPI into ``.bench-venv/``
   (a separate virtual environment at the repository root, never a dependency of dcost); when one
   cannot be installed or run (offline, say) the table says why and the benchmark goes on.
3. **Public functions in one process** (persistent cache off, so the first call pays the whole
   trace and compile): the first call of ``decode``, ``prefill``, ``mixed_step``,
   ``balance_batch``, ``critical_context``, ``optimize``, ``grid_search``, ``sensitivity`` and
   ``pareto``, and the median of later calls (as many as fit in ``--call-seconds``, at least 3);
   for the five cost functions also the median of their bodies run eagerly, op by op, as they
   ran before they were jitted. ``--api-only`` prints
   this table alone.

The model questions: ``eval`` llama-3-70b on 8 x h100-sxm at batch 64, context 4096;
``optimize`` and ``grid`` the demo's scenario (deepseek-v3 on gb200-nvl72, context 8192, tpot <=
50 ms); ``train`` 70e9 parameters on 15e12 tokens with 4096 H100s; ``lifetime`` loss 1.95 at 2e12
inference tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PEERS = ("llm-analysis==0.2.2", "aiconfigurator==0.12.0")
_SEARCH = [
    "--hardware",
    "gb200-nvl72",
    "--model",
    "deepseek-v3",
    "--context",
    "8192",
    "--tpot-slo",
    "50ms",
]
COMMANDS = {
    "presets": ["presets"],
    "eval": ["eval", "--hardware", "h100-sxm", "--model", "llama-3-70b", "--batch", "64"]
    + ["--chips", "8", "--context", "4096"],
    "optimize": ["optimize", *_SEARCH],
    "grid": ["grid", *_SEARCH],
    "train": ["train", "--params", "70e9", "--tokens", "15e12", "--hardware", "h100-sxm"]
    + ["--chips", "4096", "--mfu", "0.45"],
    "lifetime": ["lifetime", "--loss", "1.95", "--inference-tokens", "2e12"],
    "warmup": ["warmup"],
    # the README's planning question
    "plan": ["plan", "--hardware", "h100-sxm", "--model", "llama-3-70b", "--traffic", "chat"]
    + ["--rate", "100", "--calibrated", "--engine", "none"],
    # another question after the README's (its cold run finds the README plan's programs: a
    # model and chip with a similar count of layouts share them, dcost.planning.planner._padded)
    "plan, next question": ["plan", "--hardware", "a100-80gb", "--model", "llama-3-8b"]
    + ["--traffic", "code-completion", "--rate", "40", "--calibrated", "--engine", "none"],
    # the README's question on vLLM's profile after it (Hardware.filled: one structure of the
    # planner's programs for pure physics, the family profile and every engine's)
    "plan, another profile": ["plan", "--hardware", "h100-sxm", "--model", "llama-3-70b"]
    + ["--traffic", "chat", "--rate", "100", "--engine", "vllm"],
    # one deployment under a closed-loop load, vLLM's profile
    "simulate": ["simulate", "--hardware", "h100-sxm", "--model", "llama-3.1-8b"]
    + ["--engine", "vllm", "--clients", "64", "--prompt", "1024", "--output", "256"],
}
# commands whose cache is first filled by another command's run
AFTER = {"plan, next question": "plan", "plan, another profile": "plan"}
QUICK = ("presets", "eval", "optimize")
# llama-3-70b on 8 x H100, time per output token <= 50 ms
PEER_QUESTION = {
    "dcost optimize": [
        *("optimize", "--hardware", "h100-sxm", "--model", "llama-3-70b", "--context", "4096"),
        *("--prompt", "4000", "--tpot-slo", "50ms", "--max-chips", "8", "--max-stages", "1"),
    ],
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="presets, eval, optimize; no peers/API")
    p.add_argument("--no-peers", action="store_true", help="skip llm-analysis and aiconfigurator")
    p.add_argument("--no-api", action="store_true", help="skip the public-function table")
    p.add_argument("--api-only", action="store_true", help="only the public-function table")
    p.add_argument(
        "--only",
        nargs="+",
        choices=sorted(COMMANDS),
        metavar="COMMAND",
        help=f"only these processes (no peers, no API table): {', '.join(COMMANDS)}",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="limit per subprocess, seconds")
    p.add_argument("--warm-runs", type=int, default=3, help="warm runs per command (median)")
    p.add_argument("--call-seconds", type=float, default=1.0, help="time per steady-state call")
    p.add_argument("--venv", type=Path, default=ROOT / ".bench-venv", help="peers' environment")
    p.add_argument("--api-child", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------ processes


def _env(cache_dir: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "DCOST_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if cache_dir is None:
        env["DCOST_CACHE"] = "0"
    else:
        env["DCOST_CACHE_DIR"] = str(cache_dir)
    return env


def timed(cmd: list[str], env: dict, timeout: float, cwd=None) -> dict:
    """Run ``cmd`` under ``timeout``: wall and CPU seconds, exit code, the output's tail."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd or ROOT
        )
        code, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        code, out = None, f"timed out after {timeout:g} s"
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    tail = out.strip().splitlines()[-1:] or [""]
    return {"wall": wall, "cpu": cpu, "code": code, "tail": tail[0]}


def dcost_cmd(argv) -> list[str]:
    """The ``dcost`` console script beside this interpreter (what a person runs), else
    ``python -m dcost``."""
    script = Path(sys.executable).with_name("dcost")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script), *argv]
    return [sys.executable, "-m", "dcost", *argv]


def cold_and_warm(argv, timeout, warm_runs: int = 3, before=None) -> tuple[dict, dict]:
    """The same command against an empty cache directory (or one that the command ``before``
    filled), then ``warm_runs`` times again against what it left: the warm run of median wall
    time, with every warm run's wall time (``"walls"``; a shared machine's figures move from
    run to run)."""
    cache = Path(tempfile.mkdtemp(prefix="dcost-bench-cache-"))
    try:
        if before is not None:
            timed(dcost_cmd(before), _env(cache), timeout)
        cold = timed(dcost_cmd(argv), _env(cache), timeout)
        runs = [timed(dcost_cmd(argv), _env(cache), timeout) for _ in range(max(warm_runs, 1))]
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    warm = dict(sorted(runs, key=lambda r: r["wall"])[len(runs) // 2])
    warm["walls"] = [r["wall"] for r in runs]
    return cold, warm


def _cell(r: dict | None) -> str:
    if r is None:
        return f"{'-':>8s} {'-':>8s}"
    if r["code"] is None:
        return f"{'timeout':>17s}"
    mark = "" if r["code"] in (0, 1) else f" (exit {r['code']})"
    return f"{r['wall']:8.2f} {r['cpu']:8.2f}{mark}"


def print_processes(rows):
    print(
        "\nprocesses, end to end (s): cold = empty compilation cache (for 'plan, next question'"
        " and 'plan, another profile': the cache 'plan' left), warm = its later runs"
    )
    print(f"  {'':28s} {'cold wall':>8s} {'cpu':>8s}   {'warm wall':>8s} {'cpu':>8s}")
    for label, cold, warm in rows:
        print(f"  {label:28s} {_cell(cold)}   {_cell(warm)}")
        if warm is not None and len(warm.get("walls", ())) > 1:
            walls = " ".join(f"{w:.2f}" for w in warm["walls"])
            print(f"    warm runs (wall, in order; the median above): {walls}")
        for r in (cold, warm):
            if r is not None and r["code"] not in (0, 1):
                print(f"    {r['tail']}")
                break


# ---------------------------------------------------------------------------------------- peers


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _imports(python: Path, module: str) -> bool:
    if not python.exists():
        return False
    try:
        probe = subprocess.run(
            [str(python), "-c", f"import {module}"], capture_output=True, timeout=300
        )
    except subprocess.TimeoutExpired:
        return False
    return probe.returncode == 0


def ensure_peer(venv: Path, requirement: str, module: str, timeout: float):
    """A Python of ``venv`` that imports ``module``, installing ``requirement``; or (None, why)."""
    python = _venv_python(venv)
    if _imports(python, module):
        return python, None
    print(f"installing {requirement} into {venv.name}/ (a separate virtual environment) ...")
    steps = []
    if not python.exists():
        steps.append([sys.executable, "-m", "venv", str(venv)])
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    steps.append([*pip, "--retries", "1", "--timeout", "20", requirement])
    for cmd in steps:
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=max(timeout, 1200))
        except (OSError, subprocess.TimeoutExpired) as err:
            return None, f"`{' '.join(cmd[:5])} ...` failed: {err}"
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            return None, f"install failed: {tail[0]}"
    if not _imports(python, module):
        return None, f"installed, but `import {module}` fails"
    return python, None


def llama_3_70b_card(directory: Path) -> Path:
    """llama-3-70b from dcost's preset as an llm-analysis model file (its package has no such card).

    llm-analysis counts two MLP matrices of ``d x ffn``; a SwiGLU MLP has three of ``d x d_ff``, so
    ``ffn = 1.5 d_ff`` gives the same weights (as ``llm_analysis_rate.py`` does).
    """
    sys.path.insert(0, str(ROOT))
    import dcost.presets

    arch = dcost.presets.model_card("llama-3-70b")["arch"]
    card = {
        "name": "llama-3-70b",
        "num_layers": int(arch["n_layers"]),
        "n_head": int(arch["n_heads"]),
        "hidden_dim": int(arch["d_model"]),
        "vocab_size": int(arch["vocab"]),
        "max_seq_len": 8192,
        "num_key_value_heads": int(arch.get("n_kv_heads", arch["n_heads"])),
        "ffn_embed_dim": int(arch["d_ff"]) * 3 // 2,
        "expansion_ratio": int(arch["d_ff"]) * 3 // 2 / int(arch["d_model"]),
        "model_type": "llama",
    }
    path = directory / "llama-3-70b.json"
    path.write_text(json.dumps(card))
    return path


def peer_commands(venv: Path, scratch: Path, timeout: float):
    """(label, command or None, why not) for llm-analysis and aiconfigurator."""
    out = []
    python, why = ensure_peer(venv, PEERS[0], "llm_analysis.analysis", timeout)
    label = "llm-analysis infer (batch 64)"
    if python is None:
        out.append((label, None, why))
    else:
        card = llama_3_70b_card(scratch)
        out.append(
            (
                label,
                [str(python), "-m", "llm_analysis.analysis", "infer", "--model_name", str(card)]
                + ["--gpu_name", "h100-sxm-80gb", "--tp_size", "8", "--batch_size_per_gpu", "64"]
                + ["--seq_len", "4000", "--num_tokens_to_generate", "100"]
                + ["--output_dir", str(scratch), "--log_level", "ERROR"],
                "",
            )
        )
    python, why = ensure_peer(venv, PEERS[1], "aiconfigurator.main", timeout)
    label = "aiconfigurator cli default"
    if python is None:
        out.append((label, None, why))
    else:
        aic = python.parent / "aiconfigurator"
        out.append(
            (
                label,
                [str(aic), "cli", "default", "--model", "meta-llama/Meta-Llama-3.1-70B"]
                + ["--total-gpus", "8", "--system", "h100_sxm", "--tpot", "50"]
                + ["--isl", "4000", "--osl", "1000", "--serving-mode", "agg"],
                "",
            )
        )
    return out


def run_peers(args) -> list:
    rows = []
    cold, warm = cold_and_warm(PEER_QUESTION["dcost optimize"], args.timeout)
    rows.append(("dcost optimize (8 chips)", cold, warm))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "DCOST_"))}
    env["HF_HUB_OFFLINE"] = "1"  # the question must be answerable from what is installed
    with tempfile.TemporaryDirectory() as tmp:  # their outputs land in a scratch directory
        for label, cmd, why in peer_commands(args.venv, Path(tmp), args.timeout):
            if cmd is None:
                rows.append((label, None, None))
                print(f"  {label}: not timed: {why}")
                continue
            first = timed(cmd, env, args.timeout, cwd=tmp)
            second = timed(cmd, env, args.timeout, cwd=tmp)
            rows.append((label, first, second))
    return rows


# ----------------------------------------------------------------------------- public functions


def _median_call(call, seconds: float) -> float:
    times = []
    t_end = time.perf_counter() + seconds
    while len(times) < 3 or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
        if len(times) >= 10_000:
            break
    return statistics.median(times)


def api_child(seconds: float) -> None:
    """In a process of its own (cache off): first call and steady call of each public function,
    and for the cost functions their bodies evaluated eagerly, op by op (what a call cost before
    they were jitted)."""
    import jax

    import dcost

    h, m = dcost.hardware("h100-sxm"), dcost.model("llama-3-70b")
    w = dcost.Workload(4096, prompt=4000, output=500)
    d = dcost.Design(batch=64, chips=8)
    problem = dcost.Problem(h, m, w, free={"batch": (1, 4096), "chips": (1, 8)}, tpot_slo=0.05)

    def sens():
        with jax.enable_x64(True):
            return dcost.sensitivity(problem)

    # the cost functions return once their (checked) results are ready: timed as they are; the
    # searches are waited for
    cost_functions = {
        "decode": lambda: dcost.decode(d, h, m, w),
        "prefill": lambda: dcost.prefill(d, h, m, w),
        "mixed_step": lambda: dcost.mixed_step(d, h, m, w),
        "balance_batch": lambda: dcost.balance_batch(h, m, 4096.0),
        "critical_context": lambda: dcost.critical_context(h, m),
    }
    # the same bodies run eagerly, op by op, as the public functions ran before they were jitted
    # (without the argument checks, which cost ~10 us there)
    from dcost.serving import mixed, roofline

    eager = {
        "decode": lambda: roofline._decode(d, h, m, w, 0.0),
        "prefill": lambda: roofline._prefill(d, h, m, w, 0.0),
        "mixed_step": lambda: mixed._mixed_step(d, h, m, w, 0.0),
        "balance_batch": lambda: roofline._balance_batch.__wrapped__(h, m, 4096.0),
        "critical_context": lambda: roofline._critical_context.__wrapped__(h, m),
    }
    searches = {
        "optimize": lambda: dcost.optimize(problem),
        "grid_search": lambda: dcost.grid_search(problem),
        "sensitivity": sens,
        "pareto": lambda: dcost.pareto(problem, [0.02, 0.03, 0.05, 0.1]),
    }
    out = {}
    for name, call in {**cost_functions, **searches}.items():
        t0 = time.perf_counter()
        jax.block_until_ready(call())
        first = time.perf_counter() - t0
        if name in cost_functions:
            steady = _median_call(call, seconds)
            eager_call = eager[name]
            eager_call()
            eager_s = _median_call(
                lambda eager_call=eager_call: jax.block_until_ready(eager_call()), seconds / 4
            )
        else:
            steady = _median_call(lambda call=call: jax.block_until_ready(call()), seconds)
            eager_s = None
        out[name] = {"first": first, "steady": steady, "eager": eager_s}
    print(json.dumps(out))


def run_api(args):
    cmd = [sys.executable, str(Path(__file__).resolve()), "--api-child"]
    cmd += ["--call-seconds", str(args.call_seconds)]
    r = timed(cmd, _env(None), args.timeout)
    if r["code"] != 0:
        print(f"\npublic functions: not timed ({r['tail']})")
        return
    out = json.loads(r["tail"])
    print("\npublic functions in one process (persistent cache off): first call, later calls")
    print(f"  {'':18s} {'first call':>12s} {'later (median)':>15s} {'eager (median)':>15s}")
    for name, t in out.items():
        eager = "-" if t["eager"] is None else f"{t['eager'] * 1e3:12.3f} ms"
        print(f"  {name:18s} {t['first']:10.3f} s {t['steady'] * 1e3:12.3f} ms {eager:>15s}")


# ------------------------------------------------------------------------------------------ main


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.api_child:
        api_child(args.call_seconds)
        return 0
    machine = f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    if args.api_only:
        print(f"python {sys.version.split()[0]}, {machine}")
        run_api(args)
        print(f"\nload at the end: {os.getloadavg()[0]:.1f} (on {os.cpu_count()} cores)")
        return 0
    print(f"python {sys.version.split()[0]}, {machine}")
    env = _env(None)
    names = tuple(args.only) if args.only else QUICK if args.quick else tuple(COMMANDS)
    rows = [
        ("python -c pass", timed([sys.executable, "-c", "pass"], env, args.timeout), None),
        ("import dcost", timed([sys.executable, "-c", "import dcost"], env, args.timeout), None),
        ("import jax", timed([sys.executable, "-c", "import jax"], env, args.timeout), None),
    ]
    for name in names:
        before = COMMANDS[AFTER[name]] if name in AFTER else None
        cold, warm = cold_and_warm(COMMANDS[name], args.timeout, args.warm_runs, before)
        rows.append((f"dcost {name}", cold, warm))
    print_processes(rows)
    if not (args.quick or args.no_peers or args.only):
        print("\nthe same question: llama-3-70b on 8 x H100, time per output token <= 50 ms")
        print_processes(run_peers(args))
    if not (args.quick or args.no_api or args.only):
        run_api(args)
    print(f"\nload at the end: {os.getloadavg()[0]:.1f} (on {os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
