"""``benchmarks/suite_compiles.py``: its parsing of JAX's compile log and cache-miss explanations
(its doctests), and one real run whose compilations are known: the messages it reads are JAX's
own, whose wording a JAX release may change."""

import doctest
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location(
        "suite_compiles", ROOT / "benchmarks" / "suite_compiles.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_doctests():
    result = doctest.testmod(_module())
    assert result.attempted >= 7 and result.failed == 0


def test_a_run_counts_what_it_compiled_and_says_why(tmp_path, capsys):
    """A test file that compiles ``twice_of`` for two shapes and ``scaled`` for two values of a
    static argument: two compilations of each, explained as other shapes and a static argument."""
    (tmp_path / "test_probe.py").write_text(
        "import functools\n"
        "import jax, jax.numpy as jnp\n\n"
        "@jax.jit\n"
        "def twice_of(x):\n"
        "    return 2.0 * x\n\n"
        "@functools.partial(jax.jit, static_argnames='k')\n"
        "def scaled(x, k):\n"
        "    return k * x\n\n"
        "def test_probe():\n"
        "    twice_of(jnp.ones(3)); twice_of(jnp.ones(4))\n"
        "    scaled(jnp.ones(3), k=2.0); scaled(jnp.ones(3), k=3.0)\n",
        encoding="utf-8",
    )
    assert _module().main(["--top", "50", "--timeout", "300", str(tmp_path / "test_probe.py")]) == 0
    out = capsys.readouterr().out
    assert "1 passed" in out
    rows = {line.split()[-1]: line.split()[:2] for line in out.splitlines() if "jit(" in line}
    assert rows["jit(twice_of)"][1] == "2" and rows["jit(scaled)"][1] == "2"
    assert "twice_of: other shapes or dtypes" in out
    assert "scaled: static argument" in out
