"""The notebooks' parameters as typed data: every parameter's type, range, allowed values and unit, in one place.

Each notebook's ``parameters`` cell lists its parameters. The *sized* ones (how many requests, rounds, sweep
points) are described with their preset values in :data:`moelab.presets.SIZES`; every other one is described
here, in :data:`FIXED`, and the relations between parameters (``BUDGET`` is one of ``BUDGETS``, ...) in
:data:`RELATIONS`. :func:`moelab.presets.resolve` checks both, so the same checks run in every place a value
enters a notebook: ``moelab notebooks run``, ``moelab app``, ``moelab course release``, ``moelab book build``
(all before any kernel starts, for every named notebook before the first runs) and the notebook's own
second cell (a run started by papermill or JupyterLab directly).

A parameter's value is **data, never code**: only what JSON can hold (numbers, strings, booleans, ``None``,
lists and string-keyed dicts of those) reaches a notebook, and :func:`assignments` writes the cell that sets
them, refusing any value whose written form would not read back as the same value.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moelab._validate import check_choice, check_int, check_real, parse_cli_literal

#: the deepest list/dict nesting a parameter value may have
MAX_VALUE_DEPTH = 4
#: the most entries a list or dict parameter may have
MAX_LIST_LEN = 64
#: the longest string parameter (a path, a model name)
MAX_STR_LEN = 1024
#: the largest seed (numpy's SeedSequence accepts more; no notebook needs more)
MAX_SEED = 2**63 - 1

Check = Callable[[str, Any], Any]


def check_json_value(name: str, value: Any, *, depth: int = 0) -> Any:
    """``value`` when it is JSON data (``None``, a bool, an int, a finite float, a string, a list, or a dict
    with string keys, nested at most :data:`MAX_VALUE_DEPTH` deep), else ``ValueError`` naming ``name``.
    Bytes, sets, tuples, complex numbers and any other object are refused: they are not data a notebook
    parameter may hold."""
    if depth > MAX_VALUE_DEPTH:
        raise ValueError(f"{name} is nested more than {MAX_VALUE_DEPTH} levels deep")
    if value is None or isinstance(value, (bool, str)):
        if isinstance(value, str) and len(value) > MAX_STR_LEN:
            raise ValueError(f"{name} is a string of {len(value)} characters, over the cap of {MAX_STR_LEN}")
        if isinstance(value, str) and "\x00" in value:
            raise ValueError(f"{name} must not contain a NUL character")
        return value
    if isinstance(value, int):
        if abs(value) > 2**63:
            raise ValueError(f"{name} must be an integer within +-2**63; got one of {value.bit_length()} bits")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number; got {value!r}")
        return value
    if isinstance(value, list):
        if len(value) > MAX_LIST_LEN:
            raise ValueError(f"{name} has {len(value)} entries, over the cap of {MAX_LIST_LEN}")
        return [check_json_value(f"{name} entry", v, depth=depth + 1) for v in value]
    if isinstance(value, dict):
        if len(value) > MAX_LIST_LEN:
            raise ValueError(f"{name} has {len(value)} keys, over the cap of {MAX_LIST_LEN}")
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise ValueError(f"{name} must have string keys; got {bad[0]!r}")
        return {k: check_json_value(f"{name}[{k!r}]", v, depth=depth + 1) for k, v in value.items()}
    hint = " (write a list: [1, 2])" if isinstance(value, (tuple, set, frozenset)) else ""
    raise ValueError(f"{name} must be data: a number, a string, True/False, None, a list or a dict; got a "
                     f"{type(value).__name__}{hint}")


def parse_value(name: str, text: str) -> Any:
    """A command-line value (``20``, ``0.1``, ``[1, 2]``, ``"x"``, ``None``) as data: a Python literal when it
    is one, else the text itself as a string; a literal that is not JSON data (bytes, a set, a tuple, a
    complex number) is a ``ValueError`` naming ``name``."""
    return check_json_value(name, parse_cli_literal(name, text))


def assignments(params: Mapping[str, Any], *, header: str = "") -> str:
    """The source of a cell that sets ``params`` (``NAME = value`` lines), each value written as a Python
    literal and read back to prove it is the same data: a value that would not round-trip is refused."""
    lines = [header] if header else []
    for key, value in params.items():
        if not isinstance(key, str) or not key.isidentifier() or key.startswith("_"):
            raise ValueError(f"parameter name must be a public identifier; got {key!r}")
        value = check_json_value(key, value)
        text = repr(value)
        try:
            back = ast.literal_eval(text)
        except (ValueError, SyntaxError) as exc:
            raise ValueError(f"{key} cannot be written as a literal ({exc})") from None
        if back != value or type(back) is not type(value):
            raise ValueError(f"{key} does not read back as the same value; refused")
        lines.append(f"{key} = {text}")
    return "\n".join(lines) + "\n"


# ---- checks: each raises ValueError naming the parameter and its allowed range ----------------------------


def real(low: float | None = None, high: float | None = None, *, low_open: bool = False,
         high_open: bool = False) -> Check:
    """A finite number in the range."""
    return lambda n, v: check_real(n, v, low=low, high=high, low_open=low_open, high_open=high_open)


def integer(low: int | None = None, high: int | None = None) -> Check:
    """An integer in the range (``True``/``False`` are not integers here)."""
    def check(name: str, value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError(f"{name} must be an integer; got {value!r}")
        return check_int(name, value, low=low, high=high)
    return check


def flag(name: str, value: Any) -> bool:
    """``True`` or ``False``."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False; got {value!r}")
    return value


def one_of(allowed: tuple[Any, ...] | Callable[[], tuple[Any, ...]]) -> Check:
    """One of ``allowed`` (or of what the callable returns: a list read from the data, lazily)."""
    def check(name: str, value: Any) -> Any:
        options = allowed() if callable(allowed) else allowed
        if isinstance(value, bool) and not any(isinstance(o, bool) for o in options):
            raise ValueError(f"{name} must be one of {list(options)}; got {value!r}")
        return check_choice(name, value, options)
    return check


def list_of(item: Check, *, min_len: int = 1, max_len: int = MAX_LIST_LEN) -> Check:
    """A list of ``min_len`` to ``max_len`` entries, each passing ``item``."""
    def check(name: str, value: Any) -> list:
        if not isinstance(value, list) or not min_len <= len(value) <= max_len:
            raise ValueError(f"{name} must be a list of {min_len} to {max_len} value(s); got {value!r}")
        return [item(f"{name} entry", v) for v in value]
    return check


def text(*, max_len: int = MAX_STR_LEN) -> Check:
    """A string of at most ``max_len`` characters, without control characters."""
    def check(name: str, value: Any) -> str:
        if not isinstance(value, str) or len(value) > max_len or any(ord(c) < 32 for c in value):
            raise ValueError(f"{name} must be a string of at most {max_len} printable characters; got {value!r}")
        return value
    return check


def file_or_empty(suffix: str, reader: Callable[[Path], Any] | None = None, *, what: str) -> Check:
    """``""`` (the notebook's default data) or the path of an existing ``suffix`` file that ``reader`` accepts
    (the checked reader of that format: size and content checked before the notebook starts)."""
    def check(name: str, value: Any) -> str:
        text()(name, value)
        if value == "":
            return value
        path = Path(value).expanduser()
        if path.suffix != suffix or not path.is_file():
            raise ValueError(f"{name} must be empty or the path of an existing {suffix} file ({what}); got {value!r}")
        if reader is not None:
            try:
                reader(path)
            except (OSError, ValueError) as exc:
                raise ValueError(f"{name} {value!r} is not a usable {what}: {exc}") from None
        return value
    return check


def seed(name: str, value: Any) -> int:
    """A random seed: an integer from 0 to :data:`MAX_SEED`."""
    return integer(0, MAX_SEED)(name, value)


@dataclass(frozen=True)
class Parameter:
    """One parameter that no preset sizes: what it means (with its unit) and the check a value must pass."""

    doc: str
    check: Check


# ---- allowed values read from the data (lazily: only when a value is checked) ------------------------------


# lazy (each import below): the data behind an allowed-values list loads only when a value is checked against
# it, so importing the parameter model (every notebook and the CLI do) stays cheap


def _moe_shapes() -> tuple[str, ...]:
    # lazy: see above
    from moelab.costmodel import MODEL_SHAPES

    return tuple(k for k, v in MODEL_SHAPES.items() if v.num_experts > 0)


def _shapes() -> tuple[str, ...]:
    # lazy: see above
    from moelab.costmodel import MODEL_SHAPES

    return tuple(MODEL_SHAPES)


def _h200_column(column: str) -> Callable[[], tuple[Any, ...]]:
    def values() -> tuple[Any, ...]:
        # lazy: see above
        from moelab.datasets import load_calibration

        return tuple(sorted(v.item() if hasattr(v, "item") else v
                            for v in load_calibration("h200", "moe_step")[column].unique()))
    return values


def _spec_bench_categories() -> tuple[str, ...]:
    # lazy: see above
    from moelab.datasets import load_spec_bench

    return tuple(sorted(load_spec_bench()["category"].unique()))


def _read_trace(path: Path) -> Any:
    # lazy: see above
    from moelab.traces.files import load_trace

    return load_trace(path)


def _read_recording(path: Path) -> Any:
    # lazy: see above
    from moelab.dsd.acceptance import load_traces

    return load_traces(path)


def _lm_name(name: str, value: Any) -> str:
    """A registered LM name, an existing folder or ``.gguf`` file, or a hub id ``owner/name``."""
    text(max_len=256)(name, value)
    from moelab.models.lm import KNOWN_LMS  # lazy: the registry module imports nothing heavy at import time

    path = Path(value).expanduser()
    if value in KNOWN_LMS or path.is_dir() or (path.suffix == ".gguf" and path.is_file()):
        return value
    parts = value.split("/")
    if len(parts) == 2 and all(p and all(c.isalnum() or c in "-_." for c in p) for p in parts):
        return value
    raise ValueError(f"{name} must be one of {sorted(KNOWN_LMS)}, an existing model folder or .gguf file, or a hub "
                     f"id owner/name; got {value!r}")


def _moe_model(name: str, value: Any) -> str:
    """``tiny-moe``, an existing model folder, or a hub id ``owner/name`` (a vLLM-supported MoE)."""
    text(max_len=256)(name, value)
    path = Path(value).expanduser()
    parts = value.split("/")
    if value == "tiny-moe" or path.is_dir() or (
            len(parts) == 2 and all(p and all(c.isalnum() or c in "-_." for c in p) for p in parts)):
        return value
    raise ValueError(f"{name} must be 'tiny-moe', an existing model folder or a hub id owner/name; got {value!r}")


_TAU = real(0, 10)
_INTERACTIVE = Parameter("build the live panels (False: static figures only)", flag)
_SEED = Parameter("random seed", seed)

#: per notebook, the parameters no preset sizes: ``{notebook: {PARAMETER: Parameter(doc, check)}}``
FIXED: dict[str, dict[str, Parameter]] = {
    "00_overview": {
        "B": Parameter("decode batch of the MoE figure (tokens; one of the measured batch sizes)",
                       one_of(_h200_column("B"))),
        "METHOD": Parameter("MoE kernel rows of the H200 table", one_of(_h200_column("method"))),
        "MODEL": Parameter("the MoE layer of the distinct-experts question", one_of(_moe_shapes)),
        "PREDICT_BATCH": Parameter("tokens in the batch of the distinct-experts question", integer(1, 65_536)),
        "INTERACTIVE": _INTERACTIVE,
    },
    "01_eldr": {
        "MODEL": Parameter("geometry of the synthetic workload and cost model", one_of(_moe_shapes)),
        "OUTPUT_LEN": Parameter("output tokens per request", integer(1, 100_000)),
        "TAU": Parameter("ELDR's band width (a fraction of the mean load; 2: every worker is in the band)", _TAU),
        "ABLATION_RATE": Parameter("arrival rate of the ablations (req/s at 16 decode workers)",
                                   real(0, 10_000, low_open=True)),
        "PREDICT_BATCH": Parameter("requests in one decode step of the predict-then-reveal question",
                                   integer(1, 65_536)),
        "CALIBRATE": Parameter("re-run the synthetic workload's calibration grid (slow)", flag),
        "USER_TRACE": Parameter("path of a real ExpertTrace (.npz); empty: the bundled one",
                                file_or_empty(".npz", _read_trace, what="expert trace")),
        "PREFIX_CAPACITIES": Parameter("signature/KV cache sizes (blocks of PREFIX_BLOCK tokens)",
                                       list_of(integer(1, 10_000_000), max_len=8)),
        "PREFIX_BLOCK": Parameter("KV block size (tokens)", integer(1, 4096)),
        "INTERACTIVE": _INTERACTIVE,
        "SEED": _SEED,
    },
    "02_hierarchy_drafting": {
        "MODEL": Parameter("target LM: a registered name, a local folder, a .gguf, or a hub id", _lm_name),
        "BUDGET": Parameter("draft tokens verified per forward in the tables (one of BUDGETS)", integer(1, 64)),
        "DEMO_CATEGORY": Parameter("Spec-Bench category of the token-by-token demo", one_of(_spec_bench_categories)),
        "THREADS": Parameter("torch CPU threads", integer(1, 256)),
        "INTERACTIVE": _INTERACTIVE,
    },
    "03_afd_ratio": {
        "B": Parameter("request slots per attention instance and microbatch", integer(1, 65_536)),
        "MU_P": Parameter("mean prompt length (tokens)", real(0, 1_000_000, low_open=True)),
        "MU_D": Parameter("mean decode length (tokens, geometric)", real(0, 1_000_000, low_open=True)),
        "SEED": _SEED,
        "TRACE": Parameter("Azure 2023 trace of the trace-driven section ('' skips it)", one_of(("conv", "code", ""))),
        "INDEP_LENGTHS": Parameter("lengths of the independent simulation", one_of(("azure-conv", "azure-code"))),
        "INTERACTIVE": _INTERACTIVE,
    },
    "04_dsd_rtt": {
        "RTT": Parameter("edge <-> cloud round trip (ms)", real(0, 10_000)),
        "ALPHA": Parameter("per-token acceptance probability", real(0, 1, high_open=True)),
        "GAMMA": Parameter("draft length (tokens)", integer(1, 64)),
        "T_A": Parameter("ms per draft token on the edge", real(0, 100_000, low_open=True)),
        "T_AR": Parameter("ms per target step (also t_v)", real(0, 100_000, low_open=True)),
        "T_D": Parameter("ms per draft token on the server", real(0, 100_000, low_open=True)),
        "RTT_JITTER": Parameter("relative RTT spread per round (uniform +-)", real(0, 1, high_open=True)),
        "TOY_ALPHA": Parameter("the worked example's per-token acceptance", real(0, 1, high_open=True)),
        "TOY_GAMMA": Parameter("the worked example's draft length (tokens)", integer(1, 64)),
        "TOY_RTT": Parameter("the worked example's round trip (ms)", real(0, 10_000)),
        "SEED": _SEED,
        "INTERACTIVE": _INTERACTIVE,
        "RECORDING": Parameter("path of an acceptance recording (.json); empty: the shipped one",
                               file_or_empty(".json", _read_recording, what="DSD acceptance recording")),
        "GAMMA_MEASURED": Parameter("draft length of the early-exit draft (tokens)", integer(1, 64)),
    },
    "05_balanceroute": {
        "TRACE": Parameter("Azure 2023 trace (lengths and arrival times)", one_of(("azure-conv", "azure-code"))),
        "TRAIN_FRAC": Parameter("share of the trace (in time) that trains", real(0, 1, low_open=True, high_open=True)),
        "G": Parameter("DP degree of the main comparison (ranks)", integer(2, 256)),
        "SHAPE": Parameter("model shape (moelab.costmodel.MODEL_SHAPES)", one_of(_shapes)),
        "LOAD": Parameter("offered load (multiple of the cluster capacity)", real(0, 100, low_open=True)),
        "SEED": _SEED,
        "INTERACTIVE": _INTERACTIVE,
        "TOY_LOADS": Parameter("KV tokens each toy rank attends over", list_of(integer(0, 10_000_000), max_len=16)),
        "TOY_PROMPTS": Parameter("prompt tokens of the toy's waiting requests",
                                 list_of(integer(1, 1_000_000), max_len=16)),
        "TOY_NEW_PROMPT": Parameter("one more request's prompt tokens", integer(1, 1_000_000)),
        "TOY_RANK": Parameter("the toy rank BR-0 fills in an exercise (an index into TOY_LOADS)", integer(0, 15)),
    },
    "06_from_your_deployment": {
        "MODEL": Parameter("the MoE served: 'tiny-moe', a folder or a hub id", _moe_model),
        "MAX_NUM_SEQS": Parameter("requests vLLM batches together", integer(1, 1024)),
        "N_WORKERS": Parameter("decode servers in the routing what-if", integer(2, 64)),
        "TAU": Parameter("ELDR locality band", _TAU),
        "HF_CHECK": Parameter("requests re-captured with the HF backend (0: skip)", integer(0, 1000)),
        "BACKEND": Parameter("capture backend", one_of(("auto", "vllm", "hf"))),
        "TRACE": Parameter("an expert trace (.npz) a deployment recorded; empty: capture one here",
                           file_or_empty(".npz", _read_trace, what="expert trace")),
        "INTERACTIVE": _INTERACTIVE,
        "SEED": _SEED,
        "ARRIVAL_ORDERS": Parameter("seeded arrival orders the routing what-if is repeated over", integer(1, 64)),
    },
    "07_cross_paper": {
        "LOAD": Parameter("offered load (multiple of the slot capacity)", real(0, 100, low_open=True)),
        "TAU": Parameter("ELDR band width", _TAU),
        "ATTENTION_SHARE": Parameter("attention share of a one-rank step at the reference batch",
                                     real(0, 1, low_open=True, high_open=True)),
        "INTERACTIVE": _INTERACTIVE,
        "SEED": _SEED,
    },
}


# each relation applies only when every parameter it relates is among the values (a partial check, as from
# the command line before the notebook's defaults are merged, checks what it has)
def _budget_in_budgets(values: Mapping[str, Any]) -> None:
    if "BUDGET" in values and "BUDGETS" in values and values["BUDGET"] not in values["BUDGETS"]:
        raise ValueError(f"BUDGET must be one of BUDGETS {values.get('BUDGETS')}; got {values.get('BUDGET')!r}")


def _toy_rank(values: Mapping[str, Any]) -> None:
    loads = values.get("TOY_LOADS")
    if "TOY_RANK" in values and loads is not None and not 0 <= values["TOY_RANK"] < len(loads):
        raise ValueError(f"TOY_RANK must be an index into TOY_LOADS, 0 to {len(loads) - 1}; got {values['TOY_RANK']!r}")


#: per notebook, checks that relate two or more parameters (each gets every resolved value)
RELATIONS: dict[str, tuple[Callable[[Mapping[str, Any]], None], ...]] = {
    "02_hierarchy_drafting": (_budget_in_budgets,),
    "05_balanceroute": (_toy_rank,),
}


def fixed_parameters(notebook: str) -> dict[str, Parameter]:
    """The parameters of ``notebook`` that no preset sizes (``ValueError`` for an unknown notebook)."""
    if notebook not in FIXED:
        raise ValueError(f"notebook must be one of {sorted(FIXED)}; got {notebook!r}")
    return FIXED[notebook]


def check_fixed(notebook: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """Check every entry of ``values`` that is one of ``notebook``'s fixed parameters; return those entries."""
    model = fixed_parameters(notebook)
    return {k: model[k].check(k, check_json_value(k, values[k])) for k in model if k in values}


def check_relations(notebook: str, values: Mapping[str, Any]) -> None:
    """Run ``notebook``'s :data:`RELATIONS` on the resolved ``values``."""
    for relation in RELATIONS.get(notebook, ()):
        relation(values)


def describe(notebook: str) -> list[tuple[str, str]]:
    """``(name, meaning)`` of every fixed parameter of ``notebook`` (for help texts and the reference)."""
    return [(k, p.doc) for k, p in fixed_parameters(notebook).items()]


__all__ = ["FIXED", "MAX_LIST_LEN", "MAX_STR_LEN", "MAX_VALUE_DEPTH", "RELATIONS", "Parameter", "assignments",
           "check_fixed", "check_json_value", "check_relations", "describe", "file_or_empty", "fixed_parameters",
           "flag", "integer", "list_of", "one_of", "parse_value", "real", "seed", "text"]
