"""``dcost daemon`` and the launcher that hands it commands (``dcost_launch``).

Each check compares the daemon's answer with the same command run in its own process
(``DCOST_DAEMON=0``): the same stdout, stderr and exit code, and the daemon's count of commands
answered says which way a command went.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest

import dcost_launch
from dcost.cli.app import main

EVAL = ["eval", "--hardware", "h100-sxm", "--model", "llama-3-70b", "--batch", "64", "--chips", "8"]


def _launch(args, env, cwd=None):
    """The console script, as a user runs it."""
    code = "import dcost_launch; dcost_launch.run()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _served(env) -> int | None:
    """How many commands the daemon of ``env`` has answered; None where none runs (asked over
    its socket, as ``dcost daemon status`` asks)."""
    path = pathlib.Path(env["DCOST_DAEMON_DIR"]) / f"{dcost_launch.key(env)}.sock"
    try:
        for msg in dcost_launch.request(path, {"op": "status"}, timeout=10):
            return int(msg["status"]["served"])
    except OSError:
        return None
    return None


@pytest.fixture
def daemon_env(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    env = dict(os.environ, DCOST_DAEMON_DIR=str(run_dir))
    yield env
    for path in run_dir.glob("*.sock"):  # as `dcost daemon stop --all` does
        try:
            for _ in dcost_launch.request(path, {"op": "stop"}, timeout=10):
                pass
        except OSError:
            pass


@pytest.mark.slow
def test_a_running_daemon_answers_as_its_own_process_would(daemon_env, tmp_path):
    env = daemon_env
    here = dict(env, DCOST_DAEMON="0")
    status = _launch(["daemon", "status"], env)
    assert status.returncode == 1 and "none running" in status.stdout
    started = _launch(["daemon", "start", "--idle", "5"], env)
    assert started.returncode == 0, started.stderr
    assert "started (pid" in started.stdout
    assert _served(env) == 0
    status = _launch(["daemon", "status"], env)
    assert status.returncode == 0 and "this environment: pid" in status.stdout
    again = _launch(["daemon", "start"], env)
    assert again.returncode == 0 and "already running" in again.stdout

    asked = [
        EVAL + ["--context", "2048", "--json"],
        ["eval", "--hardware", "h100-sxm"],  # argparse: exit 2, usage on stderr
        ["eval", "--hardware", "h100-sxm", "--model", "no-such-model", "--batch", "1"],
    ]
    codes = []
    for n, args in enumerate(asked, start=1):
        mine, its = _launch(args, here), _launch(args, env)
        assert (its.returncode, its.stdout, its.stderr) == (
            mine.returncode,
            mine.stdout,
            mine.stderr,
        )
        assert _served(env) == n
        codes.append(mine.returncode)
        if n == 1:
            assert json.loads(its.stdout)  # the whole JSON through the socket
    assert codes == [0, 2, 2]

    # the caller's working directory: a file named relative to it is read there
    work = tmp_path / "work"
    work.mkdir()
    (work / "s.csv").write_text("model,hardware,traffic,rate\nllama-3-70b,h100-sxm,chat,-5\n")
    args = ["plan", "--scenarios", "s.csv", "--out", "o.csv"]
    mine, its = _launch(args, here, cwd=work), _launch(args, env, cwd=work)
    assert its.returncode == mine.returncode == 2
    assert its.stderr == mine.stderr and "s.csv, line 2, column 4 (rate)" in its.stderr
    served = _served(env)
    assert served == len(asked) + 1  # the plan too

    # a client that says nothing, or sends what is not a request: dropped, the daemon goes on
    path = pathlib.Path(env["DCOST_DAEMON_DIR"]) / f"{dcost_launch.key(env)}.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(path))
        s.sendall(b"[1, 2]\n")
        assert s.recv(100) == b""
    assert _served(env) == served

    # a working directory gone: an error, and the daemon answers the next command
    gone = tmp_path / "gone"
    gone.mkdir()
    said = list(
        dcost_launch.request(
            path, {"argv": ["presets"], "cwd": str(gone / "x"), "key": dcost_launch.key(env)}
        )
    )
    assert (
        said[-1] == {"rc": 1}
        and "could not run it" in said[0]["stderr"]
        and "gone" in said[0]["stderr"]
    )
    served += 1
    assert _served(env) == served

    # not handed over: help, DCOST_DAEMON=0, another compiling environment
    assert _launch(["eval", "--help"], env).returncode == 0
    assert _launch(["presets"], here).returncode == 0
    other = dict(env, DCOST_FAST_COMPILE="0")
    assert _launch(["presets"], other).returncode == 0
    assert _served(other) is None
    assert _served(env) == served

    # the launcher imports neither dcost nor JAX when the daemon answers
    probe = (
        "import sys, dcost_launch; code = dcost_launch.forward(['presets']);"
        "print(code, 'jax' in sys.modules, 'dcost' in sys.modules, file=sys.stderr)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.stderr.strip().splitlines()[-1] == "0 False False"
    assert out.stdout == _launch(["presets"], here).stdout
    assert _served(env) == served + 1

    stopped = _launch(["daemon", "stop"], env)
    assert stopped.returncode == 0 and "stopped 1" in stopped.stdout
    assert _launch(["daemon", "status"], env).returncode == 1
    assert not list(pathlib.Path(env["DCOST_DAEMON_DIR"]).glob("*.sock"))


@pytest.mark.slow
def test_an_idle_daemon_ends_by_itself(daemon_env):
    assert _launch(["daemon", "start", "--idle", "0.02"], daemon_env).returncode == 0  # 1.2 s
    deadline = time.monotonic() + 60
    while _served(daemon_env) is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _served(daemon_env) is None
    assert not list(pathlib.Path(daemon_env["DCOST_DAEMON_DIR"]).glob("*.sock"))


@pytest.mark.slow
def test_auto_starts_a_daemon_on_the_first_command(daemon_env):
    env = dict(daemon_env, DCOST_DAEMON="auto")
    assert _served(env) is None
    mine = _launch(["presets"], dict(env, DCOST_DAEMON="0"))
    first, second = _launch(["presets"], env), _launch(["presets"], env)
    assert first.returncode == second.returncode == mine.returncode == 0
    assert first.stdout == second.stdout == mine.stdout
    assert _served(env) == 2  # the first command started it, and both went to it
    st = dcost_launch.status(
        pathlib.Path(env["DCOST_DAEMON_DIR"]) / f"{dcost_launch.key(env)}.sock"
    )
    assert st is not None and st["idle_s"] == dcost_launch.AUTO_IDLE_S


@pytest.mark.parametrize("idle", ["0", "-1", "nan", "inf"])
def test_a_bad_idle_time_is_refused(daemon_env, idle, monkeypatch, capsys):
    monkeypatch.setenv("DCOST_DAEMON_DIR", daemon_env["DCOST_DAEMON_DIR"])
    assert main(["daemon", "start", "--idle", idle]) == 2
    err = capsys.readouterr().err
    assert f"--idle = {float(idle)}" in err and "finite number > 0" in err


def test_a_directory_others_can_reach_is_refused(tmp_path, monkeypatch, capsys):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("DCOST_DAEMON_DIR", str(shared))
    with pytest.raises(dcost_launch.DaemonDirError, match=r"shared \(owner uid \d+, mode 777\)"):
        dcost_launch.directory()
    assert dcost_launch.forward(["presets"]) is None  # the command then runs in its own process
    assert main(["daemon", "start"]) == 2
    err = capsys.readouterr().err
    assert "must belong to uid" in err and "mode 700" in err


def test_a_socket_nobody_listens_on_is_removed(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    monkeypatch.setenv("DCOST_DAEMON_DIR", str(run_dir))
    path = dcost_launch.socket_path(dcost_launch.key())
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))  # left behind, as by a daemon that was killed
    assert path.exists()
    assert dcost_launch.forward(["presets"]) is None
    assert not path.exists()


def test_the_key_follows_what_decides_the_answer():
    base = {"HOME": "/h", "DCOST_FAST_COMPILE": "all"}
    k = dcost_launch.key(base)
    assert len(k) == 24 and int(k, 16) >= 0
    assert dcost_launch.key(dict(base)) == k
    # what changes how dcost compiles or where it keeps its programs
    for name, value in [
        ("DCOST_FAST_COMPILE", "0"),
        ("DCOST_CACHE_DIR", "/c"),
        ("JAX_ENABLE_X64", "1"),
        ("XLA_FLAGS", "--xla_force_host_platform_device_count=4"),
        ("XDG_CACHE_HOME", "/x"),
    ]:
        assert dcost_launch.key(dict(base, **{name: value})) != k, name
    # what does not: where the daemon is, whether to use it, unrelated variables, and the flag
    # that importing dcost adds to XLA_FLAGS
    for name, value in [
        ("DCOST_DAEMON", "0"),
        ("DCOST_DAEMON_DIR", "/d"),
        ("HOME", "/elsewhere"),
        ("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type="),
    ]:
        assert dcost_launch.key(dict(base, **{name: value})) == k, name
    from dcost import _xla

    assert dcost_launch._YNN_GUARD == _xla.YNN_FLAG


def test_which_commands_are_handed_over(monkeypatch):
    monkeypatch.delenv("DCOST_DAEMON", raising=False)
    assert dcost_launch.forwardable(["plan", "--hardware", "h100-sxm"])
    assert dcost_launch.forwardable(["eval"])
    for argv in (["serve"], ["daemon", "start"], ["warmup"], ["plan", "--help"], ["-h"], []):
        assert not dcost_launch.forwardable(argv), argv
    from dcost.cli import app

    assert dcost_launch.FORWARDED <= set(app._SUBCOMMANDS)  # every name is a subcommand
    for off in ("0", "off", "No"):
        monkeypatch.setenv("DCOST_DAEMON", off)
        assert not dcost_launch.forwardable(["plan"])
