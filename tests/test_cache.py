"""The persistent compilation cache (``dcost._cache``), ``dcost warmup`` and the lazy imports.

The cache is decided once, at ``import dcost``, from the environment, so every case runs in a fresh
Python process with its own HOME and XDG_CACHE_HOME (never the user's real cache directory).
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

import dcost

ROOT = pathlib.Path(__file__).resolve().parents[1]

# prints what the cache decided and JAX's resulting settings, then compiles one small program
PROBE = """
import json, jax, jax.numpy as jnp, dcost
s = dcost._cache.state()
jax.jit(lambda x: x * 2.0 + 1.0)(jnp.arange(3.0)).block_until_ready()
print(json.dumps({
    "path": None if s.path is None else str(s.path), "owner": s.owner, "reason": s.reason,
    "jax_dir": jax.config.jax_compilation_cache_dir,
    "min_time": jax.config.jax_persistent_cache_min_compile_time_secs,
}))
"""


def _env(tmp_path, **extra):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("JAX_", "DCOST_", "XDG_CACHE_HOME", "XLA_"))
    }
    env.update(HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    env.update(extra)
    return env


def _python(tmp_path, code, **extra):
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(tmp_path, **extra),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def _probe(tmp_path, **extra):
    proc = _python(tmp_path, PROBE, **extra)
    assert proc.stderr == "", proc.stderr  # not even a warning
    return json.loads(proc.stdout)


def _entries(path) -> list[str]:
    return sorted(f.name for f in pathlib.Path(path).iterdir() if not f.name.startswith("."))


def test_on_by_default_under_xdg_cache_home(tmp_path):
    xdg = tmp_path / "xdg"
    got = _probe(tmp_path, XDG_CACHE_HOME=str(xdg))
    want = str(xdg / "dcost" / "jax")
    assert got["owner"] == "dcost" and got["path"] == got["jax_dir"] == want
    assert got["min_time"] == 0  # small programs are kept too
    assert _entries(want), "the program compiled by the probe is not on disk"


def test_without_xdg_cache_home_it_goes_under_home(tmp_path):
    got = _probe(tmp_path)
    assert got["path"] == str(tmp_path / "home" / ".cache" / "dcost" / "jax")


def test_dcost_cache_dir_puts_it_elsewhere(tmp_path):
    got = _probe(tmp_path, DCOST_CACHE_DIR=str(tmp_path / "elsewhere"))
    assert got["path"] == got["jax_dir"] == str(tmp_path / "elsewhere")


def test_dcost_cache_0_turns_it_off(tmp_path):
    got = _probe(tmp_path, DCOST_CACHE="0", XDG_CACHE_HOME=str(tmp_path / "xdg"))
    assert got["owner"] == "off" and got["path"] is None and got["jax_dir"] is None
    assert not (tmp_path / "xdg").exists()


def test_unwritable_directory_is_off_without_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")  # even root cannot create a directory under a file
    got = _probe(tmp_path, DCOST_CACHE_DIR=str(blocker / "cache"))
    assert got["owner"] == "unwritable" and got["path"] is None and got["jax_dir"] is None
    assert str(blocker / "cache") in got["reason"]


def test_the_users_own_jax_cache_is_respected(tmp_path):
    mine = tmp_path / "mine"
    got = _probe(tmp_path, JAX_COMPILATION_CACHE_DIR=str(mine), DCOST_CACHE_DIR=str(tmp_path / "x"))
    assert got["owner"] == "user" and got["path"] == got["jax_dir"] == str(mine)
    assert got["min_time"] == 1.0  # JAX's default, untouched by dcost
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_warmup_fills_the_cache_and_a_second_process_hits_it(tmp_path):
    xdg = tmp_path / "xdg"
    cache = xdg / "dcost" / "jax"
    first = _python(
        tmp_path, "import dcost.cli as c; c.main(['warmup', '--quick'])", XDG_CACHE_HOME=str(xdg)
    )
    assert f"cache: {cache} (on)" in first.stdout and "eval decode" in first.stdout
    entries = _entries(cache)
    assert entries
    # a second process compiles nothing new: every program comes from the cache
    count_hits = """
import jax, dcost.cli as c
hits = []
jax.monitoring.register_event_listener(
    lambda name, **kw: hits.append(name) if name == "/jax/compilation_cache/cache_hits" else None)
c.main(["warmup", "--quick"])
print("hits", len(hits))
"""
    second = _python(tmp_path, count_hits, XDG_CACHE_HOME=str(xdg))
    assert "0 new entries" in second.stdout
    hits = int(second.stdout.split("hits ")[1])
    assert hits >= len(entries) > 0
    assert _entries(cache) == entries


def test_warmup_with_the_cache_off_says_so(tmp_path):
    proc = _python(
        tmp_path, "import dcost.cli as c; c.main(['warmup', '--quick'])", DCOST_CACHE="off"
    )
    assert "cache: none (turned off by DCOST_CACHE=off)" in proc.stdout
    assert "nothing to warm" in proc.stdout


def test_import_dcost_leaves_matplotlib_and_optax_alone(tmp_path):
    code = (
        "import sys, dcost; print(sorted(m for m in ('matplotlib', 'optax') if m in sys.modules))"
    )
    assert _python(tmp_path, code).stdout.strip() == "[]"


@pytest.mark.parametrize("name", dcost.__all__)
def test_every_public_name_resolves(name):
    assert getattr(dcost, name) is not None
    assert name in dir(dcost)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'optimise'"):
        dcost.optimise  # noqa: B018
