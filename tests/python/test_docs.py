"""The Python examples of docs/python.md marked `<!-- ci: run -->` run as written."""
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "python.md"


def examples() -> list[str]:
    return re.findall(r"<!-- ci: run -->\s*```python\n(.*?)```", DOC.read_text(), re.S)


def test_docs_examples_run():
    blocks = examples()
    assert blocks, "docs/python.md has no example marked <!-- ci: run -->"
    for code in blocks:
        exec(compile(code, str(DOC), "exec"), {"__name__": "docs_example"})
