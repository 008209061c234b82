"""An offline, multi-domain text corpus for the project-trained tiny MoE (and anything else that needs text).

Every domain is assembled from files a Debian + Python machine already has, or generated (synthetic):

==============  ===============================================================================
``python``      Python standard-library sources (``sysconfig`` stdlib path, tests excluded)
``c_headers``   C headers under ``/usr/include``
``manpages``    English man pages (``/usr/share/man/man[1-8]``), rendered to plain text by a small
                built-in roff renderer (deterministic; needs neither ``man`` nor ``groff``)
``arithmetic``  **synthetic** arithmetic worksheets generated from the seed
``prose``       natural-language English: ``/usr/share/common-licenses`` and package READMEs under
                ``/usr/share/doc``
==============  ===============================================================================

Users add domains from their own text files or folders (``extra_paths``; the domain is the file or folder
name, or ``name=path``). The split into train / held-out is by *source file* (a file never lands in both),
seeded, so the corpus is reproducible on one machine; a manifest records every source file used (path,
size, sha256) and every corpus file written.
"""

from __future__ import annotations

import gzip
import hashlib
import re
import sysconfig
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from moelab._io import atomic_write_json, atomic_write_text, read_json
from moelab._validate import check_choice, check_int, check_real
from moelab.datasets import load_sharegpt

BUILTIN_DOMAINS = ("python", "c_headers", "manpages", "arithmetic", "prose")
SPLITS = ("train", "heldout")
DEFAULT_MAX_BYTES = 3_000_000  # per domain and split "train"; held-out gets heldout_fraction of it
DEFAULT_HELDOUT_FRACTION = 0.1
CHUNK_BYTES = 4096  # long files are cut (at line boundaries) into documents of about this size
_TEXT_SUFFIXES = {".txt", ".md", ".rst", ".py", ".c", ".h", ".json", ".csv", ".tex", ".html", ".xml", ".yaml", ".yml", ""}


# ---------------------------------------------------------------------------------------------- sources
def _read_text(path: Path) -> str | None:
    """File text (transparently gunzipped), or None when it is not UTF-8 text."""
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile):
        return None
    if b"\x00" in raw[:4096]:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _python_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "site-packages", "lib2to3", "__pycache__", "turtledemo"}
    return sorted(p for p in root.rglob("*.py") if not skip.intersection(p.relative_to(root).parts))


def _c_header_files() -> list[Path]:
    return sorted(Path("/usr/include").rglob("*.h")) if Path("/usr/include").is_dir() else []


def _man_files() -> list[Path]:
    root = Path("/usr/share/man")
    if not root.is_dir():
        return []
    # The Google Cloud SDK ships ~15k near-identical gcloud/bq pages that would swamp the domain.
    return sorted(p for sec in range(1, 9) for p in (root / f"man{sec}").glob("*")
                  if p.is_file() and not p.name.startswith(("gcloud", "bq", "gsutil")))


def _prose_files() -> list[Path]:
    files = []
    lic = Path("/usr/share/common-licenses")
    if lic.is_dir():
        files += [p for p in lic.iterdir() if p.is_file()]
    doc = Path("/usr/share/doc")
    if doc.is_dir():
        files += [p for p in doc.rglob("README*") if p.is_file() and p.suffix.lower() in {"", ".gz", ".md", ".txt", ".debian"}]
    return sorted(set(files))


_FONT = re.compile(r"\\f(\(..|\[[^\]]*\]|.)")
_SIZE = re.compile(r"\\s[+-]?\d+")
_STRING = re.compile(r"\\\*(\(..|\[[^\]]*\]|.)")
_SPECIAL = {"em": "--", "en": "-", "bu": "*", "co": "(c)", "rg": "(R)", "aq": "'", "dq": '"', "lq": '"', "rq": '"',
            "oq": "'", "cq": "'", "ha": "^", "ti": "~", "rs": "\\", "mi": "-", "pl": "+", "mu": "x", "<=": "<=", ">=": ">="}
_SPECIAL_RE = re.compile(r"\\(\((..)|\[([^\]]*)\])")
_ARGS = re.compile(r'"([^"]*)"|(\S+)')


def _inline(text: str) -> str:
    text = _FONT.sub("", text)
    text = _SIZE.sub("", text)
    text = _STRING.sub("", text)
    text = _SPECIAL_RE.sub(lambda m: _SPECIAL.get(m.group(2) or m.group(3), ""), text)
    for a, b in (("\\-", "-"), ("\\&", ""), ("\\e", "\\"), ("\\ ", " "), ("\\|", ""), ("\\^", ""), ("\\c", ""), ("\\%", ""), ("\\(", "(")):
        text = text.replace(a, b)
    return text


def render_roff(source: str) -> str:
    """Render man-page roff source to plain text (headings, paragraphs, font macros; tables kept raw).

    A deliberately small renderer: deterministic and independent of the installed ``groff``; good enough
    to give the man-page domain its own vocabulary and layout."""
    out: list[str] = []
    for line in source.splitlines():
        if line.startswith(('.\\"', "'\\\"", '\\"')):
            continue
        if line.startswith((".", "'")):
            parts = line[1:].strip().split(None, 1)
            if not parts:
                continue
            macro, rest = parts[0], (parts[1] if len(parts) > 1 else "")
            args = [a or b for a, b in _ARGS.findall(rest)]
            if macro in ("SH", "SS"):
                out += ["", _inline(" ".join(args)).upper() if macro == "SH" else _inline(" ".join(args))]
            elif macro in ("B", "I", "SM", "SB"):
                out.append(_inline(" ".join(args)))
            elif macro in ("BR", "RB", "IR", "RI", "BI", "IB"):
                out.append(_inline("".join(args)))
            elif macro in ("PP", "P", "LP", "sp", "br"):
                out.append("")
            elif macro in ("TP", "IP", "HP") and args:
                out += ["", _inline(args[0])] if macro == "IP" else [""]
            elif macro in ("UR", "MT") and args:
                out.append(args[0])
            continue  # other requests (.TH, .nf, .fi, .de, .if, .TS ...) carry no text of their own
        out.append(_inline(line))
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def _man_text(path: Path) -> str | None:
    src = _read_text(path)
    if src is None or src.lstrip().startswith(".so "):
        return None  # .so pages are redirects to another page
    text = render_roff(src)
    return text if len(text) > 200 else None


def _prose_text(path: Path) -> str | None:
    text = _read_text(path)
    if text is None or len(text) < 300:
        return None
    letters = sum(c.isalpha() or c.isspace() for c in text[:5000])
    return text if letters / min(len(text), 5000) > 0.85 else None  # mostly words, not tables or code


_SOURCES = {
    "python": (_python_files, _read_text),
    "c_headers": (_c_header_files, _read_text),
    "manpages": (_man_files, _man_text),
    "prose": (_prose_files, _prose_text),
}


def _extra_files(spec: str | Path) -> tuple[str, list[Path]]:
    """(domain name, files) of a user path: a text file, a folder of them, or ``name=path``."""
    s = str(spec)
    name, _, p = s.partition("=") if "=" in s and not Path(s).exists() else ("", "", s)
    path = Path(p).expanduser()
    if not path.exists():
        raise ValueError(f"extra_paths entry {spec!r}: {path} does not exist")
    if path.is_file():
        files = [path]
    else:
        files = sorted(f for f in path.rglob("*") if f.is_file() and f.suffix.lower().removesuffix(".gz") in _TEXT_SUFFIXES | {f.suffix.lower()})
    name = name or path.stem or path.name
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"extra_paths entry {spec!r}: domain name {name!r} must be letters, digits, '_', '-', '.'")
    return name, files


# ---------------------------------------------------------------------------------------------- synthetic
def _arithmetic_doc(rng: np.random.Generator) -> str:
    """One synthetic arithmetic worksheet: ~40 exact equations of mixed kinds."""
    lines = [f"# worksheet {int(rng.integers(1, 10_000))}"]
    for _ in range(int(rng.integers(25, 55))):
        kind = int(rng.integers(0, 6))
        a, b, c = (int(x) for x in rng.integers(0, 1000, size=3))
        if kind == 0:
            lines.append(f"{a} + {b} = {a + b}")
        elif kind == 1:
            lines.append(f"{a} - {b} = {a - b}")
        elif kind == 2:
            a, b = a % 100, b % 100
            lines.append(f"{a} * {b} = {a * b}")
        elif kind == 3:
            b = b % 50 + 1
            lines.append(f"{a} / {b} = {a // b} r {a % b}")
        elif kind == 4:
            a, b, c = a % 100, b % 100, c % 20
            lines.append(f"({a} + {b}) * {c} = {(a + b) * c}")
        else:
            lines.append(f"{a} + {b} + {c} = {a + b + c}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- splitting
def _domain_seed(seed: int, domain: str) -> int:
    return int(seed) * 1_000_003 + zlib.crc32(domain.encode())


def _chunks(text: str, size: int = CHUNK_BYTES) -> list[str]:
    """Cut ``text`` at line boundaries into pieces of about ``size`` characters."""
    if len(text) <= size:
        return [text]
    out, cur, n = [], [], 0
    for line in text.splitlines(keepends=True):
        cur.append(line)
        n += len(line)
        if n >= size:
            out.append("".join(cur))
            cur, n = [], 0
    if cur and n > size // 8:
        out.append("".join(cur))
    return out


def _plan(domain: str, files: list[Path], seed: int, heldout_fraction: float) -> dict[str, list[Path]]:
    """Seeded split of a domain's source files: a file is either train or held-out, never both."""
    rng = np.random.default_rng(_domain_seed(seed, domain))
    order = [files[i] for i in rng.permutation(len(files))]
    n_held = max(1, int(round(heldout_fraction * len(order)))) if len(order) > 1 else 0
    return {"heldout": order[:n_held], "train": order[n_held:]}


def _iter_domain(domain: str, split: str, seed: int, max_bytes: int, heldout_fraction: float,
                 files: list[Path] | None, reader: Any, sources: list[dict] | None) -> Iterator[str]:
    budget = max_bytes if split == "train" else max(1, int(max_bytes * heldout_fraction))
    used = 0
    if domain == "arithmetic" and files is None:
        rng = np.random.default_rng([_domain_seed(seed, domain), SPLITS.index(split)])
        while used < budget:
            doc = _arithmetic_doc(rng)
            used += len(doc)
            yield doc
        return
    assert files is not None
    seen: set[str] = set()
    for path in _plan(domain, files, seed, heldout_fraction)[split]:
        text = reader(path)
        if not text or not text.strip():
            continue
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest in seen:  # licences and READMEs are often symlinked / duplicated
            continue
        seen.add(digest)
        if sources is not None:
            sources.append({"domain": domain, "split": split, "path": str(path), "bytes": path.stat().st_size,
                            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
        for piece in _chunks(text):
            if used >= budget:
                return
            used += len(piece)
            yield piece
        if used >= budget:
            return


def available_domains() -> list[str]:
    """Built-in domains that have source files on this machine (``arithmetic`` always)."""
    return [d for d in BUILTIN_DOMAINS if d == "arithmetic" or _SOURCES[d][0]()]


def iter_domain_texts(
    domains: Sequence[str] | None = None,
    *,
    split: str = "train",
    seed: int = 0,
    extra_paths: Sequence[str | Path] = (),
    max_bytes: int = DEFAULT_MAX_BYTES,
    heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
    _sources: list[dict] | None = None,
) -> Iterator[tuple[str, str]]:
    """Yield ``(domain, text)`` documents of the offline corpus, domain after domain.

    Parameters
    ----------
    domains : sequence of str, optional
        Built-in domains to include (default: every one available here, see :data:`BUILTIN_DOMAINS`).
    split : {"train", "heldout"}
        Which side of the seeded, per-source-file split.
    seed : int
        Seeds the split and the synthetic arithmetic domain; same seed, same machine -> same documents.
    extra_paths : sequence of paths
        User text files / folders, each a further domain (named after it, or ``name=path``).
    max_bytes : int
        Characters per domain in the train split (held-out gets ``heldout_fraction`` of it).
    heldout_fraction : float
        Share of each domain's source files held out.

    Yields
    ------
    (str, str)
        Domain name and one document (a file, or a ~4 KB line-aligned piece of a long file).
    """
    check_choice("split", split, SPLITS)
    check_int("seed", seed, low=0)
    check_int("max_bytes", max_bytes, low=1)
    check_real("heldout_fraction", heldout_fraction, low=0, high=0.5, low_open=True)
    if domains is None:
        domains = available_domains() if not extra_paths else []
    domains = list(domains)
    for d in domains:
        check_choice("domains entry", d, BUILTIN_DOMAINS)
    extras = [_extra_files(p) for p in extra_paths]
    names = domains + [n for n, _ in extras]
    if len(set(names)) != len(names):
        raise ValueError(f"domain names must be unique; got {names}")
    if not names:
        raise ValueError("no domains selected: pass domains=... or extra_paths=...")
    for d in domains:
        if d == "arithmetic":
            yield from ((d, t) for t in _iter_domain(d, split, seed, max_bytes, heldout_fraction, None, None, _sources))
            continue
        lister, reader = _SOURCES[d]
        files = lister()
        if not files:
            raise ValueError(f"domain {d!r} has no source files on this machine; available: {available_domains()}")
        yield from ((d, t) for t in _iter_domain(d, split, seed, max_bytes, heldout_fraction, files, reader, _sources))
    for name, files in extras:
        if not files:
            raise ValueError(f"extra domain {name!r} has no text files")
        yield from ((name, t) for t in _iter_domain(name, split, seed, max_bytes, heldout_fraction, files, _read_text, _sources))


def build_corpus(
    out_dir: str | Path,
    domains: Sequence[str] | None = None,
    extra_paths: Sequence[str | Path] = (),
    seed: int = 0,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
) -> dict[str, Any]:
    """Write the corpus to ``out_dir`` and return its manifest.

    Files: ``<domain>.<split>.txt`` (documents separated by a form feed line ``\\f\\n``) and
    ``manifest.json`` (seed, parameters, every corpus file with bytes / documents / sha256, and every
    source file used with its split, size and sha256). Parameters as in :func:`iter_domain_texts`.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sources: list[dict] = []
    files: list[dict] = []
    for split in SPLITS:
        docs: dict[str, list[str]] = {}
        for dom, text in iter_domain_texts(domains, split=split, seed=seed, extra_paths=extra_paths, max_bytes=max_bytes,
                                           heldout_fraction=heldout_fraction, _sources=sources):
            docs.setdefault(dom, []).append(text.replace(DOC_SEP, "\n"))
        for dom, items in docs.items():
            body = DOC_SEP.join(items)
            path = atomic_write_text(out / f"{dom}.{split}.txt", body)
            files.append({"file": path.name, "domain": dom, "split": split, "documents": len(items),
                          "bytes": path.stat().st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
    manifest = {"format": "moelab.corpus", "seed": int(seed), "max_bytes": int(max_bytes),
                "heldout_fraction": float(heldout_fraction), "chunk_bytes": CHUNK_BYTES,
                "domains": sorted({f["domain"] for f in files}), "files": files, "sources": sources,
                "synthetic": ["arithmetic"] if any(f["domain"] == "arithmetic" for f in files) else []}
    atomic_write_json(out / "manifest.json", manifest)
    return manifest


DOC_SEP = "\n\f\n"


def read_corpus(corpus_dir: str | Path, split: str = "train") -> dict[str, list[str]]:
    """Documents per domain of a corpus written by :func:`build_corpus` (checked against its manifest)."""
    check_choice("split", split, SPLITS)
    root = Path(corpus_dir)
    if not (root / "manifest.json").is_file():
        raise ValueError(f"{root} is not a moelab corpus (no manifest.json)")
    manifest = read_json(root / "manifest.json")
    if not isinstance(manifest, dict) or manifest.get("format") != "moelab.corpus":
        raise ValueError(f"{root / 'manifest.json'} is not a moelab corpus manifest")
    out: dict[str, list[str]] = {}
    for f in manifest["files"]:
        if f["split"] != split:
            continue
        raw = (root / f["file"]).read_bytes()
        if hashlib.sha256(raw).hexdigest() != f["sha256"]:
            raise ValueError(f"{root / f['file']} does not match its manifest sha256 (modified or corrupt)")
        out[f["domain"]] = raw.decode("utf-8").split(DOC_SEP)
    return out


# ---------------------------------------------------------------------------------------------- ShareGPT
def sharegpt_conversations(*, max_conversations: int | None = None) -> tuple[list[list[tuple[str, str]]], dict[str, Any]]:
    """Real chat conversations for HD's stores: ShareGPT V3 read by the one shared parser,
    :func:`moelab.datasets.load_sharegpt` (size-checked, only complete records, nothing dropped silently).

    Returns
    -------
    (conversations, provenance)
        Each conversation is a list of ``(role, text)`` turns, in file order. ``provenance`` is the reader's
        (package, file, bytes, conversations, dropped, truncated) plus the file's sha256 and
        ``conversations_read``.
    """
    data = load_sharegpt(max_conversations)
    digest = hashlib.sha256()
    with open(data.path, "rb") as fh:
        for block in iter(lambda: fh.read(8 << 20), b""):
            digest.update(block)
    prov = {**data.provenance(), "sha256": digest.hexdigest(), "conversations_read": len(data.conversations),
            "max_conversations": max_conversations}
    return [list(c.turns) for c in data.conversations], prov
