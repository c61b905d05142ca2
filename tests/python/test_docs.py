"""The Python examples marked `<!-- ci: run -->` in docs/python.md (and README.md, where it has any) run as written."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "docs" / "python.md", ROOT / "README.md"]


def examples(doc: Path) -> list[str]:
    return re.findall(r"<!-- ci: run -->\s*```python\n(.*?)```", doc.read_text(), re.S)


def test_python_md_has_an_example():
    assert examples(DOCS[0]), "docs/python.md has no example marked <!-- ci: run -->"


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_marked_examples_run(doc):
    blocks = examples(doc)
    if not blocks:
        pytest.skip(f"{doc.name} has no Python example marked <!-- ci: run -->")
    for code in blocks:
        exec(compile(code, str(doc), "exec"), {"__name__": "docs_example"})
