"""Packaging hook (the metadata lives in pyproject.toml): the wheel carries the lab's tree.

``data/`` (bundled measurements, models, traces and public data), ``notebooks/`` (with NOTATION.md),
COURSE.md, README.md and CHANGELOG.md sit at the repository root, outside the ``moelab`` package, so
setuptools' package data cannot name them. ``build_py`` copies them into the built package as
``moelab/_tree/``, where :func:`moelab.datasets.repo_root` finds them when moelab is not run from a
checkout. An editable install (``pip install -e .``) reads the checkout itself and copies nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
TREE = ("data", "notebooks", "COURSE.md", "README.md", "CHANGELOG.md")
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", ".moelab-output.json")


class BuildPyWithTree(build_py):
    """``build_py`` that also copies the lab's tree into ``moelab/_tree`` of the build."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dest = Path(self.build_lib) / "moelab" / "_tree"
        for name in TREE:
            src = ROOT / name
            if src.is_dir():
                shutil.copytree(src, dest / name, ignore=SKIP, dirs_exist_ok=True)
            elif src.is_file():
                dest.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / name)


setup(cmdclass={"build_py": BuildPyWithTree})
