"""The public cost functions are jitted: one trace per structure, the same answers and errors.

Traces are counted with Python side effects in module functions that run only while JAX traces
(``roofline._assemble`` for the steps, ``roofline._rates`` for the closed forms), not with a jitted
function's cache size, which is shared by every wrapper of one function in the process. Each test
gives its inputs a leaf shape no other test uses (13 or 11 designs), so its first call traces
whatever ran before it in the process; after that, other numbers, presets of the same structure,
Python ``int``/``float``/NumPy smoothness and contexts must not trace again, and a new structure
must (the counter works).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dcost
from dcost.serving import mixed, roofline


class Counter:
    """Wraps a function and counts its calls (here: its traces)."""

    def __init__(self, fun):
        self.fun, self.calls = fun, 0

    def __call__(self, *args, **kw):
        self.calls += 1
        return self.fun(*args, **kw)


STEPS = {
    "decode": dcost.decode,
    "prefill": dcost.prefill,
    "mixed_step": dcost.mixed_step,
}


@pytest.mark.parametrize("name", sorted(STEPS))
def test_a_step_traces_once_per_structure(monkeypatch, name):
    step = STEPS[name]
    traces = Counter(roofline._assemble)
    monkeypatch.setattr(roofline, "_assemble", traces)
    monkeypatch.setattr(mixed, "_assemble", traces)
    batch = np.arange(1.0, 14.0)  # 13 designs: a signature of this test's own

    def call(b=batch, chips=8, hw="h100-sxm", model="llama-3-70b", context=4096, s=0.0):
        w = dcost.Workload(context, prompt=1000, output=500)
        d = dcost.Design(batch=b, chips=chips)
        return step(d, dcost.hardware(hw), dcost.model(model), w, s)

    # a mixed step is the mean of two kinds of step, each assembled once
    per_trace = 2 if name == "mixed_step" else 1
    first = call()
    assert traces.calls == per_trace
    variants = [
        call(b=2 * batch),
        call(chips=4),
        call(chips=4.0),
        call(chips=np.float32(2)),
        call(hw="b200", model="llama-3-8b"),
        call(context=100),
        call(context=2048.5),
        call(s=0),
        call(s=0.1),
        call(s=1),
        call(s=np.float64(0.05)),
    ]
    assert traces.calls == per_trace, "new numbers, presets or smoothness traced the step again"
    assert all(v.cost_per_token.shape == (13,) for v in (first, *variants))
    if name == "decode":  # a new structure traces anew: the counter counts (once is enough)
        w = dcost.Workload(4096, acceptance=0.5)
        drafted = dcost.model("llama-3-70b", draft_params=1e9, draft_layers=1)  # needs a draft
        step(dcost.Design(batch=batch, draft_tokens=1.0), dcost.hardware("h100-sxm"), drafted, w)
        assert traces.calls == 2


def pair():
    return dcost.hardware("h100-sxm"), dcost.model("llama-3-70b")


def test_closed_forms_trace_once_per_structure(monkeypatch):
    traces = Counter(roofline._rates)
    monkeypatch.setattr(roofline, "_rates", traces)
    h = dcost.hardware("h100-sxm", price_per_hour=np.linspace(1.0, 3.0, 11))  # 11: this test's
    m = dcost.model("llama-3-70b")
    dcost.balance_batch(h, m)
    dcost.critical_context(h, m)
    assert traces.calls == 2
    for context in (0, 0.0, 1024, 4096.5, np.float32(512.0), np.array(64.0)):
        dcost.balance_batch(h, m, context)
    dcost.critical_context(dcost.hardware("b200", price_per_hour=np.ones(11)), m)
    assert traces.calls == 2
    dcost.balance_batch(h, m, np.linspace(0.0, 4096.0, 11))  # a context per chip: new shape
    assert traces.calls == 3


def test_inside_a_users_jit_vmap_and_grad():
    h, m = dcost.hardware("h100-sxm"), dcost.model("llama-3-70b")
    batch, context = jnp.asarray([1.0, 16.0, 256.0]), jnp.asarray([512.0, 2048.0, 8192.0])

    def cost(b, t):
        return dcost.decode(dcost.Design(batch=b, chips=8), h, m, dcost.Workload(t)).cost_per_token

    swept = jax.jit(jax.vmap(cost))(batch, context)
    one_by_one = [float(cost(b, t)) for b, t in zip(batch, context, strict=True)]
    np.testing.assert_allclose(np.asarray(swept), one_by_one, rtol=1e-6)

    # d cost / d batch < 0 where weight reads dominate; the gradient agrees with a difference
    g = jax.jit(jax.grad(cost))(16.0, 2048.0)
    fd = (float(cost(16.5, 2048.0)) - float(cost(15.5, 2048.0))) / 1.0
    assert float(g) < 0 and float(g) == pytest.approx(fd, rel=1e-2)

    prompt = jax.jit(lambda t: dcost.prefill(dcost.Design(4.0), h, m, dcost.Workload(t)).ttft)
    assert float(prompt(4096.0)) == pytest.approx(
        float(dcost.prefill(dcost.Design(4.0), h, m, dcost.Workload(4096.0)).ttft), rel=1e-6
    )
    assert float(jax.jit(dcost.balance_batch)(h, m, 0.0)) == pytest.approx(
        float(dcost.balance_batch(h, m)), rel=1e-6
    )


def test_a_concrete_bad_workload_is_refused_inside_a_users_jit():
    """Traced numbers are not checked, but a concrete workload closed over still is, by name."""
    h, m = dcost.hardware("h100-sxm"), dcost.model("llama-3-70b")
    w = dcost.Workload(0.0, prompt=0.0)
    with pytest.raises(dcost.SpecError, match=r"Workload.prompt = 0.0 .* >= 1"):
        jax.jit(lambda b: dcost.prefill(dcost.Design(b), h, m, w).ttft)(1.0)
    with pytest.raises(dcost.SpecError, match=r"Workload.prompt = 0.0 .* >= 1"):
        dcost.prefill(dcost.Design(1.0), h, m, w)


def test_overflow_is_refused_after_the_jitted_call_and_not_under_a_users_jit():
    h, m = dcost.hardware("h100-sxm"), dcost.model("llama-3-70b")
    d, w = dcost.Design(batch=2.0**24, chips=8), dcost.Workload(3e38)
    with pytest.raises(dcost.SpecError, match=r"decode: Design\(batch=1.67772e\+07.*overflow"):
        dcost.decode(d, h, m, w)
    traced = jax.jit(lambda t: dcost.decode(d, h, m, dcost.Workload(t)))(3e38)
    leaves = np.stack([np.asarray(x) for x in jax.tree.leaves(traced)])
    assert not np.all(np.isfinite(leaves))  # traced inputs: not checked, as documented
