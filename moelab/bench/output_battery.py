"""The output-policy battery of ``moelab bench reliability``: every command that writes a folder or a file, run
against the targets a user must never lose (a folder of their files, the current folder, the repository's
``notebooks/`` and root, a symbolic link to their folder, a file of theirs). A case is *expected* when the
command answers ``error: ...`` with exit 2 and every byte of the target is unchanged; anything else counts
in ``cli_output_cases_unexpected`` (goal 0). Each case is refused before any work, so the battery takes seconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tempfile
from pathlib import Path
from typing import Any

from moelab._outputs import MARKER

#: each folder writer's command line; "{}" stands for the target
FOLDER_WRITERS: dict[str, list[str]] = {
    "book build": ["book", "build", "{}", "--names", "00"],
    "notebooks run": ["notebooks", "run", "00", "--preset", "ci", "--out", "{}"],
    "course release": ["course", "release", "{}", "--labs", "00"],
    "slides": ["slides", "00", "{}"],
    "sweep": ["sweep", "eldr", "--out", "{}", "--no-progress"],
    "calibrate": ["calibrate", "--smoke", "--out", "{}"],
}
#: each file writer's command line; "{}" stands for the target file
FILE_WRITERS: dict[str, list[str]] = {
    "bench --json": ["bench", "afd", "--quick", "--json", "{}"],
    "hd-replay --json": ["hd-replay", "--json", "{}"],
    "build-hd-stores --out": ["build-hd-stores", "--stores", "S", "--engine", "hf", "--out", "{}"],
}


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` (links not followed) with its SHA-256 ("link" for a link): what a command
    must leave as it found it."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            out[str(p.relative_to(root))] = "link" if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _run(argv: list[str]) -> tuple[int, str]:
    from moelab.cli import main  # lazy: the CLI imports the notebook stack

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own usage errors
            code = int(exc.code or 0)
    return code, err.getvalue()


def run_battery() -> dict[str, Any]:
    """Run every writer against every hostile target; return the case count and the unexpected cases."""
    # lazy: the notebook stack loads only when the battery runs
    from moelab.datasets import repo_root
    from moelab.notebooks import notebooks_dir

    unexpected: list[str] = []
    cases = 0
    with tempfile.TemporaryDirectory(prefix="moelab-output-battery-") as tmp:
        base = Path(tmp)
        user = base / "user"
        (user / "sub").mkdir(parents=True)
        (user / "thesis.tex").write_text("years of work")
        (user / "sub" / "data.csv").write_text("1,2,3\n")
        link = base / "link"
        link.symlink_to(user, target_is_directory=True)
        user_file = base / "results.json"
        user_file.write_text('{"mine": true}')
        watched = {"user": user, "notebooks": notebooks_dir()}
        folder_targets = {"user folder": user, "link to it": link, "notebooks/": notebooks_dir(),
                          "inside notebooks/": notebooks_dir() / "out", "repository root": repo_root()}
        before = {k: tree_digest(v) for k, v in watched.items()}
        cwd = os.getcwd()
        try:
            for writers, targets in ((FOLDER_WRITERS, folder_targets),
                                     (FILE_WRITERS, {"user file": user_file, "file in the package":
                                                     Path(__file__).resolve().parent / "x.json"})):
                for writer, argv in writers.items():
                    for what, target in targets.items():
                        cases += 1
                        code, err = _run([a.replace("{}", str(target)) for a in argv])
                        if code != 2 or not err.startswith("error: "):
                            unexpected.append(f"{writer} into {what}: exit {code} {err.strip()[:80]!r}")
            os.chdir(user)  # "." from a folder of the user's files
            for writer, argv in FOLDER_WRITERS.items():
                cases += 1
                code, err = _run([a.replace("{}", ".") for a in argv])
                if code != 2:
                    unexpected.append(f"{writer} into '.': exit {code}")
        finally:
            os.chdir(cwd)
        after = {k: tree_digest(v) for k, v in watched.items()}
        for k in watched:
            if after[k] != before[k]:
                unexpected.append(f"files under {k} changed")
        if user_file.read_text() != '{"mine": true}' or (user / MARKER).exists():
            unexpected.append("the user's file or folder was written")
    return {"cases": cases, "unexpected": unexpected}


__all__ = ["FILE_WRITERS", "FOLDER_WRITERS", "run_battery", "tree_digest"]
