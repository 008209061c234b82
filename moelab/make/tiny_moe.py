"""``moelab train-tiny-moe``: ``moelab train-moe --preset tiny-moe`` under its historical name."""

from __future__ import annotations

from moelab.make.train import main as train_main


def main(argv: list[str] | None = None) -> int:
    """Train the project's tiny MoE (:func:`moelab.make.train.main` with ``preset="tiny-moe"``); returns
    the exit status."""
    return train_main(argv, preset="tiny-moe")
