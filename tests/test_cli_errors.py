"""Every ``moelab`` command answers a user error with ``error: <message>`` and exit status 2, never a
traceback: bad arguments, an ``--out`` that is a file or cannot be written, a port in use or privileged."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from moelab.cli import main

BUDGET = ["--token-budget", "1000"]


def _fails_cleanly(capsys, argv: list[str], *needles: str) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, (argv, rc, err)
    assert err.startswith("error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (argv, err)
    return err


@pytest.mark.parametrize("extra, needle", [
    ([], "give a budget"),
    (BUDGET + ["--layers", "0"], "--layers"),
    (BUDGET + ["--experts", "4", "--top-k", "5"], "--top-k"),
    (BUDGET + ["--hidden", "30", "--heads", "4"], "--hidden must be divisible"),
    (BUDGET + ["--lr", "-1"], "--lr"),
    (BUDGET + ["--lr", "nan"], "--lr"),
    (BUDGET + ["--warmup", "-1"], "--warmup"),
    (BUDGET + ["--aux-coef", "-0.5"], "--aux-coef"),
    (BUDGET + ["--threads", "0"], "--threads"),
    (BUDGET + ["--vocab", "10"], "--vocab"),
    (BUDGET + ["--max-bytes", "0"], "--max-bytes"),
    (BUDGET + ["--device", "tpu"], "--device"),
    (BUDGET + ["--domains", "python,klingon"], "--domains"),
    (BUDGET + ["--domains", ","], "--domains"),
    (BUDGET + ["--extra", "/nonexistent/moelab-extra"], "--extra"),
    (["--time-budget", "0"], "--time-budget"),
    (["--token-budget", "-5"], "--token-budget"),
])
def test_train_tiny_moe_argument_errors(capsys, tmp_path, extra, needle):
    _fails_cleanly(capsys, ["train-tiny-moe", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o"), *extra], needle)
    assert not (tmp_path / "w").exists() and not (tmp_path / "o").exists()  # refused before doing anything


def test_train_tiny_moe_bad_out_and_work_folders(capsys, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    base = ["train-tiny-moe", *BUDGET]
    _fails_cleanly(capsys, [*base, "--work", str(tmp_path / "w"), "--out", str(a_file)], "--out", "not a folder")
    _fails_cleanly(capsys, [*base, "--work", str(tmp_path / "w"), "--out", str(a_file / "sub")], "--out", "not a writable folder")
    _fails_cleanly(capsys, [*base, "--work", str(a_file), "--out", str(tmp_path / "o")], "--work", "not a folder")
    _fails_cleanly(capsys, [*base, "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o"), "--corpus", str(a_file)],
                   "--corpus")
    assert a_file.read_text() == "x"


def test_train_tiny_moe_unwritable_out(capsys, tmp_path):
    if os.geteuid() == 0:  # root writes anywhere a permission bit allows; sysfs refuses even root
        target = Path("/sys/moelab-cli-test")
        if not Path("/sys").is_dir():
            pytest.skip("no /sys to stand for an unwritable folder")
    else:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        target = locked / "out"
    _fails_cleanly(capsys, ["train-tiny-moe", *BUDGET, "--work", str(tmp_path / "w"), "--out", str(target)],
                   "--out", "not a writable folder")


def test_serve_router_errors(capsys):
    _fails_cleanly(capsys, ["serve-router", "-b", "127.0.0.1:8000"], "backend URL")
    _fails_cleanly(capsys, ["serve-router", "-b", "http://127.0.0.1:8000", "--port", "70000"], "port")
    _fails_cleanly(capsys, ["serve-router", "-b", "http://127.0.0.1:8000", "--host", "0.0.0.0"], "loopback")
    _fails_cleanly(capsys, ["serve-router", "-b", "http://127.0.0.1:8000", "--max-inflight", "0"], "max_inflight")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        _fails_cleanly(capsys, ["serve-router", "-b", "http://127.0.0.1:8000", "--port", str(port)],
                       f"cannot listen on 127.0.0.1:{port}", "in use")


def test_serve_router_privileged_port(capsys):
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 1))
        pytest.skip("this user may bind privileged ports (root)")
    except PermissionError:
        pass
    _fails_cleanly(capsys, ["serve-router", "-b", "http://127.0.0.1:8000", "--port", "1"], "cannot listen on 127.0.0.1:1")


def test_other_commands(capsys, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    _fails_cleanly(capsys, ["bench", "no-such-suite"], "suite")
    _fails_cleanly(capsys, ["notebooks", "run", "no-such-notebook", "--out", str(tmp_path / "runs")])
    _fails_cleanly(capsys, ["calibrate", "--smoke", "--out", str(a_file)], str(a_file))


def test_user_error_message_leaves_bugs_alone():
    from moelab.cli import user_error_message

    assert user_error_message(ValueError("bad")) == "bad"
    assert "No such file" in user_error_message(FileNotFoundError(2, "No such file or directory", "x.npz"))
    assert user_error_message(OSError(98, "address already in use")) == "address already in use"
    assert user_error_message(KeyError("x")) is None and user_error_message(OSError(5, "I/O error")) is None


def test_real_entry_point_prints_no_traceback(tmp_path):
    """Through the installed entry point: a delegated command and an argparse usage error."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    for argv in (["train-tiny-moe", "--out", str(tmp_path)], ["train-tiny-moe", "--layers", "many"],
                 ["serve-router"], ["no-such-command"]):
        r = subprocess.run([sys.executable, "-m", "moelab.cli", *argv], capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 2, (argv, r.stderr)
        assert "error: " in r.stderr and "Traceback" not in r.stderr, (argv, r.stderr)
