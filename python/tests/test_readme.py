"""The README's Python examples run as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert blocks, "no ```python block in the README"
    for code in blocks:
        exec(compile(code, str(README), "exec"), {"__name__": "readme"})


def test_docstring_examples_run():
    import doctest

    import knn._index

    failed, attempted = doctest.testmod(knn._index, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert attempted > 0 and failed == 0
