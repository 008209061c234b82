"""Checked exercises for the lab's notebooks.

:mod:`moelab.course.check` holds the checkers and the registry :data:`EXERCISES`; one module per notebook
registers that notebook's exercises when this package is imported.
"""

# each notebook's module registers its exercises in EXERCISES on import
from moelab.course import afd, balanceroute, cross, deployment, dsd, eldr, hd, overview  # noqa: F401  (registration)
from moelab.course.check import (
    EXERCISES,
    Exercise,
    Feedback,
    check_array,
    check_callable,
    check_choice,
    check_number,
    exercise,
    require,
)

__all__ = ["EXERCISES", "Exercise", "Feedback", "check_array", "check_callable", "check_choice",
           "check_number", "exercise", "require"]
