"""Exercise checkers: turn a student's answer into feedback they can act on.

A checker never raises on a bad answer (a string, ``None``, NaN, a list of the wrong shape, an int too large
for a float, an object whose ``__float__``, ``__array__`` or ``__repr__`` raises): it returns a
:class:`Feedback` that names the quantity, says what kind of answer was expected and what was got and,
when wrong, where to look, so a notebook cell shows a one-line verdict instead of a traceback. Every
registered exercise's checker runs behind :func:`guard` (any exception left in a checker becomes feedback
too) and under a time limit, and a student's *function* is called under its own, shorter limit
(:func:`call_with_time_limit`), so an answer that loops forever fails its check instead of hanging the
lab or nbgrader's autograder.

**No feedback states the expected value.** A right answer is confirmed without repeating it (the executed
book runs the solutions, and its check outputs must not give the answers away); a wrong one is told the
direction ("too high"), the tolerance and a hint, so copying a number out of a failed check is not a way to
pass it. :func:`require` displays the feedback and turns a failed one into an ``AssertionError`` for
nbgrader's locked check cells, which grade by "did the cell raise"; it returns ``None``, so a check cell's
value is nothing nbgrader could read as a partial-credit score.

Exercises are registered in :data:`EXERCISES` (key ``"<notebook>.<id>"``, e.g. ``"03.r_peak"``) by the
per-notebook modules of :mod:`moelab.course`; each entry carries a correct and a typical wrong answer
so the test suite can prove every checker accepts the one and rejects the other.

**How the time limit works.** In the main thread of a Unix process (a Jupyter kernel runs cells there, and
so does nbgrader's) it is ``SIGALRM`` from ``setitimer``: the handler raises a private ``BaseException``
inside the student's code (so an ``except Exception`` there does not swallow it), re-fires every 50 ms in
case a bare ``except:`` did (a call that caught an alarm and returned later still fails), and raises only while the student's call is on the stack (it walks the
interrupted frames), so it can never fire into the checker's own code; an enclosing limit (the whole check's)
is saved and restored around an inner one (one student call). Anywhere else (another thread, Windows) the
call runs in a daemon thread joined with a timeout: the check still fails in time, but Python cannot stop a
thread, so the student's loop keeps a core busy until the kernel restarts (the message says so). A C call
that never returns to the interpreter (one huge numpy operation) is interrupted only when it returns.
"""

from __future__ import annotations

import functools
import math
import numbers
import reprlib
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

LEVELS = ("easy", "medium", "hard")
#: the marks a feedback line starts with: plain text, readable without an emoji font (a headless browser,
#: a terminal, nbgrader's feedback HTML)
MARK_OK, MARK_WRONG = "Correct:", "Not yet:"
#: seconds one call of a student's function may take (a checker calls it on several cases)
CALL_LIMIT_S = 5.0
#: seconds a whole check may take (reading the answer, every call of a student's function, the comparison)
CHECK_LIMIT_S = 60.0
# the timer re-fires this often after its deadline, in case the student's code swallowed the first alarm
_REFIRE_S = 0.05


@dataclass(frozen=True)
class Feedback:
    """The verdict on one answer: never just True/False, always a message a student can act on.

    Parameters
    ----------
    ok : bool
        Whether the answer is accepted.
    message : str
        When right, what was checked (never the expected value); when wrong, the quantity, what kind of
        answer was expected, what was got and where to look.
    """

    ok: bool
    message: str

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return f"{MARK_OK if self.ok else MARK_WRONG} {self.message}"

    def _repr_markdown_(self) -> str:
        return f"**{MARK_OK if self.ok else MARK_WRONG}** {self.message}"


class TimeLimitExceeded(Exception):
    """A student's function (or a whole check) ran past its time limit and was stopped (or abandoned)."""

    def __init__(self, seconds: float, stopped: bool = True):
        self.seconds, self.stopped = float(seconds), bool(stopped)
        super().__init__(f"did not finish within {self.seconds:g} s"
                         + ("" if stopped else " (it still runs in the background: restart the kernel to stop it)"))


class _Alarm(BaseException):
    """Raised by the timer inside the student's code; a BaseException so ``except Exception`` lets it through."""


def _student_call(token: object, fn: Callable, args: tuple, kwargs: dict) -> Any:
    # the timer's handler raises only while a frame of this function, with this token, is on the stack
    return fn(*args, **kwargs)


def _inside_call(frame: Any, token: object) -> bool:
    while frame is not None:
        if frame.f_code is _student_call.__code__ and frame.f_locals.get("token") is token:
            return True
        frame = frame.f_back
    return False


def _signal_timer_usable() -> bool:
    return (hasattr(signal, "setitimer") and hasattr(signal, "SIGALRM")
            and threading.current_thread() is threading.main_thread())


def call_with_time_limit(fn: Callable, *args: Any, seconds: float, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, stopped after ``seconds`` with :class:`TimeLimitExceeded` (see the module's
    docstring for how: ``SIGALRM`` in the main thread, else a daemon thread). Whatever ``fn`` raises is
    raised again; an enclosing limit stays in force (whichever deadline comes first fires).

    Raises
    ------
    ValueError
        When ``seconds`` is not a positive finite number.
    TimeLimitExceeded
        When the call did not finish in time.
    """
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"seconds must be a positive finite number; got {seconds!r}")
    if not _signal_timer_usable():
        return _call_in_thread(fn, args, kwargs, float(seconds))
    token = object()
    fired = []

    def on_alarm(signum: int, frame: Any) -> None:
        if _inside_call(frame, token):
            fired.append(True)
            raise _Alarm(token)

    previous = signal.getsignal(signal.SIGALRM)
    outer_delay, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    start = time.monotonic()
    limit = float(seconds) if outer_delay <= 0 else min(float(seconds), outer_delay)
    signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, limit, _REFIRE_S)
        try:
            result = _student_call(token, fn, args, kwargs)
            if fired:  # it caught the alarm (a bare except) and went on: past its deadline all the same
                raise TimeLimitExceeded(seconds)
            return result
        except _Alarm as alarm:
            if not alarm.args or alarm.args[0] is not token:
                raise
            raise TimeLimitExceeded(seconds) from None
    finally:  # the student's frame is gone: no alarm of ours can be raised from here on
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_delay > 0:  # the enclosing limit goes on with what is left of it
            left = outer_delay - (time.monotonic() - start)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), outer_interval)


def _call_in_thread(fn: Callable, args: tuple, kwargs: dict, seconds: float) -> Any:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as error:  # handed back to the caller below
            box["error"] = error

    worker = threading.Thread(target=target, name="moelab-check", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeLimitExceeded(seconds, stopped=False)
    if "error" in box:
        raise box["error"]
    return box.get("value")


_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 40, 40, 40


def _safe_text(value: object, limit: int = 60) -> str:
    """``str(value)`` cut to ``limit`` characters, or a placeholder when ``__str__`` raises."""
    try:
        text = str(value)
    except Exception:
        return "<unprintable>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _describe(value: object) -> str:
    """A short description of what the student handed in, e.g. ``str 'abc'`` or ``list [1, 2, 3]``; never
    raises, never prints a huge value (a large int is described by its digits, not written out)."""
    kind = type(value).__name__
    if isinstance(value, int) and not isinstance(value, bool):
        bits = int.bit_length(value)
        if bits > 128:
            return f"{kind} of about {int(bits * math.log10(2)) + 1} digits (far too large for a float)"
    try:
        text = _SHORT.repr(value)
    except Exception:  # a __repr__ that raises is described by its type alone
        return f"{kind} <unprintable>"
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{kind} {text}"


def _with_hint(message: str, hint: str) -> str:
    return f"{message} Hint: {hint}" if hint else message


def _as_real(answer: object) -> float | None:
    """``answer`` as a finite float, or ``None`` when it is not one finite real number (bool is not a number;
    an int too large for a float, or an object whose conversion raises, is not one either)."""
    try:
        if isinstance(answer, (bool, np.bool_)) or answer is None or isinstance(answer, (str, bytes)):
            return None
        if isinstance(answer, numbers.Real):
            value = float(answer)
        else:
            array = np.asarray(answer)
            if array.size != 1 or array.dtype.kind not in "iuf":
                return None
            value = float(array.reshape(-1)[0])
    except Exception:  # any object that cannot become one float is simply "not a number"
        return None
    return value if math.isfinite(value) else None


def _close(got: float, expected: float, rtol: float, atol: float) -> bool:
    return abs(got - expected) <= atol + rtol * abs(expected)


def _tolerance_words(rtol: float, atol: float) -> str:
    # the check passes within atol + rtol * |expected|: "2%", "±0.05", or both as "2% plus 0.05"
    rel = f"{rtol * 100:.3g}%" if rtol > 0 else ""  # 2%, 2.5%, 0.5%: never rounded to another tolerance
    if atol > 0:
        return f"{rel} plus {atol:g}" if rel else f"±{atol:g}"
    return rel or "exactly"


def _within(rtol: float, atol: float) -> str:
    words = _tolerance_words(rtol, atol)
    return "exactly" if words == "exactly" else f"within {words}"


def check_number(name: str, answer: object, expected: float, *, rtol: float = 0.02, atol: float = 0.0,
                 hint: str = "", slips: Sequence[tuple[float, str]] = ()) -> Feedback:
    """Check one real number against ``expected`` within ``atol + rtol * |expected|``.

    Parameters
    ----------
    name : str
        The quantity's name as the notebook writes it (``"r*"``).
    answer : object
        What the student assigned; anything that is not one finite real number is reported, not raised.
    expected : float
        The correct value, computed by the library from the notebook's parameters (never shown).
    rtol, atol : float
        Relative and absolute tolerance (both >= 0).
    hint : str
        Where to look when the answer is wrong.
    slips : sequence of (float, str)
        Known wrong answers and what each one is (e.g. ``(r_peak_at_B, "r_peak at B: double B first")``): an
        answer within the tolerance of a slip, and not of ``expected``, is told what it computed.

    Returns
    -------
    Feedback
        Right: the quantity and the tolerance. Wrong: the slip it matches, else the student's value, too high
        or too low; then the hint.
    """
    if rtol < 0 or atol < 0:
        raise ValueError(f"rtol and atol must be >= 0, got rtol={rtol}, atol={atol}")
    got = _as_real(answer)
    if got is None:
        return Feedback(False, _with_hint(
            f"expected a number for `{name}` (a finite int or float), got {_describe(answer)}.", hint))
    if _close(got, float(expected), rtol, atol):
        return Feedback(True, f"`{name}` is right ({_within(rtol, atol)}).")
    for value, what in slips:
        if _close(got, float(value), rtol, atol):
            return Feedback(False, _with_hint(f"your `{name}` = {got:.4g} is not it: {what}.", hint))
    direction = "too high" if got > expected else "too low"
    return Feedback(False, _with_hint(
        f"your `{name}` = {got:.4g} is {direction}: expected the value of `{name}` {_within(rtol, atol)}.", hint))


def check_array(name: str, answer: object, expected: Any, *, rtol: float = 0.02, atol: float = 0.0,
                hint: str = "") -> Feedback:
    """Check an array element-wise: the shape first, then the first element that differs.

    Parameters
    ----------
    name : str
        The array's name as the notebook writes it.
    answer : object
        What the student assigned (list, tuple or ndarray of numbers).
    expected : array_like
        The correct values, computed by the library (never shown).
    rtol, atol : float
        Relative and absolute tolerance per element (both >= 0).
    hint : str
        Where to look when the answer is wrong.

    Returns
    -------
    Feedback
    """
    if rtol < 0 or atol < 0:
        raise ValueError(f"rtol and atol must be >= 0, got rtol={rtol}, atol={atol}")
    want = np.asarray(expected, dtype=float)
    kind = f"expected an array of numbers of shape {want.shape} for `{name}`"
    if answer is None or isinstance(answer, (str, bytes)):
        return Feedback(False, _with_hint(f"{kind}, got {_describe(answer)}.", hint))
    try:
        got = np.asarray(answer, dtype=float)
    except Exception:  # ragged, not numbers, too large for a float, or an object whose conversion raises
        return Feedback(False, _with_hint(
            f"{kind}, got {_describe(answer)} which is not all numbers (or is ragged, or too large).", hint))
    if got.shape != want.shape:
        return Feedback(False, _with_hint(f"`{name}` should have shape {want.shape}, got shape {got.shape}.", hint))
    if not np.all(np.isfinite(got)):
        index = tuple(int(i) for i in np.argwhere(~np.isfinite(got))[0])
        return Feedback(False, _with_hint(f"`{name}`{list(index)} is {got[index]}, not a finite number.", hint))
    wrong = np.abs(got - want) > atol + rtol * np.abs(want)
    if not wrong.any():
        return Feedback(True, f"all {want.size} values of `{name}` are right ({_within(rtol, atol)}).")
    index = tuple(int(i) for i in np.argwhere(wrong)[0])
    direction = "too high" if got[index] > want[index] else "too low"
    return Feedback(False, _with_hint(
        f"{int(wrong.sum())} of {want.size} values of `{name}` differ from the expected ones "
        f"({_within(rtol, atol)}); the first is `{name}`{list(index)} = {got[index]:.4g}, {direction}.", hint))


def check_choice(name: str, answer: object, expected: str, options: Sequence[str], *, hint: str = "") -> Feedback:
    """Check a multiple-choice answer (case and surrounding spaces ignored).

    Parameters
    ----------
    name : str
        The question's name.
    answer : object
        What the student assigned; should be one of ``options``.
    expected : str
        The correct option (must be in ``options``; never shown).
    options : Sequence[str]
        All allowed options.
    hint : str
        Where to look when the answer is wrong.

    Returns
    -------
    Feedback
    """
    normal = {str(option).strip().lower(): str(option) for option in options}
    if str(expected).strip().lower() not in normal:
        raise ValueError(f"expected must be one of options {list(options)}, got {expected!r}")
    listed = ", ".join(repr(str(option)) for option in options)
    if not isinstance(answer, str):
        return Feedback(False, _with_hint(f"expected one of {listed} for `{name}`, got {_describe(answer)}.", hint))
    key = str.lower(str.strip(answer))  # str's own methods: a str subclass cannot override them here
    if key not in normal:
        return Feedback(False, _with_hint(f"`{name}` must be one of {listed}, got {_describe(answer)}.", hint))
    if key == str(expected).strip().lower():
        return Feedback(True, f"`{name}` is right.")
    return Feedback(False, _with_hint(f"`{name}` = {normal[key]!r} is not the expected option.", hint))


def check_callable(name: str, fn: object, cases: Sequence[tuple[tuple, float]], *, rtol: float = 0.02,
                   hint: str = "", seconds: float | None = None) -> Feedback:
    """Check a student's implementation of a formula on a list of cases, each call under a time limit.

    Parameters
    ----------
    name : str
        The function's name as the notebook writes it.
    fn : object
        The student's function; it is called as ``fn(*args)`` for each case.
    cases : Sequence[tuple[tuple, float]]
        ``(args, expected)`` pairs, the expected values computed by the library. A failing case's expected
        value is shown (it is a test of the function, not the exercise's answer).
    rtol : float
        Relative tolerance per case (>= 0).
    hint : str
        Where to look when a case differs.
    seconds : float, optional
        The limit per call (default :data:`CALL_LIMIT_S`).

    Returns
    -------
    Feedback
        Names the first case that differs, raises or runs past the limit.
    """
    if rtol < 0:
        raise ValueError(f"rtol must be >= 0, got {rtol}")
    limit = CALL_LIMIT_S if seconds is None else seconds
    if not callable(fn):
        return Feedback(False, _with_hint(f"expected a function for `{name}`, got {_describe(fn)}.", hint))
    for args, expected in cases:
        call = f"{name}({', '.join(repr(a) for a in args)})"
        try:
            result = call_with_time_limit(fn, *args, seconds=limit)
        except TimeLimitExceeded as late:
            return Feedback(False, _with_hint(
                f"{call} {late}; it was stopped. Does a loop in it never end?", hint))
        except Exception as error:  # the student's code failing is feedback, not a crash of the checker
            return Feedback(False, _with_hint(f"{call} raised {type(error).__name__}: {_safe_text(error)}.", hint))
        except BaseException as error:  # SystemExit, or a GeneratorExit, from the student's code
            if isinstance(error, (KeyboardInterrupt, _Alarm)):  # the user's interrupt, an enclosing limit
                raise
            return Feedback(False, _with_hint(f"{call} raised {type(error).__name__}; a function should return "
                                              "a number.", hint))
        got = _as_real(result)
        if got is None:
            return Feedback(False, _with_hint(f"{call} should return a number, returned {_describe(result)}.", hint))
        if not _close(got, float(expected), rtol, 0.0):
            return Feedback(False, _with_hint(
                f"{call} returned {got:.4g}, expected {float(expected):.4g} ({_within(rtol, 0.0)}).", hint))
    return Feedback(True, f"`{name}` agrees with the library on all {len(cases)} cases.")


def require(feedback: Feedback) -> None:
    """Show the feedback, and raise ``AssertionError(feedback.message)`` when it is not ok (nbgrader grades a
    check cell by whether it raised).

    Returns ``None``, so a check cell evaluates to nothing: nbgrader reads a check cell's value as a
    partial-credit score, and a :class:`Feedback` there made it warn on every cell. The feedback reaches the
    student as a display (Jupyter) or a printed line (elsewhere) when right, and as the assertion's message
    when wrong.

    Parameters
    ----------
    feedback : Feedback
        A checker's verdict.
    """
    if not isinstance(feedback, Feedback):
        raise TypeError(f"require expects a Feedback from a checker, got {type(feedback).__name__}")
    if not feedback.ok:
        raise AssertionError(str(feedback))
    try:
        # lazy: IPython is there in a kernel, and the checkers must import without it
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # pragma: no cover - IPython ships with every Jupyter kernel
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(feedback)
    else:
        print(feedback)
    return None


def guard(check: Callable[..., Feedback], key: str = "") -> Callable[..., Feedback]:
    """``check`` made total: whatever it raises on an answer becomes a failed :class:`Feedback` naming the
    error, and the whole check runs under :data:`CHECK_LIMIT_S` (a student's functions under their own,
    shorter :data:`CALL_LIMIT_S`). A checker that returns something other than a Feedback is a bug of the
    lab's and still raises ``TypeError``."""

    @functools.wraps(check)
    def guarded(answer: object = None, /, **context: Any) -> Feedback:
        try:
            feedback = call_with_time_limit(check, answer, seconds=CHECK_LIMIT_S, **context)
        except TimeLimitExceeded as late:
            return Feedback(False, f"checking your answer ({_describe(answer)}) {late}; it was stopped. Does your "
                                   "answer, or a function it calls, loop forever?")
        except Exception as error:
            return Feedback(False, f"expected an answer the checker{f' of {key}' if key else ''} can read, got "
                                   f"{_describe(answer)}: reading it raised {type(error).__name__}: "
                                   f"{_safe_text(error)}. Hint: answer with plain numbers, lists, strings or "
                                   "functions, as the exercise asks.")
        if not isinstance(feedback, Feedback):
            raise TypeError(f"checker {key or check!r} returned {type(feedback).__name__}, not a Feedback")
        return feedback

    guarded.__wrapped_check__ = check  # type: ignore[attr-defined]
    return guarded


@dataclass(frozen=True)
class Exercise:
    """One registered exercise.

    Parameters
    ----------
    notebook : str
        The notebook's number, e.g. ``"03"``.
    id : str
        The exercise's id inside the notebook, e.g. ``"r_star"``.
    level : str
        ``"easy"``, ``"medium"`` or ``"hard"``.
    prompt : str
        The question as the notebook asks it.
    check : Callable[..., Feedback]
        ``check(answer, **context) -> Feedback``; ``context`` are the notebook's parameters. Registered
        through :func:`exercise`, it runs behind :func:`guard` (total, time-limited).
    solution : Callable[..., object]
        ``solution(**context)`` -> a correct answer.
    wrong : Callable[..., object]
        ``wrong(**context)`` -> a typical wrong answer (for the tests).
    context : dict
        Default context (the notebook's default parameters) the tests call with.
    """

    notebook: str
    id: str
    level: str
    prompt: str
    check: Callable[..., Feedback]
    solution: Callable[..., object]
    wrong: Callable[..., object]
    context: dict | None = None

    @property
    def key(self) -> str:
        """The registry key ``"<notebook>.<id>"``."""
        return f"{self.notebook}.{self.id}"


#: Every checked exercise of the lessons, by key ``"<notebook>.<id>"`` (filled as each lesson's module registers them).
EXERCISES: dict[str, Exercise] = {}
# one guarded wrapper per checker, so registering the same checker twice gives an equal Exercise
_GUARDED: dict[tuple[Callable, str], Callable[..., Feedback]] = {}


def exercise(notebook: str, id: str, level: str, prompt: str, check: Callable[..., Feedback],
             solution: Callable[..., object], wrong: Callable[..., object],
             context: dict | None = None) -> Exercise:
    """Register an exercise in :data:`EXERCISES` under ``"<notebook>.<id>"`` (its checker behind
    :func:`guard`) and return it.

    Raises
    ------
    ValueError
        When ``level`` is not one of ``"easy"``, ``"medium"``, ``"hard"`` or the key is already taken.
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    key = f"{notebook}.{id}"
    guarded = _GUARDED.setdefault((check, key), guard(check, key))
    entry = Exercise(notebook=notebook, id=id, level=level, prompt=prompt, check=guarded, solution=solution,
                     wrong=wrong, context=dict(context or {}))
    if entry.key in EXERCISES and EXERCISES[entry.key] != entry:
        raise ValueError(f"exercise {entry.key!r} is already registered")
    EXERCISES[entry.key] = entry
    return entry
