"""Hostile input, round three: no command deletes or overwrites what it did not write (moelab._outputs).

Every writer is run against a folder of a user's files, the repository's notebooks/, the repository root, a
symbolic link and a user's file; each must answer ``error: ...`` with exit 2 before any work and leave every
byte where it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from moelab._outputs import (
    MARKER,
    OutputPolicyError,
    check_output_dir,
    check_output_file,
    record_output_file,
    record_outputs,
    replace_dir,
)
from moelab.bench.output_battery import FOLDER_WRITERS as WRITERS
from moelab.bench.output_battery import tree_digest
from moelab.cli import main
from moelab.notebooks import notebooks_dir

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def user_folder(tmp_path) -> Path:
    folder = tmp_path / "mine"
    (folder / "sub").mkdir(parents=True)
    (folder / "thesis.tex").write_text("years of work")
    (folder / "sub" / "data.csv").write_text("1,2,3\n")
    return folder


def _refused(argv: list[str], capsys, *must_say: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, (argv, err)
    assert err.startswith("error: "), err
    for s in must_say:
        assert s in err, (s, err)
    return err


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_no_writer_touches_a_folder_of_user_files(writer, user_folder, capsys):
    before = tree_digest(user_folder)
    argv = [a.replace("{}", str(user_folder)) for a in WRITERS[writer]]
    _refused(argv, capsys, str(user_folder))
    assert tree_digest(user_folder) == before
    assert not (user_folder / MARKER).exists()


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("where", ["notebooks", "notebooks/sub", "moelab", "root", "tests"])
def test_no_writer_writes_into_the_sources(writer, where, capsys):
    target = {"notebooks": notebooks_dir(), "notebooks/sub": notebooks_dir() / "sub", "moelab": REPO / "moelab" / "x",
              "root": REPO, "tests": REPO / "tests" / "out"}[where]
    watched = REPO / "notebooks"
    before = tree_digest(watched)
    argv = [a.replace("{}", str(target)) for a in WRITERS[writer]]
    _refused(argv, capsys)
    assert tree_digest(watched) == before
    assert not (target / MARKER).exists()


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_no_writer_writes_through_a_symlink(writer, user_folder, tmp_path, capsys):
    link = tmp_path / "link"
    link.symlink_to(user_folder, target_is_directory=True)
    before = tree_digest(user_folder)
    argv = [a.replace("{}", str(link)) for a in WRITERS[writer]]
    _refused(argv, capsys, "symbolic link")
    assert tree_digest(user_folder) == before and link.is_symlink()


def test_book_build_from_a_non_empty_current_folder_is_refused(user_folder, capsys, monkeypatch):
    monkeypatch.chdir(user_folder)
    before = tree_digest(user_folder)
    _refused(["book", "build", ".", "--names", "00"], capsys, "did not write")
    assert tree_digest(user_folder) == before


def test_book_build_from_a_missing_folder_is_refused(tmp_path, capsys):
    _refused(["book", "build", str(tmp_path / "book"), "--from", str(tmp_path / "nowhere")], capsys, "--from")
    assert not (tmp_path / "book").exists()


def test_notebooks_run_refuses_a_file_the_user_put_where_its_output_goes(tmp_path, capsys):
    out = tmp_path / "runs"
    out.mkdir()
    record_outputs(out, "notebooks run", [])  # a runs folder moelab made...
    (out / "00_overview.ipynb").write_text("the user's own notebook")  # ...where the user saved a notebook
    _refused(["notebooks", "run", "00", "--preset", "ci", "--out", str(out)], capsys, "did not write it")
    assert (out / "00_overview.ipynb").read_text() == "the user's own notebook"


@pytest.mark.parametrize("argv", [["bench", "afd", "--quick", "--json", "{}"],
                                  ["hd-replay", "--json", "{}"]])
def test_json_writers_refuse_a_users_file_before_any_work(argv, tmp_path, capsys):
    mine = tmp_path / "results.json"
    mine.write_text('{"mine": true}')
    _refused([a.replace("{}", str(mine)) for a in argv], capsys, "did not write it")
    assert mine.read_text() == '{"mine": true}'
    _refused([a.replace("{}", str(REPO / "moelab" / "x.json")) for a in argv], capsys, "part of moelab's sources")


def test_build_hd_stores_refuses_a_users_file(tmp_path, capsys):
    mine = tmp_path / "S.npz"
    mine.write_bytes(b"not an S store")
    code = main(["build-hd-stores", "--stores", "S", "--engine", "hf", "--out", str(mine)])
    err = capsys.readouterr().err
    assert code == 2 and "did not write it" in err, err
    assert mine.read_bytes() == b"not an S store"


# ---- the policy itself ------------------------------------------------------------------------------------


def test_a_folder_the_command_wrote_can_be_replaced_unless_a_user_file_appeared(tmp_path):
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / "index.html").write_text("v1")
    site = replace_dir(staged, tmp_path / "site", "book build")
    assert check_output_dir(site, writer="book build", replace=True) == site
    (site / "notes.txt").write_text("mine")  # a user's file inside the book
    with pytest.raises(OutputPolicyError, match="notes.txt"):
        check_output_dir(site, writer="book build", replace=True)
    (site / "notes.txt").unlink()
    (site / "index.html").write_text("edited by hand")  # a file the command wrote, changed since
    with pytest.raises(OutputPolicyError, match="index.html"):
        check_output_dir(site, writer="book build", replace=True)
    with pytest.raises(OutputPolicyError, match="written by 'moelab book build'"):
        check_output_dir(site, writer="slides")


def test_an_own_output_file_is_overwritten_a_changed_one_is_not(tmp_path):
    out = tmp_path / "figs.json"
    assert check_output_file(out, writer="bench", name="--json") == out
    out.write_text("[1]")
    record_output_file(out, "bench")
    check_output_file(out, writer="bench", name="--json")  # its own, unchanged: fine
    with pytest.raises(OutputPolicyError, match="did not write it"):
        check_output_file(out, writer="hd-replay", name="--json")
    out.write_text("[1, 2]")
    with pytest.raises(OutputPolicyError, match="changed since"):
        check_output_file(out, writer="bench", name="--json")


def test_a_forged_or_linked_marker_is_refused(tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / MARKER).write_text("[]")
    with pytest.raises(OutputPolicyError, match="not a marker moelab wrote"):
        check_output_dir(folder, writer="book build")
    (folder / MARKER).unlink()
    (folder / MARKER).symlink_to(tmp_path)
    with pytest.raises(OutputPolicyError, match="symbolic link"):
        check_output_dir(folder, writer="book build")
