"""One output policy for every command that writes a folder or a file.

A command never deletes or overwrites anything it did not write itself. What moelab wrote is recorded in a
marker file, :data:`MARKER`, beside it: a folder a command owns holds the marker (which command wrote it, and
the SHA-256 of every file it wrote there); a single output file (``bench --json``, ``hd-replay --json``) is
recorded in the marker of the folder it sits in. Before any work a command checks its target:

* a symbolic link is refused (writing through it would land where the user did not name);
* a path inside the repository's ``notebooks/``, the ``moelab`` package, ``tests/`` or ``.git``
  is refused, and so is the repository root itself (the committed sources are never an output);
* a folder that exists must be empty or carry the marker of the same command; a file that exists must be
  recorded in its folder's marker, by the same command, with the content moelab wrote (a file the user
  changed since is the user's);
* a command that replaces its folder whole (``book build``, ``course release``) also requires that every
  file inside is one it wrote: a file the user added there is named and the command stops.

Each refusal is an :class:`OutputPolicyError` (a ``ValueError``, so the CLI answers ``error: ...`` and exit 2)
naming the path and what to do.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from moelab._io import DEFAULT_MAX_JSON_BYTES, atomic_write_json

#: the marker file of a folder moelab writes into
MARKER = ".moelab-output.json"
_VERSION = 1


class OutputPolicyError(ValueError):
    """An output path a command refuses to write (see the module docstring); the message names the path."""


def _package_dir() -> Path:
    return Path(__file__).resolve().parent


def _repo_root() -> Path | None:
    """The source checkout moelab runs from, when it runs from one (an editable install)."""
    root = _package_dir().parent
    return root if (root / "pyproject.toml").is_file() and (root / "notebooks").is_dir() else None


def protected_paths() -> list[Path]:
    """The folders no command may write into: the ``moelab`` package and, in a source checkout, its
    ``notebooks/``, ``tests/``, ``.ci`` and ``.git`` (``data/`` stays writable: ``moelab calibrate`` adds a GPU's
    tables under ``data/calibration/``, into a new folder)."""
    out = [_package_dir()]
    root = _repo_root()
    if root is not None:
        out += [root / d for d in ("notebooks", "tests", ".git", ".ci")]
    return [p.resolve() for p in out]


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The marker of ``folder`` (``{"writer": ..., "files": {relpath: {"writer", "sha256"}}}``), ``None``
    when there is none; an unreadable or foreign marker is an :class:`OutputPolicyError`."""
    path = folder / MARKER
    if path.is_symlink():
        raise OutputPolicyError(f"{path} is a symbolic link, not a moelab marker; remove it or choose another path")
    if not path.is_file():
        return None
    try:
        if path.stat().st_size > DEFAULT_MAX_JSON_BYTES:
            raise ValueError("too large")
        data = json.loads(path.read_text())
        if not (isinstance(data, dict) and data.get("moelab_output") == _VERSION
                and isinstance(data.get("files"), dict)):
            raise ValueError("not a moelab marker")
    except (OSError, ValueError) as exc:
        raise OutputPolicyError(f"{path} is not a marker moelab wrote ({exc}); remove it or choose another "
                                "path") from None
    return data


def _check_path(path: Path, name: str) -> Path:
    """``path`` absolute (its parents' links resolved, its own name kept), after the symlink and the
    protected-tree checks."""
    raw = Path(path).expanduser()
    if raw.is_symlink():
        raise OutputPolicyError(f"{name} {raw} is a symbolic link; moelab writes only to a real path it can own "
                                "(name the link's target, or another path)")
    full = Path(os.path.abspath(raw))
    resolved = full.parent.resolve() / full.name
    root = _repo_root()
    if root is not None and resolved == root.resolve():
        raise OutputPolicyError(f"{name} {resolved} is the repository's root; choose a folder of its own "
                                "(e.g. runs/ or book/)")
    for folder in protected_paths():
        if _inside(resolved, folder):
            raise OutputPolicyError(f"{name} {resolved} is inside {folder}, part of moelab's sources; moelab never "
                                    "writes its outputs there (choose a path outside it, e.g. runs/)")
        if folder != resolved and resolved in folder.parents:
            raise OutputPolicyError(f"{name} {resolved} holds {folder}, part of moelab's sources; choose a folder of "
                                    "its own")
    return resolved


def _foreign_files(folder: Path, marker: dict[str, Any], writer: str) -> list[str]:
    """Files under ``folder`` that ``writer`` did not write there (or that changed since), as relative paths."""
    files = marker.get("files", {})
    out = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for d in list(dirnames):
            if (Path(dirpath) / d).is_symlink():
                out.append(str((Path(dirpath) / d).relative_to(folder)))
                dirnames.remove(d)
        for f in filenames:
            p = Path(dirpath) / f
            rel = p.relative_to(folder).as_posix()
            if rel == MARKER:
                continue
            entry = files.get(rel)
            if (p.is_symlink() or not isinstance(entry, dict) or entry.get("writer") != writer
                    or entry.get("sha256") != _sha256(p)):
                out.append(rel)
    return sorted(out)


def check_output_dir(path: str | os.PathLike, *, writer: str, name: str = "OUT",
                     replace: bool = False, overwrites: Iterable[str] = (), owned_subdirs: Iterable[str] = ()) -> Path:
    """Check, before any work, that ``writer`` may write into the folder ``path``.

    Parameters
    ----------
    path : path
        The folder.
    writer : str
        The command, e.g. ``"book build"``: a folder carrying another command's marker is refused.
    name : str
        The option or argument in messages (``OUT``, ``--out``).
    replace : bool
        The command replaces the folder whole: every file inside must be one ``writer`` wrote, unchanged.
    overwrites : iterable of str
        Files (relative to the folder) the command will write: each must be absent, or written by ``writer``
        and unchanged since.
    owned_subdirs : iterable of str
        Subfolders whose files the command rewrites without naming them in advance (a notebook's figures, the
        vendored scripts of a slide deck): every file already under each must pass the ``overwrites`` check.

    Returns
    -------
    pathlib.Path
        The folder, absolute.

    Raises
    ------
    OutputPolicyError
        A link, a protected path, a file, a foreign non-empty folder, or a file that is not the command's own.
    """
    folder = _check_path(Path(path), name)
    if not folder.exists():
        return folder
    if not folder.is_dir():
        raise OutputPolicyError(f"{name} must be a folder; {folder} is a file")
    marker = read_marker(folder)
    if marker is None:
        if any(folder.iterdir()):
            raise OutputPolicyError(f"{name} {folder} is a folder that moelab did not write (it holds files and no "
                                    f"{MARKER}); moelab never writes over what it did not write: name an empty or "
                                    "new folder")
        return folder
    if marker.get("writer") != writer:
        raise OutputPolicyError(f"{name} {folder} was written by 'moelab {marker.get('writer')}', not "
                                f"'moelab {writer}'; name another folder")
    if replace:
        foreign = _foreign_files(folder, marker, writer)
        if foreign:
            raise OutputPolicyError(f"{name} {folder} holds {len(foreign)} file(s) moelab {writer} did not write "
                                    f"or that changed since ({', '.join(foreign[:5])}); replacing the folder would "
                                    "delete them: move them out or name another folder")
    owned = [p.relative_to(folder).as_posix() for d in owned_subdirs if (folder / d).is_dir()
             for p in (folder / d).rglob("*") if p.is_file() or p.is_symlink()]
    for rel in [*overwrites, *owned]:
        _check_own_file(folder, marker, rel, writer, name)
    return folder


def _check_own_file(folder: Path, marker: dict[str, Any] | None, rel: str, writer: str, name: str) -> None:
    target = folder / rel
    if target.is_symlink():
        raise OutputPolicyError(f"{name}: {target} is a symbolic link; moelab will not write through it")
    if not target.exists():
        return
    if target.is_dir():
        raise OutputPolicyError(f"{name}: {target} is a folder; moelab will not replace it with a file")
    entry = (marker or {}).get("files", {}).get(Path(rel).as_posix())
    if not isinstance(entry, dict) or entry.get("writer") != writer:
        raise OutputPolicyError(f"{name}: {target} exists and moelab {writer} did not write it; moelab never "
                                "overwrites what it did not write: move it or name another path")
    if entry.get("sha256") != _sha256(target):
        raise OutputPolicyError(f"{name}: {target} changed since moelab {writer} wrote it; moelab will not "
                                "overwrite those changes: move it or name another path")


def check_output_file(path: str | os.PathLike, *, writer: str, name: str) -> Path:
    """Check, before any work, that ``writer`` may write the file ``path``: absent, or written by ``writer``
    (recorded in its folder's marker) and unchanged since; not a link, not in a protected folder.

    Returns
    -------
    pathlib.Path
        The file, absolute.
    """
    target = _check_path(Path(path), name)
    parent = target.parent
    if parent.exists() and not parent.is_dir():
        raise OutputPolicyError(f"{name} {target}: {parent} is a file, not a folder")
    if target.exists():
        _check_own_file(parent, read_marker(parent) if parent.is_dir() else None, target.name, writer, name)
    return target


def record_outputs(folder: str | os.PathLike, writer: str, files: Iterable[str | os.PathLike] | None = None, *,
                   owner: bool = True) -> Path:
    """Record in ``folder``'s marker that ``writer`` wrote ``files`` (paths inside ``folder``; all files
    under it when ``None``). ``owner``: the folder itself is ``writer``'s (its marker names it); otherwise
    only the files are recorded (a single output file in a user's folder)."""
    folder = Path(folder)
    marker = read_marker(folder) or {"moelab_output": _VERSION, "writer": writer if owner else None, "files": {}}
    if owner:
        marker["writer"] = writer
    if files is None:
        paths = [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink() and p.name != MARKER]
    else:
        paths = [folder / p if not Path(p).is_absolute() else Path(p) for p in files]
    for p in paths:
        marker["files"][p.relative_to(folder).as_posix()] = {"writer": writer, "sha256": _sha256(p)}
    marker["files"] = {k: v for k, v in marker["files"].items() if (folder / k).is_file()}
    atomic_write_json(folder / MARKER, marker)
    return folder / MARKER


def claim_output_dir(folder: str | os.PathLike, writer: str) -> Path:
    """Create ``folder`` (checked by :func:`check_output_dir`) with ``writer``'s marker before the first file is
    written, so that a run interrupted halfway leaves a folder the next run recognises as its own."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if read_marker(folder) is None:
        record_outputs(folder, writer, [])
    return folder


def record_output_file(path: str | os.PathLike, writer: str) -> Path:
    """Record the single output file ``path`` in its folder's marker (the folder stays the user's)."""
    path = Path(path)
    return record_outputs(path.parent, writer, [path.name], owner=False)


def replace_dir(staged: str | os.PathLike, target: str | os.PathLike, writer: str) -> Path:
    """Move the finished folder ``staged`` to ``target``, recording every file in it as ``writer``'s, and
    remove the previous ``target``: only after :func:`check_output_dir` (``replace=True``) passes again, so
    nothing the command did not write is deleted even if it appeared during the build."""
    staged, target = Path(staged), Path(target)
    record_outputs(staged, writer)
    old = None
    if target.exists():
        check_output_dir(target, writer=writer, replace=True)
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        target.rename(old)
    staged.rename(target)
    if old is not None:
        shutil.rmtree(old)
    return target


__all__ = ["MARKER", "OutputPolicyError", "check_output_dir", "claim_output_dir", "check_output_file", "protected_paths",
           "read_marker", "record_output_file", "record_outputs", "replace_dir"]
