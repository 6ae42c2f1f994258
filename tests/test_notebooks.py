"""Execute every notebook in ``notebooks/`` and check the numbers it prints.

Each notebook ends with a cell tagged ``summary`` that prints a JSON object of its key numbers; the
checks below recompute them independently (a published figure, the arithmetic of a closed form, a
brute-force search in NumPy over constants read from the preset files) rather than comparing with
the notebook's own saved output. The kernel runs with the repository root as working directory, so
``import dcost`` inside it is this checkout's, and with this interpreter (jupyter_client starts the
``python3`` kernel with ``sys.executable``); a cell appended to the in-memory copy checks both.

The committed notebooks must be saved executed (outputs present), which is checked without running
them. Running them takes most of this file's time (about 20-80 s each on 2 cores). The kernels
run with the suite's ``DCOST_FAST_COMPILE`` and ``XLA_FLAGS`` (``tests/conftest.py``).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import sys

import numpy as np
import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

import dcost  # noqa: E402

pytestmark = pytest.mark.notebooks
ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
NAMES = [p.stem for p in NOTEBOOKS]
_PROBE = "import sys, dcost\nprint(sys.executable)\nprint(dcost.__file__)"


def _card(kind: str, name: str) -> dict:
    """Numbers of a preset file entry (``{value = ..., source = ...}`` tables unwrapped)."""
    card = {
        "hardware": dcost.presets.hardware_card,
        "fit": dcost.training.scaling.scaling_fit_card,
    }[kind](name)
    return {k: (v["value"] if isinstance(v, dict) and "value" in v else v) for k, v in card.items()}


@pytest.fixture(scope="module")
def executed():
    """Run each notebook once per session: name -> (executed notebook, summary dict)."""
    cache = {}

    def run(name):
        if name not in cache:
            nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
            nb.cells.append(nbformat.v4.new_code_cell(_PROBE))
            client = nbclient.NotebookClient(
                nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
            )
            # the kernel inherits the suite's DCOST_FAST_COMPILE=all and XLA_FLAGS. The sensitivity
            # notebook once ran at each program's own level, its exhaustive grid being 4x slower
            # at level 0; the grid's chunks now keep their own level everywhere
            # (``sweep=True``), and the notebook took 61 s with the suite's settings against
            # 65 s without (2026-12-01, alone, 2 cores)
            client.execute(env=dict(os.environ))
            cells = [c for c in nb.cells if "summary" in c.metadata.get("tags", [])]
            assert len(cells) == 1, f"{name}: exactly one cell must be tagged 'summary'"
            cache[name] = (nb, json.loads(_stdout(cells[0])))
        return cache[name]

    return run


def _stdout(cell) -> str:
    return "".join(
        o.get("text", "")
        for o in cell.get("outputs", [])
        if o.output_type == "stream" and o.name == "stdout"
    )


@pytest.mark.parametrize("name", NAMES)
def test_saved_executed(name):
    """The committed file carries its outputs: every code cell ran, in order, without error."""
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    counts = [c.execution_count for c in code]
    assert None not in counts, f"{name}: saved without outputs; execute it before committing"
    assert counts == sorted(counts)
    assert not any(o.output_type == "error" for c in code for o in c.outputs)
    assert any("image/png" in o.get("data", {}) for c in code for o in c.outputs)


@pytest.mark.parametrize("name", NAMES)
def test_runs_clean(name, executed):
    """Top to bottom without error (nbclient raises on one) or Python warning, on this interpreter
    and this checkout's dcost. (Other stderr, such as JAX's note that it falls back to the CPU,
    depends on the machine and is allowed.)"""
    nb, _ = executed(name)
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if o.output_type == "stream" and o.name == "stderr":
                assert "Warning:" not in o.text and "Traceback" not in o.text, (
                    f"{name}: {o.text[:500]!r}"
                )
    exe, module = _stdout(nb.cells[-1]).split()
    assert pathlib.Path(exe) == pathlib.Path(sys.executable)
    assert pathlib.Path(module).resolve().is_relative_to(ROOT)


# --- training_budget -----------------------------------------------------------------------------

CHINCHILLA = {"flops": 5.76e23, "n_params": 70e9, "n_tokens": 1.4e12}
"""Hoffmann et al. 2022 (arXiv:2203.15556), section 4.1: Chinchilla, 70B parameters on 1.4T
tokens, trained with the compute budget of Gopher (5.76e23 FLOP)."""


def _loss(c, n, d):
    return c["E"] + c["A"] * n ** -c["alpha"] + c["B"] * d ** -c["beta"]


def _brute_force_lifetime(c, target, d_inf):
    """Fewest lifetime FLOPs on the iso-loss curve, by a dense grid (then a finer one) in N."""
    delta = target - c["E"]
    n_min = (c["A"] / delta) ** (1.0 / c["alpha"])
    lo, hi = math.log(n_min) + 1e-9, math.log(n_min) + 12.0
    for _ in range(3):
        n = np.exp(np.linspace(lo, hi, 200_001))
        d = (c["B"] / (delta - c["A"] * n ** -c["alpha"])) ** (1.0 / c["beta"])
        flops = 6.0 * n * d + 2.0 * n * d_inf
        i = int(np.argmin(flops))
        step = (hi - lo) / 200_000
        lo, hi = math.log(n[i]) - 2 * step, math.log(n[i]) + 2 * step
    return n[i], d[i], flops[i]


def test_training_budget(executed):
    _, s = executed("training_budget")
    fits = {name: _card("fit", name) for name in ("hoffmann2022", "besiroglu2024")}

    # Compute optimum: on the budget, the replication near Chinchilla itself, the published
    # rounded fit where a brute-force search along the iso-FLOP line puts it.
    c = s["chinchilla_flops"]
    assert c == CHINCHILLA["flops"]
    for plan in s["chinchilla"].values():
        assert 6.0 * plan["n_params"] * plan["n_tokens"] == pytest.approx(c, rel=1e-9)
    rep = s["chinchilla"]["besiroglu2024"]
    assert rep["n_params"] == pytest.approx(CHINCHILLA["n_params"], rel=0.1)
    assert rep["n_tokens"] == pytest.approx(CHINCHILLA["n_tokens"], rel=0.1)
    for name, plan in s["chinchilla"].items():
        n = np.exp(np.linspace(math.log(1e9), math.log(1e12), 400_001))
        best = n[np.argmin(_loss(fits[name], n, c / (6.0 * n)))]
        assert plan["n_params"] == pytest.approx(best, rel=1e-4)
    assert s["isoflop_max_log_error"] <= s["isoflop_grid_step"] / 2

    # The lecture's arithmetic: 50M tokens/s for 60 days; 6 N D = 2 N D_inf.
    lec = s["lecture"]
    assert lec["inference_tokens"] == pytest.approx(5e7 * 86400 * 60, rel=1e-12)
    assert lec["n_tokens"] == pytest.approx(lec["inference_tokens"] / 3.0, rel=1e-12)
    assert lec["overtrain"] == pytest.approx(lec["n_tokens"] / (20 * 1e11), rel=1e-12)
    assert lec["flops"] == pytest.approx(6e11 * lec["n_tokens"] + 2e11 * lec["inference_tokens"])

    # Lifetime optimum: on the target loss, and no plan on the iso-loss curve does better.
    for name, opt in s["lifetime"].items():
        f = fits[name]
        assert opt["target_loss"] == pytest.approx(_loss(f, 1e11, lec["n_tokens"]), rel=1e-12)
        assert _loss(f, opt["n_params"], opt["n_tokens"]) == pytest.approx(
            opt["target_loss"], rel=1e-9
        )
        n, d, flops = _brute_force_lifetime(f, opt["target_loss"], lec["inference_tokens"])
        assert opt["flops"] == pytest.approx(flops, rel=1e-9)
        assert opt["n_params"] == pytest.approx(n, rel=1e-4)
        assert opt["n_tokens"] == pytest.approx(d, rel=1e-4)
        assert opt["flops"] <= lec["flops"]
        assert opt["train_fraction"] == pytest.approx(
            6 * opt["n_params"] * opt["n_tokens"] / opt["flops"], rel=1e-9
        )
    assert s["n_falls_with_traffic"] and s["r_grows_with_traffic"]

    # Dollars: the dense template keeps the loss constraint exact; a served token dearer than its
    # FLOPs (rho > 1) acts like more traffic, so the model is smaller than the FLOP optimum.
    for name, usd in s["dollars"].items():
        f, opt = fits[name], s["lifetime"][name]
        assert usd["inference_tokens"] == pytest.approx(lec["inference_tokens"], rel=1e-12)
        assert _loss(f, usd["n_params"], usd["n_tokens"]) == pytest.approx(
            opt["target_loss"], rel=1e-6
        )
        assert usd["rho"] > 1.0
        assert usd["n_params"] < opt["n_params"]

    # The training run: 6 N D FLOP at the datasheet rate, stretched by the 1F1B bubble.
    run, h = s["training_run"], _card("hardware", "h100-sxm")
    bubble = (run["stages"] - 1) / (run["microbatches"] + run["stages"] - 1)
    seconds = 6 * run["n_params"] * run["n_tokens"] / (run["n_chips"] * h["flops"] * run["mfu"])
    assert run["seconds"] == pytest.approx(seconds / (1 - bubble), rel=1e-9)
    assert run["cost"] == pytest.approx(
        run["n_chips"] * h["price_per_hour"] * run["seconds"] / 3600, rel=1e-9
    )
    assert run["fits"] and run["memory_per_chip"] <= h["hbm_capacity"]
    weights_and_grads = 4.0 * run["n_params"] / (run["tensor"] * run["stages"])
    assert run["memory_per_chip"] >= weights_and_grads


# --- tour --------------------------------------------------------------------------------------


def test_tour(executed):
    _, s = executed("tour")
    h = _card("hardware", "gb200-nvl72")
    card = dcost.presets.model_card("deepseek-v3")
    pub, arch = card["published"], card["arch"]
    n_total, n_active, b_kv = pub["params_total"], pub["params_active"], pub["kv_bytes_per_token"]
    b_w = card["serving"]["bytes_per_param"]
    # MLA decode with absorbed projections: 2 L h ((r_kv + r_rope) + r_kv) FLOP per context token
    a = (
        2
        * arch["n_layers"]
        * arch["n_heads"]
        * (2 * arch["kv_lora_rank"] + arch["qk_rope_head_dim"])
    )
    f, bw = h["flops_fp8"], h["hbm_bandwidth"]
    assert s["flops"] == pytest.approx(f, rel=1e-6)
    assert s["hbm_bandwidth"] == pytest.approx(bw, rel=1e-6)

    # The evaluated design, by hand (published counts are rounded: 37B active is 37.55B derived).
    d = s["decode"]
    bsz, g, t = d["batch"], d["chips"], d["context"]
    assert d["t_kv"] == pytest.approx(bsz * t * b_kv / (g * bw), rel=1e-5)
    assert d["t_compute"] == pytest.approx(bsz * (2 * n_active + a * t) / (g * f), rel=0.02)
    assert d["tpot"] == pytest.approx(
        max(d["t_compute"], d["t_weights"] + d["t_kv"], d["t_comm"]), rel=1e-6
    )
    assert d["cost_per_token"] == pytest.approx(
        g * h["price_per_hour"] / 3600 * d["tpot"] / bsz, rel=1e-5
    )
    assert d["memory_per_chip"] == pytest.approx((b_w * n_total + bsz * t * b_kv) / g, rel=0.01)
    # at most every routed expert is read once: weights <= all parameters over G chips
    assert d["t_weights"] <= b_w * 1.01 * n_total / (g * bw)

    # Closed forms from the published figures.
    assert s["balance_batch_0"] == pytest.approx(f / bw * b_w / 2 * n_total / n_active, rel=0.02)
    t_c = 2 * n_active * bw / (b_kv * f - a * bw)
    assert s["critical_context"] == pytest.approx(t_c, rel=0.02)
    b_1024 = b_w * n_total * f / ((2 * n_active + a * 1024) * bw - 1024 * b_kv * f)
    assert s["balance_batch_1024"] == pytest.approx(b_1024, rel=0.03)
    # The exact sweep turns compute bound between two grid points around B* (all experts read).
    assert s["batch_before_knee"] < s["balance_batch_1024"] <= s["knee"]
    assert s["elasticity_max_gap"] < 0.01


def test_tour_optimizer(executed):
    """The optimized fleet: feasible, priced by hand, and no worse than 1 % above the exhaustive
    grid (the exact optimum, which it can never beat)."""
    _, s = executed("tour")
    for name, o in s["optimize"].items():
        h = _card("hardware", name)
        batch, chips, stages = o["x"]
        assert o["feasible"]
        assert o["tpot"] <= 0.05 and o["memory_per_chip"] <= 0.9 * h["hbm_capacity"]
        assert batch == round(batch) and chips == round(chips) and stages == round(stages)
        # P*G chips at p $/h produce P*B tokens per tpot
        by_hand = stages * chips * h["price_per_hour"] / 3600 * o["tpot"] / (stages * batch)
        assert o["cost"] == pytest.approx(by_hand, rel=1e-5)
        assert o["grid_cost"] * (1 - 1e-6) <= o["cost"] <= 1.01 * o["grid_cost"]
    assert s["sensitivity_price"] == pytest.approx(1.0, abs=1e-4)
    f = s["frontier"]
    finite = np.isfinite(f["cost"])
    assert np.all(np.diff(np.asarray(f["cost"])[finite]) <= 1e-12)  # looser target, cheaper token
    assert np.all(np.asarray(f["tpot"])[finite] <= np.asarray(f["tpot_slo"])[finite])


# --- sensitivity -------------------------------------------------------------------------------


def test_sensitivity(executed):
    _, s = executed("sensitivity")
    e = np.asarray(s["elasticity"])  # (model, hardware, field)
    fields = s["fields"]
    kkt = np.asarray(s["kkt"])
    # Cost is proportional to the price, and the optimal design does not depend on it.
    assert np.allclose(e[..., fields.index("price_per_hour")], 1.0, atol=1e-3)
    # Dimensional analysis: scale every rate and the latency target together, or every byte count
    # and bandwidth together (see the notebook); these identities are coded nowhere in dcost.
    assert np.allclose(s["time_rule"], -1.0, atol=1e-3)
    assert np.allclose(s["byte_rule"], 0.0, atol=1e-3)
    # 10 % more HBM bandwidth: the elasticity against re-solving exactly, where the relaxation's
    # optimum is a verified KKT point (the integer optimum moves in steps: 1 point of tolerance).
    assert kkt.sum() >= kkt.size // 2
    gap = np.abs(np.asarray(s["predicted"]) - np.asarray(s["resolved"]))
    assert np.all(gap[kkt] < 1.0)
    # The latency multiplier is the slope of the re-solved relaxation where it is a KKT point and
    # the relaxed layout (chips, stages) stays put between the re-solved targets (at a link jump
    # the multiplier is that of the held layout).
    ok = np.asarray(s["lambda_kkt"]) & np.asarray(s["same_layout"])
    assert ok.any()
    lam, slope = np.asarray(s["lambda_tpot"]), np.asarray(s["relaxed_slope"])
    assert np.allclose(lam[ok], slope[ok], atol=0.05)
    cost = np.asarray(s["frontier_cost"])
    assert np.all(np.diff(cost) <= 1e-12 * cost[:-1])  # exact frontier: looser target, cheaper


# --- planning ----------------------------------------------------------------------------------


def test_planning(executed):
    """The notebook's plan priced by hand from the preset card and the calibrated profile, its
    targets met, its simulation within 10 % at the targets' percentiles, the grid's answer
    equal to the search's, and a looser TPOT target never dearer."""
    _, s = executed("planning")
    card = _card("hardware", "h100-sxm")
    assert s["price_per_hour"] == pytest.approx(card["price_per_hour"], rel=1e-6)
    assert s["chips"] == sum(p["replicas"] * p["chips_per_replica"] for p in s["pools"])
    assert s["cost_per_hour"] == pytest.approx(s["chips"] * card["price_per_hour"], rel=1e-6)
    assert s["ttft"]["0.99"] <= 2.0 and s["tpot"]["0.9"] <= 0.05
    q = s["simulated_quantiles"]
    assert s["ttft"]["0.99"] == pytest.approx(s["simulated_ttft"][q.index(0.99)], rel=0.10)
    assert s["tpot"]["0.9"] == pytest.approx(s["simulated_tpot"][q.index(0.9)], rel=0.10)
    assert s["grid"][s["mode"]] == s["chips"]
    assert s["grid"][s["alternative"]["mode"]] == s["alternative"]["chips"]
    assert s["chips"] <= s["alternative"]["chips"] or s["mode"] == "aggregated"
    bill = np.asarray(s["bill"], float)
    finite = np.isfinite(bill)
    assert finite.any() and np.all(np.diff(bill[finite]) <= 1e-9)  # looser target, no dearer


# --- validation --------------------------------------------------------------------------------


def test_validation(executed):
    """The notebook's held-out summary is the one ``dcost validate --write`` shipped, its counts
    and its deployment's records are those of the record file read here, the pure step of its
    example is the roofline's closed form, and its MoE fit is NumPy's least squares over the
    shipped timings."""
    import tomllib

    from dcost.calibrate import families

    _, s = executed("validation")
    raw = tomllib.loads((ROOT / "dcost/validation/records.toml").read_text())["record"]
    assert s["records"] == len(raw) and s["sources"] == len({r["source_id"] for r in raw})
    assert s["fitted"] == sum(families.fitted(r) for r in raw)
    families_seen = {r["family"] for r in raw if families.fitted(r)}
    assert set(s["per_family"]) == families_seen
    for family, n in s["per_family"].items():
        assert n == sum(r["family"] == family and families.fitted(r) for r in raw)
    shipped = tomllib.loads((ROOT / "dcost/presets/calibration.toml").read_text())["heldout"]
    assert s["median"] == pytest.approx(shipped["overall"]["median"], abs=1e-3)
    assert s["p90"] == pytest.approx(shipped["overall"]["p90"], abs=1e-3)
    assert s["bound_holds"] == 1.0
    shipped_sw = shipped["overall"]["source_weighted"]
    for key in ("median", "p90"):
        assert s["source_weighted"][key] == pytest.approx(shipped_sw[key], abs=1e-3)
    assert s["source_weighted"]["sources"] == len(
        {r["source_id"] for r in raw if families.fitted(r)}
    )
    want = [r["id"] for r in raw if r["model"] == "deepseek-r1" and r["hardware"] == "b200"]
    assert s["chosen"] == want and 0 < s["chosen_median"] < 2
    pure, cal = s["example"]["pure bound"], s["example"]["calibrated"]
    roof = max(pure["t_compute"], pure["t_weights"] + pure["t_kv"], pure["t_comm"])
    assert pure["tpot"] == pytest.approx(roof, rel=1e-5) and pure["t_overhead"] == 0.0
    assert cal["tpot"] > pure["tpot"] and cal["t_overhead"] > 0
    run = json.loads((ROOT / "benchmarks/results/moe_decode_h200.json").read_text())
    skip = {(t["batch"], t["context"]): t["seconds"] for t in run["skip"]}
    x = np.array([t["touched"] for t in run["timings"]])
    y = np.array([1e3 * (t["seconds"] - skip[(t["batch"], t["context"])]) for t in run["timings"]])
    design = np.stack([np.ones_like(x), x], 1)
    (t0, slope), *_ = np.linalg.lstsq(design, y, rcond=None)
    assert s["moe"]["t0_ms"] == pytest.approx(t0, rel=1e-6)
    assert s["moe"]["per_expert_ms"] == pytest.approx(slope, rel=1e-6)
    expert_bytes = 48 * 3 * 2048 * 768 * 2  # qwen3-30b-a3b's card: one expert in every layer, bf16
    assert s["moe"]["marginal_bytes_per_s"] == pytest.approx(
        expert_bytes / (slope * 1e-3), rel=1e-6
    )
