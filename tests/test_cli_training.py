"""The ``train`` and ``lifetime`` sub-commands, driven through their own argparse parsers."""

from __future__ import annotations

import argparse
import json

import jax
import pytest

import dcost
from dcost.cli.training import add_parsers


def _run(argv, capsys):
    parser = argparse.ArgumentParser(prog="dcost")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code = args.func(args)
    return code, capsys.readouterr().out


TRAIN = [
    "train",
    "--params",
    "70e9",
    "--tokens",
    "15e12",
    "--hardware",
    "h100-sxm",
    "--chips",
    "4096",
    "--mfu",
    "0.45",
]


def test_train_json_has_si_fields_matching_training_run(capsys):
    code, out = _run(
        TRAIN + ["--tensor", "8", "--stages", "4", "--microbatches", "32", "--json"], capsys
    )
    assert code == 0
    got = json.loads(out)
    with jax.enable_x64(True):
        setup = dcost.TrainingSetup(tensor=8, stages=4, microbatches=32)
        run = dcost.training_run(70e9, 15e12, dcost.hardware("h100-sxm"), 4096, 0.45, setup)
    assert got["flops"] == pytest.approx(6 * 70e9 * 15e12, rel=1e-12)
    assert got["seconds"] == pytest.approx(float(run.seconds), rel=1e-12)
    assert got["cost_usd"] == pytest.approx(float(run.cost), rel=1e-12)
    assert got["memory_per_chip_bytes"] == pytest.approx(float(run.memory_per_chip), rel=1e-12)
    assert got["data_parallel"] == 128 and got["fits"] is True


def test_train_readable_output_reports_days_cost_and_fit(capsys):
    code, out = _run(TRAIN, capsys)
    assert code == 0
    days = 6 * 70e9 * 15e12 / (4096 * 989.4e12 * 0.45) / 86400
    assert f"{days:.1f} days" in out
    assert "does NOT fit" in out  # 70B with no model parallelism: 280 GB of weights per chip
    _, out = _run(TRAIN + ["--tensor", "8", "--stages", "4"], capsys)
    assert ": fits" in out
    # A model preset instead of a count: its own active parameters.
    argv = ["train", "--model", "llama-3-70b"] + TRAIN[3:] + ["--tensor", "8", "--json"]
    _, out = _run(argv, capsys)
    assert json.loads(out)["n_params"] == pytest.approx(
        float(dcost.model("llama-3-70b").params_active), rel=1e-6
    )


def test_lifetime_json_and_text(capsys):
    code, out = _run(
        [
            "lifetime",
            "--loss",
            "1.95",
            "--inference-tokens",
            "2e12",
            "--fit",
            "besiroglu2024",
            "--json",
        ],
        capsys,
    )
    got = json.loads(out)
    with jax.enable_x64(True):
        best = dcost.lifetime_optimum(1.95, 2e12, "besiroglu2024")
    assert code == 0 and got["reachable"] is True
    assert got["n_params"] == pytest.approx(float(best.n_params), rel=1e-9)
    assert got["n_tokens"] == pytest.approx(float(best.n_tokens), rel=1e-9)
    assert got["overtrain"] == pytest.approx(got["n_tokens"] / (20 * got["n_params"]), rel=1e-9)
    code, out = _run(["lifetime", "--loss", "1.95", "--inference-tokens", "2e12"], capsys)
    assert code == 0 and "over-training r" in out


def test_lifetime_unreachable_is_exit_1_with_nulls(capsys):
    code, out = _run(
        [
            "lifetime",
            "--loss",
            "1.75",
            "--inference-tokens",
            "1e12",
            "--max-tokens",
            "1e11",
            "--json",
        ],
        capsys,
    )
    got = json.loads(out)
    assert code == 1 and got["reachable"] is False and got["n_params"] is None
    code, out = _run(
        ["lifetime", "--loss", "1.75", "--inference-tokens", "1e12", "--max-tokens", "1e11"], capsys
    )
    assert code == 1 and "unreachable" in out


@pytest.mark.parametrize(
    "argv, field",
    [
        (["lifetime", "--loss", "1.6", "--inference-tokens", "1e12"], "target_loss"),
        (["lifetime", "--loss", "2.0", "--inference-tokens", "1e12", "--fit", "kaplan"], "kaplan"),
        (["lifetime", "--loss", "2.0", "--inference-tokens", "-5"], "inference_tokens"),
        (TRAIN[:6] + ["tpu-v9"] + TRAIN[7:], "tpu-v9"),
        (TRAIN + ["--tensor", "3"], "chips"),
        (TRAIN + ["--recompute", "some"], "recompute"),
        (
            [
                "train",
                "--params",
                "70e9",
                "--tokens",
                "0",
                "--hardware",
                "h100-sxm",
                "--chips",
                "8",
            ],
            "n_tokens",
        ),
    ],
)
def test_bad_values_raise_value_error_naming_them(argv, field, capsys):
    with pytest.raises(ValueError, match=field):
        _run(argv, capsys)
