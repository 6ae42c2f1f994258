"""``benchmarks/matmul_sweep.py`` and the curves it fits (``local.fit_matmul_curve``, the roofline
with a matmul-size curve, and ``local.fit_kernel_roofline``, the smooth roofline)."""

import importlib.util
import json
import pathlib

import numpy as np
import pytest

from dcost.calibrate.local import fit_kernel_roofline, fit_matmul_curve

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _sweep_module():
    spec = importlib.util.spec_from_file_location(
        "matmul_sweep", ROOT / "benchmarks" / "matmul_sweep.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("eta_bw", "eta_f", "half"), [(0.9, 0.75, 0.0), (0.6, 0.5, 120.0)])
def test_fit_recovers_a_planted_roofline(eta_bw, eta_f, half):
    m = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192.0])
    flops_per_token, weight_bytes, flops, bandwidth = 4 * 8192 * 28672, 940e6, 7e14, 2.7e12
    compute = flops_per_token * m * (1 + half / m) / (flops * eta_f)
    t = np.maximum(weight_bytes / (bandwidth * eta_bw), compute)
    fit = fit_matmul_curve(m, t, flops_per_token, weight_bytes, flops, bandwidth)
    assert fit["bandwidth_efficiency"] == pytest.approx(eta_bw, rel=0.01)
    assert fit["flops_efficiency"] == pytest.approx(eta_f, rel=0.01)
    assert fit["matmul_half_tokens"] == pytest.approx(half, abs=0.05 * half + 2.0)
    assert fit["rms_log_error"] < 0.01


@pytest.mark.parametrize(
    ("tokens", "seconds"),
    [
        ([1.0, 2.0], [1.0, 2.0]),
        ([1.0, 2.0, 4.0], [1.0, 2.0]),
        ([0.0, 1.0, 2.0], [1.0, 1.0, 1.0]),
        ([1.0, 2.0, 4.0], [1.0, -1.0, 1.0]),
        ([1.0, 2.0, 4.0], [1.0, float("nan"), 1.0]),
    ],
)
def test_fit_refuses_what_it_cannot_fit(tokens, seconds):
    with pytest.raises(ValueError, match="fit_matmul_curve"):
        fit_matmul_curve(tokens, seconds, 1.0, 1.0, 1.0, 1.0)


def test_fit_refuses_a_non_positive_scale():
    with pytest.raises(ValueError, match="bandwidth = 0.0"):
        fit_matmul_curve([1.0, 2.0, 4.0], [1.0, 1.0, 1.0], 1.0, 1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="n_grid = 2"):
        fit_matmul_curve([1.0, 2.0, 4.0], [1.0, 1.0, 1.0], 1.0, 1.0, 1.0, 1.0, n_grid=2)


def test_the_quick_sweep_runs_and_writes_its_figures(tmp_path, capfd):
    out = tmp_path / "sweep.json"
    assert (
        _sweep_module().main(["--quick", "--inner", "2", "--repeats", "1", "--json", str(out)]) == 0
    )
    data = json.loads(out.read_text())
    (shape,) = data["shapes"]
    assert [p["tokens"] for p in shape["points"]] == [1, 8, 64]
    assert all(p["seconds"] > 0 for p in shape["points"])
    assert set(shape["fit"]) == {
        "bandwidth_efficiency",
        "flops_efficiency",
        "matmul_half_tokens",
        "rms_log_error",
        "smooth",
    }
    assert "smooth roofline:" in capfd.readouterr().out


def test_the_sweep_refuses_bad_arguments():
    with pytest.raises(SystemExit):
        _sweep_module().main(["--quick", "--inner", "0"])


def test_the_shipped_sweeps_fit_a_sharp_roofline():
    """The sweeps measured on the lent H100 and H200: the weight-read time holds to 128 tokens and
    the fitted half-rate point stays under 50 tokens (what families.PRIOR's docstring quotes)."""
    for name in ("h100", "h200"):
        data = json.loads(
            (ROOT / "benchmarks" / "results" / f"matmul_sweep_{name}.json").read_text()
        )
        assert data["source"].startswith("dcost@")
        for shape in data["shapes"]:
            t = {p["tokens"]: p["seconds"] for p in shape["points"]}
            assert t[128] < 1.35 * t[1]  # still reading weights
            assert t[8192] > 10 * t[1]  # compute bound
            refit = fit_matmul_curve(
                np.array(list(t)),
                np.array(list(t.values())),
                4.0 * shape["k"] * shape["n"],
                4.0 * shape["k"] * shape["n"],
                data["flops"],
                data["copy_bandwidth"],
            )
            assert refit["matmul_half_tokens"] < 50 and refit["rms_log_error"] < 0.15


@pytest.mark.parametrize("r", [0.0, 0.3, 0.8])
def test_smooth_fit_recovers_a_planted_kernel_roofline(r):
    """Times made as ``(t_F^(1/r) + t_W^(1/r))^r`` (the max at r = 0) give back r and both
    efficiencies."""
    m = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192.0])
    flops_per_token, weight_bytes, flops, bandwidth = 4 * 8192 * 28672, 940e6, 7e14, 2.7e12
    t_f, t_w = flops_per_token * m / (flops * 0.7), weight_bytes / (bandwidth * 0.9)
    t = np.maximum(t_f, t_w) if r == 0 else (t_f ** (1 / r) + t_w ** (1 / r)) ** r
    fit = fit_kernel_roofline(m, t, flops_per_token, weight_bytes, flops, bandwidth)
    assert fit["kernel_roofline_smoothness"] == pytest.approx(r, abs=0.01)
    assert fit["bandwidth_efficiency"] == pytest.approx(0.9, rel=0.01)
    assert fit["flops_efficiency"] == pytest.approx(0.7, rel=0.01)
    with pytest.raises(ValueError, match="fit_kernel_roofline"):
        fit_kernel_roofline(m[:2], t[:2], flops_per_token, weight_bytes, flops, bandwidth)


def test_refit_of_the_shipped_sweeps_with_no_device(capfd):
    """``--refit`` fits the saved points again: on the lent H100 and H200 the smooth roofline fits
    every shape at least as well as the matmul-size curve, with r between 0.1 and 0.5 (the
    figure the README and families.PRIOR quote against the serving profiles' 0.43-0.48)."""
    for name in ("h100", "h200"):
        path = ROOT / "benchmarks" / "results" / f"matmul_sweep_{name}.json"
        assert _sweep_module().main(["--refit", str(path)]) == 0
        data = json.loads(path.read_text())
        for shape in data["shapes"]:
            pts = shape["points"]
            args = (
                np.array([p["tokens"] for p in pts], float),
                np.array([p["seconds"] for p in pts]),
                4.0 * shape["k"] * shape["n"],
                4.0 * shape["k"] * shape["n"],
                data["flops"],
                data["copy_bandwidth"],
            )
            smooth, sharp = fit_kernel_roofline(*args), fit_matmul_curve(*args)
            assert 0.1 <= smooth["kernel_roofline_smoothness"] <= 0.5
            assert smooth["rms_log_error"] <= sharp["rms_log_error"]
    assert capfd.readouterr().out.count("smooth roofline:") == 6
