"""Exact decode evaluations per second: dcost against llm-analysis, a peer analytical estimator.

    python benchmarks/eval_throughput.py            # 10**7 designs, llm-analysis for ~15 s
    python benchmarks/eval_throughput.py --quick    # 3 repeats, ~3 s of llm-analysis, no install
    python benchmarks/eval_throughput.py --designs 1000000   # another size

**dcost.** 10**7 random designs of llama-3-70b on 8 H100 (``Design(batch=B, chips=8)``, batch
uniform in 1..256, context uniform in 128..4096, integers) are evaluated by ONE ``jax.jit`` of
``jax.vmap(dcost.decode(..., smoothness=0))``, inputs already on the device. XLA compilation is
timed apart (``jit(f).lower(...).compile()``); each call is timed to ``block_until_ready`` and
the median of ``--repeats`` calls gives evaluations/s. The calls are made in 3 passes over all
variants (the load of a shared machine falls on all alike), each variant's calls in a row after a
warm-up call (as a sweep calling one function again and again does). The variants:

- full report: the 14 fields of ``dcost.Report`` (v1's 11 and v2's ``t_overhead``, ``t_draft``,
  ``tokens_per_step``), 560 MB of float32 written per call into fresh buffers, with every v2 term
  off (the defaults: v1's numbers); the headline (target of issue 12: >= 2e8/s);
- full report, v2 terms on: the same with every v2 term that applies to a dense model on:
  step and layer overheads, link latencies and efficiencies, matmul efficiency by size, the
  preset's KV heads, data-parallel attention in 2 groups, speculative decoding with 2 draft tokens
  at acceptance 0.7 and a 1B-parameter draft (the serving model v2 target: >= 5e7/s);
- v1 fields only: the 11 fields v1 reported, with the v2 terms off;
- full report, donated: the same, with the previous call's outputs donated back
  (``donate_argnums``), so the buffers are reused rather than freshly allocated;
- cost_per_token only: one output field (XLA drops the rest);
- full report summed in-graph: every field is computed, one array is written;
- **the bound**, a bare kernel that reads the same inputs and writes as many float arrays of the
  same size into fresh buffers, with one multiply-add each: what the memory system allows for
  these bytes, measured in the same run (and its donated twin);
- ``dcost.decode`` called on the arrays themselves (no vmap: a batch is the same call with array
  fields), its check that every result is finite included (one fused reduction over them).

What bounds the full report on a CPU is memory, not arithmetic: XLA's CPU backend emits one loop
per output field (the "kernels" column; it does no multi-output fusion here), and at 10**7
designs each writes a 40 MB buffer that glibc's ``malloc`` maps fresh from the kernel (above its
largest ``mmap`` threshold, 32 MB) and unmaps when it is freed: every call faults in 560 MB of
new zeroed pages, which costs far more than the arithmetic; the bare kernel pays the same. At
10**6 designs (4 MB buffers) ``malloc`` reuses its heap and the faults vanish. The benchmark
therefore prints the table twice: as the process runs by default, and in a child process started
with ``GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=...`` (every buffer from
the heap, freed pages kept), where fresh outputs cost what donated ones do. Set that variable when
starting a process that sweeps 10**7 designs at a time on Linux; dcost does not change the
allocator of the process that imports it. ``--x64`` doubles every byte. The figures move with the
machine's load: memory-bound loops suffer most when other processes run.

**llm-analysis** (cli99/llm-analysis on PyPI) is installed into a separate virtual environment,
``.bench-venv/`` at the repository root (never a dependency of dcost), and timed there by
``benchmarks/llm_analysis_rate.py`` on the same (batch, context) designs for ``--seconds`` of wall
time: one evaluation is one ``LLMAnalysis.inference`` call (tensor parallel 8, efficiencies 1.0,
its ``h100-sxm-80gb`` GPU config, a llama-3-70b-like ``ModelConfig``). That call also estimates
prefill and memory, which a dcost decode evaluation does not: counting dcost's decode + prefill
as one evaluation would halve dcost's rate. Without network access the install fails; the script
says so and still reports dcost's figures (exit status 0).

**Cross-check** (printed for three designs): dcost's ``tpot`` against llm-analysis's
``decode_latency``, the time of one decode step of the batch. The two share the roofline idea and
the H100 figures (989 TFLOP/s, 3.35 TB/s, 450 GB/s NVLink) but differ in assumptions, so
llm-analysis is slower by design, mostly at small batch:

1. llm-analysis adds two tensor-parallel all-reduces per layer *serially*, each at least
   ``intra_node_min_message_latency`` = 8 us: 80 layers x 2 x 8 us = 1.28 ms per step even at
   batch 1. dcost overlaps communication (``max(compute, memory, comm)``) and has no latency term.
2. It reads the KV cache twice ("load and store") per step; dcost reads it once.
3. It reads the whole input-embedding table (vocab x d, 2.1 GB) on one GPU per step (~0.63 ms),
   and charges the LM head compute only; dcost counts both embedding matrices as weights read once
   and split over the 8 chips (~0.16 ms together).
4. It takes max(compute, memory) per sub-layer (attention, MLP) and adds layernorm and activation
   traffic; dcost takes one max over the whole step. Its MLP FLOPs are ``16 B d**2`` per layer
   (a 4d, two-matrix MLP) whatever the model, and its decode FLOPs omit attention over the context
   (``a*T`` in dcost). These matter only where decode is compute bound (batch > ~300 here).
5. It counts two MLP matrices: the benchmark sets its ``ffn = 1.5 * d_ff`` so that the weight
   bytes match llama-3's three SwiGLU matrices; it counts tied embeddings (69.5 B parameters
   against 70.6 B).

Removing 1-3 from llm-analysis's figure (the "llm-analysis, dcost terms" columns) brings it within
3 % of dcost's tpot at every checked design, which is the check that both compute the same roofline;
what is left at small batch is dcost's read of the two embedding matrices (item 3). The all-reduce
volumes agree exactly (same ring formula) where bandwidth, not the 8 us floor, decides.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout: use this repository's dcost

LLM_ANALYSIS = "llm-analysis==0.2.2"  # the version whose API llm_analysis_rate.py was written for
TARGET_RATE = 2e8  # issue 12, at 10**7 designs with fresh outputs
TARGET_RATE_V2 = 5e7  # serving model v2, full report with its terms on (issue 9)
V1_FIELDS = (
    "t_compute",
    "t_weights",
    "t_kv",
    "t_comm",
    "t_hop",
    "t_stage",
    "tpot",
    "tokens_per_s",
    "cost_per_token",
    "memory_per_chip",
    "mfu",
)
TARGET_RATIO = 2e4
BATCH = (1, 256)
CONTEXT = (128, 4096)
CHIPS = 8
CHECKS = ((1, 1024), (32, 2048), (256, 4096))
PASSES = 3


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help="3 repeats, 3 s of llm-analysis, and no install of llm-analysis",
    )
    p.add_argument("--designs", type=int, default=10**7, help="designs per dcost call")
    p.add_argument("--repeats", type=int, default=None, help="timed dcost calls (default 15)")
    p.add_argument(
        "--seconds", type=float, default=None, help="wall time given to llm-analysis (default 15)"
    )
    p.add_argument(
        "--venv",
        type=Path,
        default=ROOT / ".bench-venv",
        help="virtual environment for llm-analysis",
    )
    p.add_argument("--no-llm-analysis", action="store_true", help="time dcost only")
    p.add_argument("--x64", action="store_true", help="evaluate dcost in float64")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child-json", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeats is None:
        args.repeats = 3 if args.quick else 15
    if args.seconds is None:
        args.seconds = 3.0 if args.quick else 15.0
    return args


def designs(n, seed):
    """``n`` random integer designs: batch and context arrays (NumPy int64)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return (rng.integers(BATCH[0], BATCH[1] + 1, n), rng.integers(CONTEXT[0], CONTEXT[1] + 1, n))


# ----------------------------------------------------------------------------------------- dcost


def _loops(compiled) -> int:
    """Kernels (XLA fusions) the entry computation launches: 1 means everything fused."""
    entry = compiled.as_text().split("\nENTRY ", 1)[-1]
    return sum(" fusion(" in line for line in entry.splitlines())


def time_dcost(batch, context, repeats):
    """Compile time and call times of every variant; returns a list of result dicts.

    The variants are timed in ``PASSES`` passes over all of them, so that the load of a shared
    machine falls on all alike; in each pass a variant runs a warm-up call and then its share of
    the ``repeats`` timed calls in a row, as a sweep calling one function again and again would
    (calls of one size in a row let the allocator reuse the pages the previous call freed).
    """
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np

    import dcost

    hw, model = dcost.hardware("h100-sxm"), dcost.model("llama-3-70b")
    dtype = jnp.result_type(float)
    b = jax.device_put(np.asarray(batch, dtype=dtype))
    t = jax.device_put(np.asarray(context, dtype=dtype))
    jax.block_until_ready((b, t))

    def report(b, t):
        return dcost.decode(
            dcost.Design(batch=b, chips=CHIPS), hw, model, dcost.Workload(t), smoothness=0.0
        )

    hw_v2 = dcost.hardware(
        "h100-sxm",
        step_overhead=2e-4,
        layer_overhead=3e-6,
        scaleup_latency=2e-6,
        scaleout_latency=5e-6,
        scaleup_efficiency=0.8,
        scaleout_efficiency=0.7,
        matmul_half_tokens=32.0,
    )
    model_v2 = eqx.tree_at(
        lambda m: (m.draft_params, m.draft_layers),
        model,
        (jnp.asarray(1e9, dtype), jnp.asarray(2.0, dtype)),
    )

    def report_v2(b, t):
        design = dcost.Design(batch=b, chips=CHIPS, attention_dp=2.0, draft_tokens=2.0)
        return dcost.decode(design, hw_v2, model_v2, dcost.Workload(t, acceptance=0.7))

    n_fields = len(dcost.Report.__dataclass_fields__)

    def bare(b, t):
        """The bound: reads batch and context, writes as many float arrays as the report has
        fields, with one multiply-add each (the least arithmetic that writes distinct values)."""
        return tuple(b * t * float(i + 1) + b for i in range(n_fields))

    full = jax.vmap(report)
    # (name, function of (b, t), donate the previous outputs?)
    variants = [
        (f"full report ({n_fields} fields)", full, False),
        ("full report, v2 terms on", jax.vmap(report_v2), False),
        (f"v1's {len(V1_FIELDS)} fields only", lambda b, t: _fields(full(b, t)), False),
        ("full report, outputs donated", full, True),
        ("cost_per_token only", lambda b, t: full(b, t).cost_per_token, False),
        ("full report summed in-graph", lambda b, t: sum(jax.tree.leaves(full(b, t))), False),
        (f"bound: bare kernel, {n_fields} outputs", bare, False),
        (f"bound: bare kernel, {n_fields}, donated", bare, True),
    ]
    compiled, compile_s, state = {}, {}, {}
    for name, fun, donate in variants:  # compile everything before any call: nothing cached
        if donate:
            jitted = jax.jit(
                lambda b, t, previous, fun=fun: fun(b, t), donate_argnums=2, keep_unused=True
            )
            args = (b, t, jax.eval_shape(fun, b, t))
        else:
            jitted, args = jax.jit(fun), (b, t)
        start = time.perf_counter()
        compiled[name] = jitted.lower(*args).compile()
        compile_s[name] = time.perf_counter() - start

    # the public function itself on the arrays (no vmap: a batch is the same call with array
    # fields), its finiteness check included; the specs are built once, outside the timing
    design, work = dcost.Design(batch=b, chips=CHIPS), dcost.Workload(t)
    public = "dcost.decode(arrays), checked"
    start = time.perf_counter()
    jax.block_until_ready(dcost.decode(design, hw, model, work))
    compile_s[public] = time.perf_counter() - start

    def caller(name, fun, donate):
        if name == public:
            return lambda: jax.block_until_ready(dcost.decode(design, hw, model, work))
        if donate:  # each call consumes the previous call's outputs and writes into them
            shapes = jax.eval_shape(fun, b, t)
            state[name] = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)

            def call(name=name):
                state[name] = jax.block_until_ready(compiled[name](b, t, state[name]))

            return call
        return lambda name=name: jax.block_until_ready(compiled[name](b, t))

    names = [v[0] for v in variants] + [public]
    calls = {v[0]: caller(*v) for v in variants}
    calls[public] = caller(public, None, False)
    times = {name: [] for name in names}
    for p in range(PASSES):
        for name in names:
            calls[name]()  # warm-up, not timed: the allocator settles on this variant's sizes
            for _ in range(repeats // PASSES + (p < repeats % PASSES)):
                begin = time.perf_counter()
                calls[name]()
                times[name].append(time.perf_counter() - begin)

    reference = jax.block_until_ready(compiled[variants[0][0]](b, t))
    donated = state[variants[3][0]]
    assert all(
        np.array_equal(x, y)
        for x, y in zip(jax.tree.leaves(donated), jax.tree.leaves(reference), strict=True)
    )
    mine = dcost.decode(design, hw, model, work)
    np.testing.assert_allclose(np.asarray(mine.tpot), np.asarray(reference.tpot), rtol=1e-6)

    results = []
    for name in names:
        median = statistics.median(times[name])
        out = reference if name == public else state.get(name)
        out = compiled[name](b, t) if out is None else out
        results.append(
            {
                "name": name,
                "compile_s": compile_s[name],
                "median_s": median,
                "min_s": min(times[name]),
                "rate": len(batch) / median,
                "loops": _loops(compiled[name]) if name in compiled else -1,
                "out_mb": sum(x.nbytes for x in jax.tree.leaves(out)) / 1e6,
            }
        )
        del out
    return results, str(b.dtype)


def _fields(report):
    return tuple(getattr(report, f) for f in V1_FIELDS)


def dcost_checks():
    """dcost's decode report at the cross-check designs (exact, float)."""
    import dcost

    hw, model = dcost.hardware("h100-sxm"), dcost.model("llama-3-70b")
    out = []
    for b, t in CHECKS:
        r = dcost.decode(dcost.Design(batch=b, chips=CHIPS), hw, model, dcost.Workload(t))
        out.append(
            {k: float(getattr(r, k)) for k in ("t_compute", "t_weights", "t_kv", "t_comm", "tpot")}
        )
    return out


# ---------------------------------------------------------------------------------- llm-analysis


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _has_llm_analysis(python: Path) -> bool:
    if not python.exists():
        return False
    probe = subprocess.run(
        [str(python), "-c", "import llm_analysis.analysis"], capture_output=True, timeout=300
    )
    return probe.returncode == 0


def ensure_llm_analysis(venv: Path, install: bool):
    """Path of a Python that imports llm-analysis, creating ``venv`` if needed; or (None, why)."""
    python = _venv_python(venv)
    if _has_llm_analysis(python):
        return python, None
    if not install:
        return None, f"not installed in {venv.name}/ (run once without --quick to install it)"
    print(
        f"installing {LLM_ANALYSIS} into {venv.name}/ (a separate virtual environment) ...",
        flush=True,
    )
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--retries",
            "1",
            "--timeout",
            "20",
            LLM_ANALYSIS,
        ],
    ]
    for cmd in steps:
        if cmd[0] != sys.executable and not python.exists():
            break
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
        except (OSError, subprocess.TimeoutExpired) as err:
            return None, f"`{' '.join(cmd[:4])} ...` failed: {err}"
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            return None, f"`{' '.join(cmd[:4])} ...` failed: {tail[0]}"
    if not _has_llm_analysis(python):
        return None, "installed, but `import llm_analysis` fails in the benchmark environment"
    return python, None


def time_llm_analysis(python: Path, batch, context, seconds: float):
    """Run llm_analysis_rate.py in the benchmark environment; its JSON answer, or (None, why)."""
    import dcost.presets

    arch = dcost.presets.model_card("llama-3-70b")["arch"]
    request = {
        "arch": arch,
        "gpu": "h100-sxm-80gb",
        "tp": CHIPS,
        "seconds": seconds,
        "points": [
            [int(x), int(y)] for x, y in zip(batch[:200_000], context[:200_000], strict=True)
        ],
        "checks": [list(c) for c in CHECKS],
    }
    script = Path(__file__).with_name("llm_analysis_rate.py")
    try:
        done = subprocess.run(
            [str(python), str(script)],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=seconds + 300,
        )
    except subprocess.TimeoutExpired:
        return None, "timed out"
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return None, f"failed: {tail[0]}"
    return json.loads(done.stdout), None


# ---------------------------------------------------------------------------------------- report


def print_cross_check(ours, theirs):
    """dcost's decode step against llm-analysis's, term by term (ms); see the module docstring."""
    print("\ncross-check: one decode step of llama-3-70b on 8 x H100 (TP 8, efficiencies 1.0), ms")
    print(
        f"  {'':13s} | {'dcost':^37s} | {'llm-analysis':^41s} | {'ratio':^5s} |"
        f" {'llm-analysis, dcost terms':^25s}"
    )
    print(
        f"  {'batch':>5s} {'context':>7s} | {'tpot':>7s}{'weights':>8s}{'kv':>7s}{'comm':>7s}"
        f"{'compute':>8s}"
        f" | {'decode':>7s}{'layers':>8s}{'kv(x2)':>9s}{'tp-comm':>9s}{'embed':>8s} | {'':5s} |"
        f" {'decode':>15s} {'ratio':>9s}"
    )
    for d, r in zip(ours, theirs, strict=True):
        layers = (
            r["decode_latency_fwd_attn"]
            + r["decode_latency_fwd_mlp"]
            + r["decode_latency_fwd_layernorm"]
        )
        embed = (
            r["decode_latency_fwd_input_embedding"] + r["decode_latency_fwd_output_embedding_loss"]
        )
        kv, comm = r["kv_cache_latency"], r["decode_latency_fwd_tp_comm"]
        total = r["decode_latency"]
        # llm-analysis without the terms dcost does not have: its serial TP all-reduces, its read
        # of the whole input-embedding table, and its second pass over the KV cache
        aligned = total - comm - r["decode_latency_fwd_input_embedding"] - kv / 2
        ms = [
            1e3 * x
            for x in (
                d["tpot"],
                d["t_weights"],
                d["t_kv"],
                d["t_comm"],
                d["t_compute"],
                total,
                layers,
                kv,
                comm,
                embed,
                aligned,
            )
        ]
        print(
            f"  {r['batch']:5d} {r['context']:7d} | {ms[0]:7.2f}{ms[1]:8.2f}{ms[2]:7.2f}"
            f"{ms[3]:7.2f}{ms[4]:8.2f} | {ms[5]:7.2f}{ms[6]:8.2f}{ms[7]:9.2f}{ms[8]:9.2f}"
            f"{ms[9]:8.2f} | {total / d['tpot']:5.2f} | {ms[10]:15.2f} "
            f"{aligned / d['tpot']:9.2f}"
        )


KEEP_FREED_PAGES = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"
"""glibc tunables under which ``malloc`` serves every buffer from its heap and keeps freed pages
(no ``mmap`` per buffer, no trimming): a fresh output buffer then reuses the pages the previous
call's outputs freed instead of faulting in new zeroed ones. Set in the environment of a process
at its start (``GLIBC_TUNABLES``); the benchmark times a child process under it."""


def print_table(results, args, dtype, note=""):
    import jax

    import dcost

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"dcost {dcost.__version__}, jax {jax.__version__}, {jax.devices()[0].platform} "
        f"({os.cpu_count()} cores, load average {load:.1f}), {dtype}{note}"
    )
    print(
        f"{args.designs:,} random designs of llama-3-70b on {CHIPS} x h100-sxm: batch "
        f"{BATCH[0]}..{BATCH[1]}, context {CONTEXT[0]}..{CONTEXT[1]}; decode, smoothness 0; "
        f"one jit(vmap) call, median of {args.repeats} calls in {PASSES} passes"
    )
    print(
        f"  {'variant':36s} {'kernels':>7s} {'out MB':>7s} {'compile':>8s} {'median':>9s} "
        f"{'min':>9s} {'evaluations/s':>14s}"
    )
    for r in results:
        kernels = f"{r['loops']:7d}" if r["loops"] >= 0 else f"{'-':>7s}"
        print(
            f"  {r['name']:36s} {kernels} {r['out_mb']:7.0f} {r['compile_s']:7.2f}s "
            f"{1e3 * r['median_s']:7.2f}ms {1e3 * r['min_s']:7.2f}ms {r['rate']:14.3g}"
        )
    headline, v2_rate = results[0]["rate"], results[1]["rate"]
    bound = next(
        r
        for r in results
        if r["name"].startswith("bound: bare kernel") and "donated" not in r["name"]
    )
    print(
        f"  full report / bound (the bare kernel writing the same bytes, fresh): "
        f"{headline / bound['rate']:.2f}"
    )
    for target, rate, what in (
        (TARGET_RATE, headline, "full report, fresh outputs"),
        (TARGET_RATE_V2, v2_rate, "full report, v2 terms on"),
    ):
        met = "met" if rate >= target else "MISSED"
        print(f"  target >= {target:.0e} evaluations/s ({what}): {met}")


def run_keep_freed_pages(args):
    """The dcost table again, in a child process whose glibc keeps freed pages; None when this is
    not Linux with glibc (or the child fails: its error is printed)."""
    if not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None:
        return None
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child-json", "--no-llm-analysis"]
    cmd += [
        "--designs",
        str(args.designs),
        "--repeats",
        str(args.repeats),
        "--seed",
        str(args.seed),
    ]
    cmd += ["--x64"] if args.x64 else []
    env = dict(os.environ, GLIBC_TUNABLES=KEEP_FREED_PAGES)
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        print("glibc keeping freed pages: timed out")
        return None
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        print(f"glibc keeping freed pages: failed: {tail[0]}")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    args = parse_args(argv)
    import jax

    if args.x64:
        jax.config.update("jax_enable_x64", True)
    from optimizer import bounded  # benchmarks/optimizer.py: a stage under a wall-clock bound

    batch, context = designs(args.designs, args.seed)
    with bounded("dcost's variants", 60.0 + args.repeats * args.designs * 1e-6 * 2.0):
        results, dtype = time_dcost(batch, context, args.repeats)
    if args.child_json:
        print(json.dumps({"results": results, "dtype": dtype}))
        return 0
    print_table(results, args, dtype)
    if not args.quick:
        print()
        with bounded("dcost's variants, glibc keeping freed pages", 1900.0):
            kept = run_keep_freed_pages(args)
        if kept is not None:
            note = f"; GLIBC_TUNABLES={KEEP_FREED_PAGES}"
            print_table(kept["results"], args, kept["dtype"], note)

    if args.no_llm_analysis:
        return 0
    print()
    python, why = ensure_llm_analysis(args.venv, install=not args.quick)
    theirs = None
    if python is not None:
        theirs, why = time_llm_analysis(python, batch, context, args.seconds)
    if theirs is None:
        print(f"llm-analysis: skipped, {why}; dcost's figures above stand alone")
        return 0
    rate = theirs["evaluated"] / theirs["seconds"]
    print(
        f"llm-analysis {theirs['version']} (separate venv {args.venv.name}/): "
        f"{theirs['evaluated']:,} designs in {theirs['seconds']:.1f} s "
        f"({theirs['failed']} rejected as not fitting in memory), {rate:,.0f} evaluations/s; "
        f"its model has {theirs['params_total'] / 1e9:.1f} B parameters"
    )
    for r in results:
        print(f"  ratio, dcost {r['name']:36s} / llm-analysis: {r['rate'] / rate:12,.0f} x")
    met = "met" if results[0]["rate"] / rate >= TARGET_RATIO else "MISSED"
    print(f"  target >= {TARGET_RATIO:,.0f} x (full report): {met}")
    print_cross_check(dcost_checks(), theirs["checks"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
