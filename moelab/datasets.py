"""Bundled data and public data sets, through one loader.

Bundled data (calibration tables, the tiny MoE, its traces) lives in the repository's ``data/``.
The small, permissively licensed public sets the notebooks need (Spec-Bench questions, the Azure 2023
traces, the OLMoE/Mixtral routing counts, published tables) are bundled too, in ``data/public/<name>/``
with their LICENSE and PROVENANCE.md, so everything runs offline. A public file is looked up in this
order: the local copy that ``$MOELAB_PUBLIC_DATA`` points at (laid out like ``data/public/``, e.g. a
larger mirror), the bundled copy, the download cache (``$MOELAB_CACHE`` or ``~/.cache/moelab``), and
finally a download from its public URL (for what is not bundled, e.g. the Azure 2024 week-long traces).
"""

from __future__ import annotations

import json
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from moelab._io import atomic_write_bytes

PUBLIC_DATA_ENV = "MOELAB_PUBLIC_DATA"
CACHE_ENV = "MOELAB_CACHE"


@dataclass(frozen=True)
class PublicFile:
    """A public file: where it sits inside a local copy, and where users download it from."""

    relpath: str
    url: str
    licence: str


PUBLIC_FILES: dict[str, PublicFile] = {
    "spec-bench": PublicFile(
        "spec-bench/question.jsonl",
        "https://raw.githubusercontent.com/hemingkx/Spec-Bench/fd2c1cd7d2201ef71db4c5f4e455008f017967bf/data/spec_bench/question.jsonl",
        "Apache-2.0",
    ),
    "azure-2023-code": PublicFile(
        "azure-llm-2023/AzureLLMInferenceTrace_code.csv",
        "https://raw.githubusercontent.com/Azure/AzurePublicDataset/b469a113cedca53ddc3bdea71a143dc4b7d8700c/data/AzureLLMInferenceTrace_code.csv",
        "CC-BY-4.0",
    ),
    "azure-2023-conv": PublicFile(
        "azure-llm-2023/AzureLLMInferenceTrace_conv.csv",
        "https://raw.githubusercontent.com/Azure/AzurePublicDataset/b469a113cedca53ddc3bdea71a143dc4b7d8700c/data/AzureLLMInferenceTrace_conv.csv",
        "CC-BY-4.0",
    ),
    "azure-2024-code": PublicFile(
        "azure-llm-2024/AzureLLMInferenceTrace_code_1week.csv",
        "https://azurepublicdatasettraces.blob.core.windows.net/azurellminfererencetrace/AzureLLMInferenceTrace_code_1week.csv",
        "CC-BY-4.0",
    ),
    "azure-2024-conv": PublicFile(
        "azure-llm-2024/AzureLLMInferenceTrace_conv_1week.csv",
        "https://azurepublicdatasettraces.blob.core.windows.net/azurellminfererencetrace/AzureLLMInferenceTrace_conv_1week.csv",
        "CC-BY-4.0",
    ),
    "olmoe-routing-counts": PublicFile(
        "olmoe-routing-counts/olmoe_routing_counts.json",
        "https://github.com/allenai/OLMoE/tree/357454f4f647385839c0ff6b99a688dc7cd9c13f/scripts/routing_output",
        "Apache-2.0",
    ),
    "mixtral-routing-counts": PublicFile(
        "olmoe-routing-counts/mistral_routing_counts.json",
        "https://github.com/allenai/OLMoE/tree/357454f4f647385839c0ff6b99a688dc7cd9c13f/scripts/routing_output",
        "Apache-2.0",
    ),
    "specbench-leaderboard": PublicFile(
        "published-tables/specbench_leaderboard_2025-04-22.csv",
        "https://github.com/hemingkx/Spec-Bench/blob/fd2c1cd7d2201ef71db4c5f4e455008f017967bf/Leaderboard.md",
        "Apache-2.0",
    ),
    "eldr-results": PublicFile(
        "eldr-results/main_task_p50_tpot_ms.csv",
        "https://github.com/casys-kaist/ELDR/tree/390c238c/results/camera-ready-20261010-completed",
        "see the ELDR repository",
    ),
    "llmservingsim-moe": PublicFile(
        "llmservingsim-qwen3-30b-a3b/tp1_moe.csv",
        "https://github.com/casys-kaist/LLMServingSim",
        "MIT",
    ),
}

# Tables whose public source is a rendered page, not a raw file: they are read from a local copy only.
_LOCAL_ONLY = {"olmoe-routing-counts", "mixtral-routing-counts", "specbench-leaderboard", "eldr-results", "llmservingsim-moe"}


def repo_root() -> Path:
    """The source tree that holds ``data/`` (moelab is installed editable from it)."""
    return Path(__file__).resolve().parents[1]


def bundled_path(*parts: str) -> Path:
    """Path of a file bundled in the repository's ``data/`` folder; raises if it is missing."""
    path = repo_root().joinpath("data", *parts)
    if not path.exists():
        raise FileNotFoundError(
            f"bundled data {path} is missing; moelab's data/ ships with the source tree (install with `pip install -e .`)"
        )
    return path


def cache_dir() -> Path:
    """Folder for downloads and derived artefacts (``$MOELAB_CACHE`` or ``~/.cache/moelab``)."""
    path = Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "moelab"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def bundled_public_root() -> Path:
    """Folder of the public data sets bundled with the source tree (``data/public``)."""
    return repo_root() / "data" / "public"


def public_path(name: str, *, download: bool = True) -> Path:
    """Local path of public file ``name``: the ``$MOELAB_PUBLIC_DATA`` copy, the bundled copy, the
    cache, or a download (in that order)."""
    if name not in PUBLIC_FILES:
        raise ValueError(f"name must be one of {sorted(PUBLIC_FILES)}; got {name!r}")
    spec = PUBLIC_FILES[name]
    local_root = os.environ.get(PUBLIC_DATA_ENV)
    if local_root:
        local = Path(local_root) / spec.relpath
        if local.is_file():
            return local
    bundled = bundled_public_root() / spec.relpath
    if bundled.is_file():
        return bundled
    cached = cache_dir() / "public" / spec.relpath
    if cached.is_file():
        return cached
    if name in _LOCAL_ONLY or not download:
        raise FileNotFoundError(
            f"public data {name!r} not found: set {PUBLIC_DATA_ENV} to a folder holding {spec.relpath} "
            f"(source: {spec.url}, licence {spec.licence})"
        )
    try:
        with urllib.request.urlopen(spec.url, timeout=60) as resp:  # noqa: S310 - fixed https URLs above
            atomic_write_bytes(cached, resp.read())
    except OSError as exc:
        raise FileNotFoundError(
            f"could not download {name!r} from {spec.url} ({exc}); set {PUBLIC_DATA_ENV} to a local copy"
        ) from None
    return cached


# ---------------------------------------------------------------- loaders

SPEC_BENCH_CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
_MT_BENCH_SUBCATEGORIES = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}


def load_spec_bench() -> pd.DataFrame:
    """Spec-Bench's 480 questions: ``question_id, category, subcategory, turns, prompt`` (first turn)."""
    rows = [json.loads(line) for line in public_path("spec-bench").read_text(encoding="utf-8").splitlines() if line.strip()]
    df = pd.DataFrame(rows)
    df["subcategory"] = df["category"]
    df["category"] = df["category"].where(~df["category"].isin(_MT_BENCH_SUBCATEGORIES), "mt_bench")
    df["prompt"] = df["turns"].map(lambda t: t[0])
    return df[["question_id", "category", "subcategory", "turns", "prompt"]]


def load_published_specbench() -> pd.DataFrame:
    """Spec-Bench leaderboard rows (transcribed public numbers)."""
    return pd.read_csv(public_path("specbench-leaderboard"))


def load_eldr_results() -> pd.DataFrame:
    """ELDR's published p50 TPOT (ms) per model, rate and router."""
    return pd.read_csv(public_path("eldr-results"))


def load_routing_counts(model: str = "olmoe") -> dict:
    """Real per-domain expert-selection counts (OLMoE-1B-7B or Mixtral-8x7B) as nested dicts."""
    key = {"olmoe": "olmoe-routing-counts", "mixtral": "mixtral-routing-counts"}.get(model)
    if key is None:
        raise ValueError(f"model must be one of ['olmoe', 'mixtral']; got {model!r}")
    return json.loads(public_path(key).read_text(encoding="utf-8"))


def load_calibration(gpu: str = "h200", table: str = "moe_step") -> pd.DataFrame:
    """A measured calibration table from ``data/calibration/<gpu>/<table>.csv``."""
    root = repo_root() / "data" / "calibration"
    gpus = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if gpu not in gpus:
        raise ValueError(f"gpu must be one of {gpus}; got {gpu!r}")
    path = root / gpu / f"{table}.csv"
    if not path.is_file():
        tables = sorted(p.stem for p in (root / gpu).glob("*.csv"))
        raise ValueError(f"table must be one of {tables}; got {table!r}")
    return pd.read_csv(path)
