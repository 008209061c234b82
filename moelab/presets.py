"""Run sizes of the notebooks, defined in one place: the ``PRESET`` parameter of every notebook.

Every notebook's ``parameters`` cell starts with ``PRESET = "classroom"`` and lists its *sized* parameters
(requests simulated, Monte-Carlo rounds, sweep points, ...) as ``None`` ("the preset's"); its next cell calls
:func:`resolve`, which fills each ``None`` from the preset and keeps every other value: **a parameter given
explicitly overrides the preset** (``moelab notebooks run 01 --preset classroom --params N_REQUESTS=5000``
runs 5,000 requests). The presets mean the same in every notebook:

``"ci"``
    The smallest run that still exercises every code path of the notebook (every section, table, figure
    and panel; the notebook's test asserts on all of them). What CI and the notebook tests run. Its numbers
    are noisy and are not meant to teach.
``"classroom"`` (the default)
    At most about 3 minutes per notebook on a 2-core laptop (``moelab bench notebooks`` measures it as
    ``notebook_classroom_seconds_<notebook>``) and still teaches: rate and load curves with at least 3
    points, regime maps with at least 2 x 2 cells, sliders with at least 2 stops.
``"full"``
    The paper-scale runs: the sizes the notebooks' prose documents as the full run (minutes to hours on a
    laptop; meant for a workstation or a long evening).

Parameters that are not sized (a model name, the operating point, a seed, ``INTERACTIVE``) are not part
of a preset and keep their own defaults. ``"all"`` is accepted where a size can mean "the whole data set"
(:data:`ALL`); it resolves to ``None``, the notebooks' spelling of "all".

Every size has a range with an upper bound (:data:`MAX_COUNT` for counts, :data:`MAX_LIST` points per sweep
axis) and every list entry is checked (router names against the registry, model shapes against
``MODEL_SHAPES``). The parameters that are not sized are described in :mod:`moelab.parameters`; together the
two tables are the notebooks' parameter model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from moelab import parameters as _model
from moelab._validate import check_choice, check_int, check_real

#: the presets, in increasing size
PRESETS: tuple[str, ...] = ("ci", "classroom", "full")
#: the preset a notebook runs when nothing else is said
DEFAULT_PRESET = "classroom"
#: the value that asks for the whole data set where a size allows it (resolved to ``None``)
ALL = "all"


def check_preset(value: Any, name: str = "PRESET") -> str:
    """``value`` when it is one of :data:`PRESETS`, else ``ValueError`` naming ``name`` and the allowed values.

    Parameters
    ----------
    value : Any
        The preset asked for.
    name : str
        The parameter's name in the message (``PRESET`` in a notebook, ``--preset`` on the command line).

    Returns
    -------
    str
        The preset.
    """
    if not isinstance(value, str) or value not in PRESETS:
        raise ValueError(f"{name} must be one of {', '.join(repr(p) for p in PRESETS)}; got {value!r}")
    return value


# ---- validators: each raises ValueError naming the parameter and its allowed range -------------------------

Check = Callable[[str, Any], Any]


# Every size has an upper bound too: a value above it would take hours to days or more memory than a laptop
# has, and the notebooks never need it (the full preset is far below each cap).
#: Upper bound of every count parameter (requests, rounds, pairs, trace entries).
MAX_COUNT = 1_000_000  # requests, rounds, pairs, trace entries
#: Upper bound of the points of one sweep axis.
MAX_LIST = 16  # points of one sweep axis


def _int(low: int, high: int = MAX_COUNT, *, all_ok: bool = False) -> Check:
    def check(name: str, value: Any) -> Any:
        if all_ok and value == ALL:
            return None
        if all_ok and isinstance(value, str):
            raise ValueError(f"{name} must be an integer from {low} to {high}, or {ALL!r}; got {value!r}")
        if isinstance(value, bool):
            raise ValueError(f"{name} must be an integer from {low} to {high}; got {value!r}")
        return check_int(name, value, low=low, high=high)
    return check


def _list(item: Callable[[str, Any], Any], *, min_len: int = 1, max_len: int = MAX_LIST) -> Check:
    def check(name: str, value: Any) -> Any:
        if not isinstance(value, list) or not min_len <= len(value) <= max_len:
            raise ValueError(f"{name} must be a list of {min_len} to {max_len} value(s); got {value!r}")
        return [item(f"{name} entry", v) for v in value]
    return check


def _ints(low: int, high: int, *, min_len: int = 1) -> Check:
    return _list(_int(low, high), min_len=min_len)


def _reals(low: float, high: float, *, low_open: bool = False, min_len: int = 1) -> Check:
    return _list(lambda n, v: check_real(n, v, low=low, high=high, low_open=low_open), min_len=min_len)


def _choices(allowed: tuple[str, ...] | Callable[[], tuple[str, ...]], *, min_len: int = 1) -> Check:
    return _list(_model.one_of(allowed), min_len=min_len)


def _one_of(allowed: tuple[str, ...]) -> Check:
    return lambda name, value: check_choice(name, value, allowed)


def _grid(keys: dict[str, Check]) -> Check:
    def check(name: str, value: Any) -> Any:
        if not isinstance(value, Mapping) or set(value) != set(keys):
            raise ValueError(f"{name} must be a dict with the keys {list(keys)}, each a non-empty list; got {value!r}")
        return {k: _list(keys[k])(f"{name}[{k!r}]", v) for k, v in value.items()}
    return check


def _routers() -> tuple[str, ...]:
    # lazy: the registry imports every router module; only a check of a router list needs it
    from moelab.balanceroute.experiments import PREDICTOR_NAMES, router_names

    return (*router_names(), *(f"brh_{p}" for p in PREDICTOR_NAMES), *(f"brh_tuned_{p}" for p in PREDICTOR_NAMES))


def _shapes() -> tuple[str, ...]:
    # lazy: the shapes registry loads only when a list of shapes is checked
    from moelab.costmodel import MODEL_SHAPES

    return tuple(MODEL_SHAPES)


@dataclass(frozen=True)
class Sized:
    """One sized parameter: its value at each preset and the check an explicit value must pass."""

    ci: Any
    classroom: Any
    full: Any
    check: Check

    def at(self, preset: str) -> Any:
        """The value at ``preset`` (one of :data:`PRESETS`)."""
        return {"ci": self.ci, "classroom": self.classroom, "full": self.full}[preset]


_RATES = _reals(0, 10_000, low_open=True)

#: per notebook, its sized parameters: ``{notebook: {PARAMETER: Sized(ci, classroom, full, check)}}``
SIZES: dict[str, dict[str, Sized]] = {
    # the map: nothing in it is sized (every preset runs the same cells)
    "00_overview": {},
    # full: the documented full-size run (16 decode workers, 6,000 requests, the paper's five rates, 30k pairs)
    "01_eldr": {
        "N_TRACE": Sized(384, 384, 2048, _int(64, 100_000)),
        "N_REQUESTS": Sized(400, 400, 6000, _int(50)),
        "RATES": Sized([20, 100], [20, 60, 100], [20, 40, 60, 80, 100], _RATES),
        "N_WORKERS": Sized(4, 4, 16, _int(2, 1024)),
        "N_PAIRS": Sized(1000, 3000, 30_000, _int(10)),
        "TAUS": Sized([0.0, 0.1, 2.0], [0.0, 0.1, 0.3, 2.0], [0.0, 0.1, 0.3, 2.0], _reals(0, 10)),
        "REAL_WORKERS": Sized(4, 4, 16, _int(2, 1024)),
        "REAL_RATES": Sized([20, 100], [20, 60, 100], [20, 40, 60, 80, 100], _RATES),
        "REGIME_SCALES": Sized([0.5, 1.5], [0.5, 1.5], [0.25, 0.5, 1.0, 1.5], _reals(0, 100, low_open=True)),
        "REGIME_KS": Sized([2, 4], [2, 4], [8, 16, 32], _ints(2, 1024)),
        "REGIME_TAUS": Sized([0.1, 0.3], [0.1, 0.3], [0.0, 0.1, 0.3], _reals(0, 10)),
        "REGIME_REQUESTS": Sized(150, 200, 6000, _int(50)),
        "N_CONVERSATIONS": Sized(24, 32, 32, _int(4, 10_000)),
        # seeds of every seed spread (headline, ablations, real trace); 3 at ci still gives a t-interval
        "SPREAD_SEEDS": Sized(3, 5, 5, _int(2, 100)),
    },
    # full: every Spec-Bench question (80 per category) at 128 tokens, as `moelab bench hd`'s full HF side
    "02_hierarchy_drafting": {
        "PER_CATEGORY": Sized(1, 1, ALL, _int(1, 80, all_ok=True)),  # Spec-Bench has 80 per category
        "MAX_NEW_TOKENS": Sized(8, 16, 128, _int(1, 4096)),
        "BUDGETS": Sized([4, 8], [4, 8, 16, 28], [4, 8, 16, 28], _ints(1, 64)),
        "DEMO_TOKENS": Sized(8, 24, 48, _int(1, 4096)),
        "CURVE_QS": Sized([1, 3, 9], [1, 2, 3, 5, 9, 17, 29], [1, 2, 3, 5, 9, 17, 29], _ints(1, 4096)),
    },
    # full: the paper-scale horizons and the whole gap map (3 x 3 x 2 settings x 3 length distributions); classroom's
    # map spans the shortest and longest mean prompt of the notebook's r* table (the paper's grid) and the paper's
    # check-value decode means, so both regimes (FFN peak, attention balance) appear
    "03_afd_ratio": {
        "N": Sized(2000, 10_000, 10_000, _int(1)),
        "R_VALUES": Sized([1, 2, 4, 8, 16], [1, 2, 4, 8, 16, 24, 32], [1, 2, 4, 8, 16, 24, 32], _ints(1, 1024)),
        "TRACE_R_VALUES": Sized([1, 4, 16], [1, 2, 4, 8, 16, 32, 64], [1, 2, 4, 8, 16, 24, 32, 48, 64], _ints(1, 1024)),
        "INDEP_REQUESTS": Sized(300, 2000, 10_000, _int(1)),
        "MAP_B": Sized([128], [128, 512], [128, 256, 512], _ints(1, 65_536)),
        "MAP_MU_P": Sized([100], [100, 2000], [100, 1000, 4000], _reals(0, 1_000_000, low_open=True)),
        "MAP_MU_D": Sized([100], [100, 500], [100, 500], _reals(0, 1_000_000, low_open=True)),
        "MAP_DISTRIBUTIONS": Sized(["geometric", "azure-code"], ["geometric", "azure-code"],
                                   ["geometric", "azure-conv", "azure-code"],
                                   _choices(("geometric", "azure-conv", "azure-code"))),
        "MAP_REQUESTS": Sized(200, 1000, 2000, _int(1)),
    },
    # full: 20k Monte-Carlo rounds per point over the whole RTT range
    "04_dsd_rtt": {
        "MC_ROUNDS": Sized(2000, 10_000, 20_000, _int(1)),
        "ROUNDS_PER_CLIENT": Sized(40, 200, 200, _int(1, 100_000)),
        "MEASURED_ROUNDS": Sized(2000, 10_000, 20_000, _int(1)),
        "RTT_MEANS": Sized([0.0, 50.0], [0.0, 10.0, 25.0, 50.0, 100.0, 200.0],
                           [0.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0], _reals(0, 10_000)),
        "CAP_ROUNDS_PER_CLIENT": Sized(20, 60, 60, _int(1, 100_000)),
    },
    # full: 3,000 requests per run, the 15-router line-up, the 18-run tuning grid, the 54-setting regime map
    "05_balanceroute": {
        "N_REQUESTS": Sized(400, 1500, 3000, _int(1, all_ok=True)),
        "G_VALUES": Sized([4], [4, 8, 16], [4, 8, 16], _ints(2, 256)),
        "SLOTS": Sized(8, 16, 72, _int(1, 4096)),
        "LOADS": Sized([0.8, 1.2], [0.6, 0.8, 1.0, 1.2, 1.4], [0.6, 0.8, 1.0, 1.2, 1.4], _reals(0, 100, low_open=True)),
        "SWEEP_ROUTERS": Sized(["jsq", "vllm_dp@0.32", "br0", "brh_oracle"],
                               ["jsq", "vllm_dp@0.32", "sglang_total_tokens", "br0", "brh_oracle"],
                               ["round_robin", "jsq", "least_kv", "vllm_dp@0.32", "vllm_dp@legacy",
                                "sglang_total_tokens", "br0", "brh_oracle"], _choices(_routers)),
        "TUNE_N": Sized(300, 600, 2000, _int(1)),
        "TUNE_GRID": Sized({"horizon": [4, 72], "delta": [0.86], "beta": [43.0]},
                           {"horizon": [4, 72], "delta": [0.86], "beta": [None, 43.0]},
                           {"horizon": [4, 16, 72], "delta": [0.7, 0.86, 0.95], "beta": [None, 43.0]},
                           _grid({"horizon": _int(1, 10_000), "delta": lambda n, v: check_real(n, v, low=0, high=1,
                                                                                               low_open=True),
                                  "beta": lambda n, v: None if v is None else check_real(n, v, low=0, high=1e6,
                                                                                         low_open=True)})),
        "SHAREGPT_N": Sized(600, 2000, 8000, _int(1, 100_000)),
        "TOKENIZER": Sized("tiny-moe", "tiny-moe", "smollm2", _one_of(("smollm2", "tiny-moe"))),
        "REGIME_SHAPES": Sized(["qwen3-30b-a3b", "llama-3.1-70b"], ["qwen3-30b-a3b", "llama-3.1-70b"],
                               ["qwen3-30b-a3b", "deepseek-v3", "llama-3.1-70b"], _choices(_shapes)),
        "REGIME_CONTEXT": Sized([1.0, 4.0], [1.0, 4.0], [1.0, 4.0, 16.0], _reals(0, 1000, low_open=True)),
        "REGIME_SLOTS": Sized([8], [16], [16, 72], _ints(1, 4096)),
        "REGIME_G": Sized([8], [4, 8], [4, 8, 16], _ints(2, 256)),
        "REGIME_REQUESTS_PER_SLOT": Sized(2.0, 5.0, 5.0, lambda n, v: check_real(n, v, low=0, high=1000, low_open=True)),
        "BACKLOG_N": Sized(1000, 4000, 20_000, _int(1)),
        "INTERACTIVE_N": Sized(120, 300, 800, _int(1, 100_000)),
        # windows of section 3's spread (the headline's and the next disjoint ones): ci keeps one other stretch
        "SPREAD_WINDOWS": Sized(2, 3, 3, _int(1, 20)),
    },
    # full: more prompts per domain and longer decodes through the live engine
    "06_from_your_deployment": {
        "N_PER_DOMAIN": Sized(3, 6, 16, _int(1, 1000)),
        "MAX_NEW_TOKENS": Sized(8, 16, 64, _int(1, 4096)),
    },
    # full: paper-sized instances (8 instances of 8 ranks, 30k signature pairs, thousands of requests)
    "07_cross_paper": {
        "K": Sized(2, 4, 8, _int(2, 1024)),
        "G": Sized(2, 4, 8, _int(2, 256)),
        "SLOTS": Sized(8, 16, 32, _int(1, 4096)),
        "N_TRACE": Sized(160, 384, 2048, _int(16, 100_000)),
        "N_PAIRS": Sized(800, 2000, 30_000, _int(10)),
        "N_REQUESTS": Sized(150, 600, 4000, _int(10)),
        "OUTPUT_LEN": Sized(64, 512, 512, _int(1, 100_000)),
        "SHARES": Sized([0.15, 0.5], [0.15, 0.3, 0.5, 0.7], [0.15, 0.3, 0.5, 0.7], _reals(0, 1, low_open=True)),
    },
}


def sized_parameters(notebook: str) -> dict[str, Sized]:
    """The sized parameters of ``notebook`` (a name from ``notebooks/``), else ``ValueError`` naming the known ones."""
    if notebook not in SIZES:
        raise ValueError(f"notebook must be one of {sorted(SIZES)} (the notebooks with presets); got {notebook!r}")
    return SIZES[notebook]


def preset_values(notebook: str, preset: str) -> dict[str, Any]:
    """The values of ``notebook``'s sized parameters at ``preset`` (copies: safe to change).

    Parameters
    ----------
    notebook : str
        Notebook name, e.g. ``"03_afd_ratio"``.
    preset : str
        One of :data:`PRESETS`.

    Returns
    -------
    dict
        ``{PARAMETER: value}`` for every sized parameter (``"all"`` resolved to ``None``).
    """
    check_preset(preset)
    return {k: s.check(k, _copy(s.at(preset))) for k, s in sized_parameters(notebook).items()}


def resolve(notebook: str, preset: Any, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The sized parameters ``notebook`` runs with: ``preset``'s values, overridden by every entry of
    ``params`` that is not ``None``; every other parameter of the notebook found in ``params`` is checked
    against its description in :data:`moelab.parameters.FIXED`, and the relations between them
    (:data:`moelab.parameters.RELATIONS`) on the result.

    A notebook calls it right after its ``parameters`` cell as
    ``globals().update(resolve("03_afd_ratio", PRESET, globals()))``; the command line calls it before
    executing anything, so a bad preset or value stops there.

    Parameters
    ----------
    notebook : str
        Notebook name, e.g. ``"03_afd_ratio"``.
    preset : str
        One of :data:`PRESETS` (the notebook's ``PRESET``).
    params : mapping, optional
        Values given explicitly (a notebook's namespace, papermill's or the command line's parameters);
        entries that are not parameters of ``notebook`` are ignored, ``None`` means "the preset's" for a
        sized parameter.

    Returns
    -------
    dict
        ``{PARAMETER: value}`` for every sized parameter of ``notebook``.

    Raises
    ------
    ValueError
        ``PRESET`` is not one of :data:`PRESETS`, or a value is not data, out of its parameter's range, or
        breaks a relation (the message names the parameter and the allowed range).
    """
    check_preset(preset)
    params = params or {}
    out = {}
    for name, sized in sized_parameters(notebook).items():
        given = params.get(name)
        value = _copy(sized.at(preset) if given is None else _model.check_json_value(name, given))
        out[name] = sized.check(name, value)
    fixed = _model.check_fixed(notebook, params)
    _model.check_relations(notebook, {**fixed, **out})
    return out


def _copy(value: Any) -> Any:
    """A deep copy of a preset value (lists and dicts of literals), so a notebook cannot change the table."""
    if isinstance(value, list):
        return [_copy(v) for v in value]
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value


__all__ = ["ALL", "DEFAULT_PRESET", "MAX_COUNT", "MAX_LIST", "PRESETS", "SIZES", "Sized", "check_preset", "preset_values", "resolve",
           "sized_parameters"]
