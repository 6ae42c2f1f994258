"""Bad input is refused where it enters, naming the field, the value and what is allowed.

Three sweeps: a case table of (callable, the name its message must carry) over every public
constructor and raw-number function; a table of command lines, one or more per subcommand, that
must exit with code 2 and one line ``dcost: error: ...`` naming the option or field; and hypothesis
properties: any value in any numeric field of a spec either builds a spec with finite leaves or
raises ``SpecError`` naming the class and the field (never another exception, never a NaN).
Then the cases of issue 8 that are not a plain refusal: a stack of valid MoE models, problems
without constraints, readable printouts, ``dcost train``'s exit status.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dcost
from dcost.cli.app import main
from dcost.search.optimize import Settings
from dcost.specs import SpecError

HW = dict(
    flops=989e12,
    hbm_bandwidth=3.35e12,
    hbm_capacity=80e9,
    scaleup_bandwidth=450e9,
    scaleout_bandwidth=50e9,
    scaleup_size=8,
    price_per_hour=2.5,
)
MOE = dict(
    n_layers=2,
    d_model=8,
    params_dense=100.0,
    params_per_expert=10.0,
    n_experts=8,
    experts_active=2,
    kv_bytes_per_token=64.0,
    bytes_per_param=2.0,
)


def hw(**kw):
    return dcost.Hardware(**{**HW, **kw})


def moe(**kw):
    return dcost.Model(**{**MOE, **kw})


def serving(**kw):
    """A small problem (llama-3-8b on h100-sxm, batch up to 512) with the given limits."""
    kw.setdefault("free", {"batch": (1, 512)})
    return dcost.Problem(
        dcost.hardware("h100-sxm"), dcost.model("llama-3-8b"), dcost.Workload(2048), **kw
    )


def _decode(smoothness):
    h, m = dcost.hardware("h100-sxm"), dcost.model("llama-3-8b")
    return dcost.decode(dcost.Design(4), h, m, dcost.Workload(128), smoothness)


def _prefill(smoothness):
    h, m = dcost.hardware("h100-sxm"), dcost.model("llama-3-8b")
    return dcost.prefill(dcost.Design(4), h, m, dcost.Workload(128), smoothness)


def _mixed(smoothness):
    h, m = dcost.hardware("h100-sxm"), dcost.model("llama-3-8b")
    w = dcost.Workload(1500, prompt=1000, output=500)
    return dcost.mixed_step(dcost.Design(4), h, m, w, smoothness)


def _kv_transfer(tokens, chips=1.0):
    return dcost.kv_transfer_time(
        tokens, dcost.hardware("h100-sxm"), dcost.model("llama-3-8b"), chips
    )


def _run_training(**kw):
    args = dict(model=70e9, n_tokens=1e12, hardware=dcost.hardware("h100-sxm"), n_chips=64, mfu=0.4)
    args.update(kw)
    setup = dcost.TrainingSetup(**{k: args.pop(k) for k in list(args) if k in ("stages",)})
    return dcost.training_run(
        args.pop("model"),
        args.pop("n_tokens"),
        args.pop("hardware"),
        args.pop("n_chips"),
        args.pop("mfu"),
        setup,
    )


# (id, callable, text the SpecError's message must contain)
CASES = [
    # specs: None, strings, booleans, complex numbers, arrays of the wrong dtype, ranges
    ("hardware-flops-none", lambda: hw(flops=None), "Hardware.flops = None"),
    ("hardware-flops-string", lambda: hw(flops="fast"), "Hardware.flops = 'fast'"),
    ("hardware-flops-complex", lambda: hw(flops=1 + 2j), "Hardware.flops = (1+2j)"),
    ("hardware-flops-bool", lambda: hw(flops=True), "Hardware.flops = True"),
    ("hardware-flops-str-array", lambda: hw(flops=np.array(["1e15"])), "Hardware.flops"),
    ("hardware-flops-object", lambda: hw(flops=[1e15, None]), "Hardware.flops"),
    ("hardware-flops-overflow", lambda: hw(flops=1e39), "Hardware.flops = 1e+39"),
    ("hardware-scaleup-fraction", lambda: hw(scaleup_size=8.5), "Hardware.scaleup_size = 8.5"),
    ("hardware-efficiency", lambda: hw(flops_efficiency=1.5), "Hardware.flops_efficiency = 1.5"),
    ("model-layers-fraction", lambda: moe(n_layers=2.5), "Model.n_layers = 2.5"),
    ("model-k-fraction", lambda: moe(experts_active=1.5), "Model.experts_active = 1.5"),
    ("model-experts-fraction", lambda: moe(n_experts=7.5), "Model.n_experts = 7.5"),
    ("model-moe-layers", lambda: moe(n_moe_layers=3), "Model.n_moe_layers = 3.0"),
    ("model-moe-layers-fraction", lambda: moe(n_moe_layers=1.5), "Model.n_moe_layers = 1.5"),
    ("model-k-above-e", lambda: moe(experts_active=9), "Model.experts_active = 9.0"),
    ("model-d-model-nan", lambda: moe(d_model=math.nan), "Model.d_model = nan"),
    ("workload-none", lambda: dcost.Workload(None), "Workload.context = None"),
    ("workload-negative", lambda: dcost.Workload(-1.0), "Workload.context = -1.0"),
    ("workload-output-string", lambda: dcost.Workload(10, output="x"), "Workload.output = 'x'"),
    ("design-none", lambda: dcost.Design(None), "Design.batch = None"),
    ("design-huge", lambda: dcost.Design(1e30), "Design.batch = 1e+30"),
    ("design-chips-zero", lambda: dcost.Design(1, chips=0), "Design.chips = 0.0"),
    ("design-overtrain-zero", lambda: dcost.Design(1, overtrain=0), "Design.overtrain = 0.0"),
    # serving model v2 fields: None is "off" (Hardware, Workload, Design), anything else checked
    ("hardware-overhead", lambda: hw(step_overhead=-1e-3), "Hardware.step_overhead = -0.001"),
    ("hardware-latency-str", lambda: hw(scaleout_latency="5us"), "Hardware.scaleout_latency"),
    ("hardware-link-eff", lambda: hw(scaleup_efficiency=0), "Hardware.scaleup_efficiency = 0.0"),
    ("hardware-half-nan", lambda: hw(matmul_half_tokens=math.nan), "matmul_half_tokens = nan"),
    ("hardware-serial-above", lambda: hw(kernel_serialization=1.5), "kernel_serialization = 1.5"),
    ("hardware-tree-negative", lambda: hw(tree_collectives=-0.1), "tree_collectives = -0.1"),
    ("hardware-attn-flops-zero", lambda: hw(attention_flops=0.0), "attention_flops = 0.0"),
    ("hardware-kv-eff-above", lambda: hw(kv_bandwidth_efficiency=1.2), "kv_bandwidth_eff"),
    ("hardware-per-sequence", lambda: hw(sequence_overhead=-1e-6), "sequence_overhead = -1e-06"),
    ("hardware-kernel-r", lambda: hw(kernel_roofline_smoothness=1.2), "kernel_roofline_smoothness"),
    ("hardware-kernel-r-neg", lambda: hw(kernel_roofline_smoothness=-0.1), "smoothness = -0.1"),
    ("model-kv-heads-fraction", lambda: moe(kv_heads=2.5), "Model.kv_heads = 2.5"),
    (
        "model-attention-heads-fraction",
        lambda: moe(attention_heads=2.5),
        "Model.attention_heads = 2.5",
    ),
    ("model-domains-bool", lambda: moe(max_domains_per_token=True), "max_domains_per_token"),
    ("model-draft-layers", lambda: moe(draft_layers=None), "Model.draft_layers = None"),
    ("model-attn-above-dense", lambda: moe(params_attention=200), "<= params_dense (100.0)"),
    (
        "model-embedding-above-dense",
        lambda: moe(params_attention=40.0, params_embedding=60.0),
        "Model.params_embedding = 60.0",
    ),
    (
        "model-draft-total",
        lambda: moe(draft_params=50.0, draft_params_total=20.0),
        "Model.draft_params_total = 20.0",
    ),
    (
        "workload-acceptance",
        lambda: dcost.Workload(10, acceptance=1.5),
        "Workload.acceptance = 1.5",
    ),
    (
        "workload-imbalance",
        lambda: dcost.Workload(10, expert_imbalance=0.5),
        "Workload.expert_imbalance = 0.5",
    ),
    (
        "workload-imbalance-word",
        lambda: dcost.Workload(10, expert_imbalance="uniform"),
        "Workload.expert_imbalance = 'uniform'",
    ),
    ("design-attention-dp", lambda: dcost.Design(1, chips=4, attention_dp=8), "<= chips (4.0)"),
    (
        "design-expert-parallel",
        lambda: dcost.Design(1, chips=4, expert_parallel=8),
        "Design.expert_parallel = 8.0 is not allowed: it must be <= chips (4.0)",
    ),
    (
        "problem-expert-parallel",
        lambda: serving(
            free={"batch": (1, 64), "chips": (1, 8)},
            fixed=dcost.Design(1, chips=8, expert_parallel=8),
        ),
        "Problem.fixed.expert_parallel = 8: a stage needs at least as many chips",
    ),
    ("design-dedup", lambda: dcost.Design(1, dispatch_dedup=2), "Design.dispatch_dedup = 2.0"),
    ("design-chunk", lambda: dcost.Design(1, prefill_chunk=-1), "Design.prefill_chunk = -1.0"),
    ("design-overlap", lambda: dcost.Design(1, comm_overlap=2), "Design.comm_overlap = 2.0"),
    ("design-draft-str", lambda: dcost.Design(1, draft_tokens="2"), "Design.draft_tokens = '2'"),
    ("design-redundant-huge", lambda: dcost.Design(1, redundant_experts=1e30), "1e+30"),
    ("fit-alpha-zero", lambda: dcost.ScalingFit(1.69, 406.4, 410.7, 0.0, 0.28), "ScalingFit.alpha"),
    ("fit-e-none", lambda: dcost.ScalingFit(None, 406.4, 410.7, 0.34, 0.28), "ScalingFit.E"),
    ("problem-tpot", lambda: serving(tpot_slo=-0.01), "Problem.tpot_slo = -0.01"),
    ("problem-tpot-string", lambda: serving(tpot_slo="50ms"), "Problem.tpot_slo = '50ms'"),
    ("problem-reserve", lambda: serving(memory_reserve=1.5), "Problem.memory_reserve = 1.5"),
    ("problem-budget", lambda: serving(chip_budget=0.5), "Problem.chip_budget = 0.5"),
    ("problem-free", lambda: serving(free={"batch": (0, 8)}), "Problem.free['batch']"),
    ("problem-free-huge", lambda: serving(free={"batch": (1, 2**25)}), "hi <= 16777216"),
    ("problem-hardware", lambda: dcost.Problem(None, None, None), "Problem.hardware"),
    ("lifetime-inputs-mfu", lambda: dcost.LifetimeInputs(1e12, mfu=0.0), "LifetimeInputs.mfu"),
    # raw numbers
    (
        "compute-optimal-huge",
        lambda: dcost.compute_optimal(1e300),
        "compute_optimal.flops = 1e+300",
    ),
    ("compute-optimal-zero", lambda: dcost.compute_optimal(0.0), "compute_optimal.flops = 0.0"),
    ("compute-optimal-none", lambda: dcost.compute_optimal(None), "compute_optimal.flops = None"),
    ("loss-tokens-negative", lambda: dcost.loss(1e9, -1.0), "loss.n_tokens = -1.0"),
    ("loss-params-string", lambda: dcost.loss("7B", 1e12), "loss.n_params = '7B'"),
    (
        "lifetime-huge-target",
        lambda: dcost.lifetime_optimum(1e30, 1e12),
        "lifetime_optimum.target_loss = 1e+30",
    ),
    (
        "lifetime-below-e",
        lambda: dcost.lifetime_optimum(1.5, 1e12),
        "lifetime_optimum.target_loss = 1.5",
    ),
    (
        "lifetime-tiny-model",
        lambda: dcost.lifetime_optimum(500.0, 1e12),
        "lifetime_optimum.target_loss = 500.0",
    ),
    (
        "lifetime-nan-traffic",
        lambda: dcost.lifetime_optimum(2.0, math.nan),
        "lifetime_optimum.inference_tokens = nan",
    ),
    ("expert-fraction-negative", lambda: dcost.expert_fraction(-1, 256, 8), "batch = -1.0"),
    ("expert-fraction-k-above-e", lambda: dcost.expert_fraction(4, 8, 9), "experts_active = 9.0"),
    ("bubble-zero", lambda: dcost.bubble_fraction(0, 0), "bubble_fraction.stages = 0.0"),
    ("bubble-fraction", lambda: dcost.bubble_fraction(2, 1.5), "microbatches = 1.5"),
    (
        "balance-batch-negative",
        lambda: dcost.balance_batch(dcost.hardware("h100-sxm"), dcost.model("llama-3-8b"), -1e6),
        "balance_batch.context = -1000000.0",
    ),
    ("training-chips-fraction", lambda: _run_training(n_chips=64.5), "training_run.n_chips = 64.5"),
    ("training-stages-fraction", lambda: _run_training(stages=1.5), "TrainingSetup.stages = 1.5"),
    ("training-mfu", lambda: _run_training(mfu=2.0), "training_run.mfu = 2.0"),
    ("training-params", lambda: _run_training(model=None), "training_run.model = None"),
    ("decode-smoothness-negative", lambda: _decode(-1.0), "decode.smoothness = -1.0"),
    ("decode-smoothness-nan", lambda: _decode(math.nan), "decode.smoothness = nan"),
    ("decode-smoothness-huge", lambda: _decode(1e30), "decode.smoothness = 1e+30"),
    ("prefill-smoothness", lambda: _prefill(2.0), "prefill.smoothness = 2.0"),
    ("mixed-step-smoothness", lambda: _mixed(-0.5), "mixed_step.smoothness = -0.5"),
    ("accepted-tokens", lambda: dcost.accepted_tokens(1.5, 2), "accepted_tokens.acceptance = 1.5"),
    ("accepted-tokens-k", lambda: dcost.accepted_tokens(0.5, None), "draft_tokens = None"),
    ("kv-transfer-chips", lambda: _kv_transfer(1e3, chips=0), "kv_transfer_time.chips = 0.0"),
    ("kv-transfer-overflow", lambda: _kv_transfer(3e38), "kv_transfer_time.tokens = 3e+38"),
    ("smax-smoothness", lambda: dcost.smax([1.0, 2.0], -0.5), "smax.smoothness = -0.5"),
    (
        "decode-overflow",
        lambda: dcost.decode(
            dcost.Design(2**24),
            dcost.hardware("h100-sxm"),
            dcost.model("llama-3-8b"),
            dcost.Workload(3e38),
        ),
        "results overflow float32",
    ),
    ("grid-chunk-zero", lambda: dcost.grid_search(serving(), chunk_size=0), "chunk_size = 0"),
    ("grid-chunk-float", lambda: dcost.grid_search(serving(), chunk_size=4096.0), "chunk_size"),
    ("grid-problem", lambda: dcost.grid_search(None), "grid_search.problem"),
    (
        "optimize-smoothness",
        lambda: dcost.optimize(serving(), Settings(smoothness=(-0.1, 0.003))),
        "optimize.settings.smoothness = -0.1",
    ),
    (
        "optimize-starts",
        lambda: dcost.optimize(serving(), Settings(starts=0)),
        "optimize.settings.starts = 0",
    ),
    (
        "sensitivity-settings",
        lambda: dcost.sensitivity(serving(), Settings(smoothness=(0.1, 2.0))),
        "sensitivity.settings.smoothness = 2.0",
    ),
]


@pytest.mark.parametrize("make, text", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_value_raises_spec_error_naming_it(make, text):
    with pytest.raises(SpecError) as err:
        make()
    message = str(err.value)
    assert text in message, message
    assert "\n" not in message


def test_every_public_constructor_and_raw_number_function_has_a_case():
    """The table covers the names the brief lists; a new public function needs its case."""
    covered = " ".join(text for _, _, text in CASES)
    for name in (
        "Hardware.",
        "Model.",
        "Workload.",
        "Design.",
        "Problem.",
        "ScalingFit.",
        "LifetimeInputs.",
        "training_run.",
        "lifetime_optimum.",
        "compute_optimal.",
        "loss.",
        "decode.smoothness",
        "prefill.smoothness",
        "mixed_step.smoothness",
        "accepted_tokens.",
        "kv_transfer_time.",
        "chunk_size",
        "bubble_fraction.",
        "balance_batch.",
    ):
        assert name in covered, name


# ------------------------------------------------------------------------------- the CLI

EVAL = ["eval", "--hardware", "h100-sxm", "--model", "llama-3-8b"]
SEARCH = ["--hardware", "h100-sxm", "--model", "llama-3-8b", "--context", "2048"]
TRAIN = ["train", "--params", "70B", "--tokens", "1T", "--hardware", "h100-sxm", "--chips", "64"]
LIFE = ["lifetime", "--inference-tokens", "1T"]

CLI = [
    (["presets", "--hardware", "x"], "unrecognized arguments"),
    (EVAL + ["--batch", "1e30"], "Design.batch = 1e+30"),
    (EVAL + ["--batch", "1.5"], "--batch"),
    (EVAL + ["--batch", "0"], "--batch"),
    (EVAL + ["--batch", "many"], "--batch"),
    (EVAL + ["--batch", "8", "--experts", "2.5"], "--experts"),
    (EVAL + ["--batch", "8", "--context", "-1"], "--context"),
    (EVAL + ["--batch", "8", "--context", "nan"], "--context"),
    (EVAL + ["--batch", "16777216", "--context", "3e38"], "results overflow float32"),
    (EVAL + ["--batch", "8", "--chips", "8.5"], "--chips"),
    (["eval", "--hardware", "h100", "--model", "llama-3-8b", "--batch", "1"], "h100"),
    (["optimize"] + SEARCH + ["--objective", "lifetime_cost"], "lifetime_cost cannot run"),
    (["optimize"] + SEARCH + ["--tpot-slo=-5ms"], "-5ms"),
    (["optimize"] + SEARCH + ["--max-batch", "1.5"], "--max-batch"),
    (["optimize"] + SEARCH + ["--memory-reserve", "1.5"], "Problem.memory_reserve = 1.5"),
    (["optimize"] + SEARCH + ["--chip-budget", "0.5"], "Problem.chip_budget = 0.5"),
    (["optimize"] + SEARCH + ["--top", "0"], "--top"),
    (["grid", "--hardware", "h100-sxm", "--model", "llama-3-8b", "--context", "-4"], "context"),
    (["grid"] + SEARCH + ["--max-chips", "0"], "--max-chips"),
    (["grid"] + SEARCH + ["--prompt", "x"], "--prompt"),
    (TRAIN + ["--chips", "1.5"], "--chips"),
    (TRAIN + ["--mfu", "2"], "training_run.mfu = 2.0"),
    (TRAIN + ["--tensor", "0"], "--tensor"),
    (TRAIN + ["--price", "-1"], "--price"),
    (TRAIN + ["--recompute", "some"], "recompute = 'some'"),
    (
        ["train", "--params=-70B", "--tokens", "1T", "--hardware", "h100-sxm", "--chips", "8"],
        "must be > 0, got '-70B'",
    ),
    (LIFE + ["--loss", "1e30"], "target_loss = 1e+30"),
    (LIFE + ["--loss", "1.0"], "target_loss = 1.0"),
    (LIFE + ["--loss", "nan"], "--loss"),
    (LIFE + ["--loss", "2", "--max-tokens", "0"], "--max-tokens"),
    (LIFE + ["--loss", "2", "--fit", "kaplan"], "kaplan"),
    (["lifetime", "--loss", "2", "--inference-tokens", "-5"], "--inference-tokens"),
    (["calibrate", "--layers", "0"], "--layers"),
    (["calibrate", "--max-batch", "1.5"], "--max-batch"),
    (["calibrate", "--dtype", "float16"], "--dtype"),
]


def _cli(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, text", CLI, ids=[" ".join(a[:1] + a[-2:]) for a, _ in CLI])
def test_cli_bad_value_exits_2_with_one_line(argv, text, capsys):
    code, out, err = _cli(argv, capsys)
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert lines[-1].startswith("dcost: error: ") and text in lines[-1], err
    # argparse prints its usage first; a value refused past parsing prints only the line
    assert len(lines) == 1 or lines[0].startswith("usage:"), err


def test_every_subcommand_has_a_bad_input_case():
    commands = {argv[0] for argv, _ in CLI}
    parser_commands = {"presets", "eval", "optimize", "grid", "train", "lifetime", "calibrate"}
    assert parser_commands <= commands


def test_optimize_help_offers_only_objectives_it_can_run(capsys):
    with pytest.raises(SystemExit):
        main(["optimize", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    # lifetime_cost only as a note; tco (the owned chip's cost, dcost.pricing.ownership) runs
    assert "{cost_per_token,cost_per_input_token,tco}" in text


def test_train_exits_1_when_the_run_does_not_fit(capsys):
    code, out, _ = _cli(TRAIN, capsys)  # 70B on 64 chips, no model parallelism
    assert code == 1 and "does NOT fit" in out
    code, out, _ = _cli(TRAIN + ["--tensor", "8", "--stages", "8", "--json"], capsys)
    assert code == 0, out


def test_train_help_documents_the_exit_status(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "1 when it does NOT fit" in " ".join(capsys.readouterr().out.split())


# ------------------------------------------------------------ property: any value, any field

BAD_OR_GOOD = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.none(),
    st.booleans(),
    st.text(max_size=3),
    st.complex_numbers(max_magnitude=1e3, allow_nan=False),
    st.sampled_from([np.array(["8"]), np.array([True]), np.array([1 + 1j]), [1.0, None]]),
)

SPECS = {  # every numeric field, the serving model v2 ones included
    "Hardware": (
        dcost.Hardware,
        HW,
        list(HW) + ["flops_efficiency", "bandwidth_efficiency", *dcost.Hardware.OFF],
    ),
    "Model": (
        dcost.Model,
        MOE,
        list(MOE)
        + [
            "attn_flops_per_context_token",
            "n_moe_layers",
            "params_attention",
            "kv_heads",
            "attention_heads",
            "prefill_attn_flops_per_context_token",
            "max_domains_per_token",
            "draft_params",
            "draft_params_total",
            "draft_layers",
            "draft_kv_bytes_per_token",
            "params_embedding",
            "state_bytes_per_sequence",
            "state_flops_per_token",
            "attention_topk",
            "index_bytes_per_token",
            "index_flops_per_context_token",
        ],
    ),
    "Workload": (
        dcost.Workload,
        {"context": 4096.0},
        ["context", "prompt", "output", "acceptance", "expert_imbalance"],
    ),
    "Design": (
        dcost.Design,
        {"batch": 8.0, "chips": 8.0},
        ["batch", "chips", "stages", "experts", "overtrain", "attention_dp", *dcost.Design.OFF],
    ),
    "ScalingFit": (
        dcost.ScalingFit,
        dict(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28),
        ["E", "A", "B", "alpha", "beta"],
    ),
    "LifetimeInputs": (
        dcost.LifetimeInputs,
        {"inference_tokens": 1e12},
        ["inference_tokens", "rl_tokens", "mfu", "gamma"],
    ),
}


@pytest.mark.parametrize("name", sorted(SPECS))
@given(data=st.data())
def test_any_value_builds_a_finite_spec_or_names_the_field(name, data):
    cls, base, fields = SPECS[name]
    field = data.draw(st.sampled_from(fields), label="field")
    value = data.draw(BAD_OR_GOOD, label="value")
    try:
        spec = cls(**{**base, field: value})
    except SpecError as err:
        message = str(err)
        assert name in message and field in message, message
        return
    for leaf in jax.tree.leaves(spec):
        assert np.all(np.isfinite(np.asarray(leaf))), (field, value, spec)
    if value is not None:  # None may mean "the default" (Workload.prompt, Design.experts)
        assert float(np.asarray(getattr(spec, field))) == pytest.approx(float(value), rel=1e-6)


RAW = {
    "compute_optimal.flops": lambda v: dcost.compute_optimal(v),
    "loss.n_tokens": lambda v: dcost.loss(70e9, v),
    "expert_fraction.batch": lambda v: dcost.expert_fraction(v, 8.0, 2.0),
    "bubble_fraction.microbatches": lambda v: dcost.bubble_fraction(4, v),
    "balance_batch.context": lambda v: dcost.balance_batch(
        dcost.hardware("h100-sxm"), dcost.model("llama-3-8b"), v
    ),
    "decode.smoothness": _decode,
    "mixed_step.smoothness": _mixed,
    "accepted_tokens.acceptance": lambda v: dcost.accepted_tokens(v, 3.0),
    "accepted_tokens.draft_tokens": lambda v: dcost.accepted_tokens(0.7, v),
    "kv_transfer_time.tokens": _kv_transfer,
    "training_run.n_chips": lambda v: _run_training(n_chips=v),
    "lifetime_optimum.target_loss": lambda v: dcost.lifetime_optimum(v, 1e12),
}


@pytest.mark.parametrize("name", sorted(RAW))
@given(value=BAD_OR_GOOD)
def test_any_raw_number_gives_finite_results_or_names_the_argument(name, value):
    try:
        out = RAW[name](value)
    except SpecError as err:
        assert name in str(err), str(err)
        return
    for leaf in jax.tree.leaves(out):
        leaf = np.asarray(leaf, dtype=float)
        if name == "balance_batch.context":  # inf past the critical context, by definition
            leaf = np.where(leaf == np.inf, 0.0, leaf)
        assert np.all(np.isfinite(leaf)), (name, value, out)


# --------------------------------------------------------------- what is not a refusal


def test_a_stack_of_valid_moe_models_is_checked_element_by_element():
    """n_moe_layers against each model's own n_layers, not the smallest of the batch."""
    deep, shallow = moe(n_layers=61, n_moe_layers=58), moe(n_layers=27, n_moe_layers=26)
    stack = jax.tree.map(lambda a, b: jnp.stack([a, b]), deep, shallow)
    rebuilt = dcost.Model(**{f: getattr(stack, f) for f in stack.__dataclass_fields__})
    np.testing.assert_array_equal(rebuilt.n_moe_layers, [58.0, 26.0])
    with pytest.raises(SpecError, match=r"Model.n_moe_layers = 30.0 .* <= n_layers \(27.0\)"):
        dcost.Model(**{**MOE, "n_layers": np.array([61, 27]), "n_moe_layers": np.array([58, 30])})


@pytest.mark.parametrize("search", [dcost.grid_search, dcost.optimize], ids=["grid", "optimize"])
def test_a_problem_without_constraints_solves_and_binds_nothing(search):
    p = serving(tpot_slo=None, memory_reserve=None, free={"batch": (1, 64), "chips": (1, 4)})
    assert p.constraints == ()
    sol = search(p)
    assert bool(sol.feasible) and sol.binding == () and sol.multipliers == {}
    assert sol.message == "feasible" and float(sol.design.batch) == 64  # cheaper with batch
    assert "batch <= 64" in sol.at_bound


def test_sensitivity_of_an_infeasible_problem_names_the_constraint(monkeypatch):
    """Refused after a second set of starts, which runs the programs the first set compiled (the
    set's first Halton point is an argument): the search and the polish traced once, run twice."""
    from dcost.search import sensitivity as sens_mod

    firsts, polished, searched = [], [], []
    run, polish_one, search_one = (
        sens_mod._sensitivity,
        sens_mod._polish_one,
        sens_mod._search_from_one,
    )

    def spy(problem, settings, batch, first):
        firsts.append(int(first))
        return run(problem, settings, batch, first)

    def traced_polish(*args):
        polished.append(1)
        return polish_one(*args)

    def traced_search(*args):
        searched.append(1)
        return search_one(*args)

    monkeypatch.setattr(sens_mod, "_sensitivity", spy)
    monkeypatch.setattr(sens_mod, "_polish_one", traced_polish)
    monkeypatch.setattr(sens_mod, "_search_from_one", traced_search)
    p = serving(tpot_slo=0.0005, free={"batch": (1, 4096)})  # 0.5 ms: no batch gets there
    settings = Settings(starts=3)  # a structure no other test compiles: a fresh trace here
    refused = r"infeasible: tpot binds: .* above the 0.5 ms target .*\(also from 6 starts\)"
    with pytest.raises(SpecError, match=refused):
        dcost.sensitivity(p, settings)
    assert firsts == [0, 3] and len(polished) == 1 and len(searched) == 1


def test_specs_reports_and_solutions_print_numbers():
    d = dcost.Design(4, 8)
    assert repr(d) == "Design(batch=4, chips=8, stages=1)" and str(d) == repr(d)
    assert "f32[]" not in repr(hw()) and "flops=9.89e+14" in repr(hw())
    r = _decode(0.0)
    assert "f32[]" not in repr(r) and "tpot=" in repr(r)
    sol = dcost.grid_search(serving(tpot_slo=0.02))
    text = str(sol)
    assert "f32[]" not in text and "Design(batch=" in text and "binding=('tpot',)" in text
    batch = dcost.Design(jnp.array([1.0, 2.0]))
    assert repr(batch) == "Design(batch=[1., 2.], chips=1, stages=1)"


def test_traced_specs_still_print_as_equinox_does():
    seen = []

    @eqx.filter_jit
    def f(d):
        seen.append(repr(d))
        return d.batch

    f(dcost.Design(4.0))
    assert "f32[]" in seen[0]
