"""The evaluation corpora, from Debian packages (public domain texts), and their fixed held-out split.

devil: `dict-devil` — Ambrose Bierce, The Devil's Dictionary (/usr/share/dictd/devil.dict.dz, dictzip = gzip).
kjv:   `bible-kjv-text` — the King James Bible (/usr/lib/bible.data, decoded by the `bible` program of
       `bible-kjv`), as chapters with verse numbers removed.

Held-out split: the last 20 % of each text (cut at a line start) is the evaluation text; the first 80 %
is left for calibration. Nothing in flashtq is fitted on the evaluation text.
"""
from __future__ import annotations

import gzip
import re
import shutil
import subprocess
from pathlib import Path
from typing import Optional, Union

from flashtq._errors import error

CORPORA = {"devil": Path("/usr/share/dictd/devil.dict.dz"), "kjv": Path("/usr/lib/bible.data")}
HELD_OUT_FRACTION = 0.2


def _devil(path: Path) -> str:
    text = gzip.open(path, "rt", encoding="utf-8", errors="replace").read()
    # dictd's own entries (00-database-...) come first; the book starts at its title page.
    start = text.find("THE DEVIL'S DICTIONARY")
    return text[start:] if start >= 0 else text


def _kjv(path: Path) -> str:
    bible = shutil.which("bible")
    if bible is None:
        raise error("corpus", "kjv needs the `bible` program (Debian package bible-kjv) to decode bible-kjv-text")
    raw = subprocess.run([bible, "-p", str(path.parent), "-d", path.name, "Gen1:1-Rev22:21"], stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, check=True).stdout
    # Verses are printed as "  12 text" with wrapped lines; drop the numbers and unwrap each chapter.
    chapters = []
    for block in re.split(r"\n(?=\S[^\n]* \d+\n)", raw.strip()):
        head, _, body = block.partition("\n")
        verses = re.split(r"\n\s+\d+ ", "\n" + body.strip())
        chapters.append(head.strip() + "\n" + "\n".join(" ".join(v.split()) for v in verses if v.strip()))
    return "\n\n".join(chapters) + "\n"


def load_text(corpus: str = "devil", path: Optional[Union[str, Path]] = None) -> str:
    """The whole text of `corpus`, from `path` or the packaged file by default; a path ending in .txt holds the
    text itself (as this function returns it), for a machine without the Debian package."""
    if corpus not in CORPORA:
        raise error("corpus", f"unknown name {corpus!r} (choices: {', '.join(CORPORA)})")
    p = Path(path) if path is not None else CORPORA[corpus]
    if not p.is_file():
        package = {"devil": "dict-devil", "kjv": "bible-kjv-text and bible-kjv"}[corpus]
        raise error("path", f"no {corpus} text at {p} (Debian package {package}; scripts/setup.sh installs it)")
    if p.suffix == ".txt":  # the text as this function returns it, saved: for a machine without the Debian package
        return p.read_text(encoding="utf-8")
    return _devil(p) if corpus == "devil" else _kjv(p)


def held_out(text: str) -> str:
    """The evaluation split: the last HELD_OUT_FRACTION of the text, from the first line start there."""
    cut = text.find("\n", int(len(text) * (1 - HELD_OUT_FRACTION)))
    return text[cut + 1:] if cut >= 0 else ""


def calibration(text: str) -> str:
    """The rest (the first 1 - HELD_OUT_FRACTION), for anything that is fitted."""
    cut = text.find("\n", int(len(text) * (1 - HELD_OUT_FRACTION)))
    return text[: cut + 1] if cut >= 0 else text
