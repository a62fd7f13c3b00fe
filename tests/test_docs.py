"""The docs' Python code blocks run as written: each page is one script, blocks in order.

A block preceded by ``<!-- no-run -->`` is illustrative (placeholder paths or credentials)
and skipped; every other ``python`` block must run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
_BLOCK = re.compile(r"(<!-- no-run -->\s*)?```python\n(.*?)```", re.DOTALL)


def runnable_blocks(page: Path) -> list[str]:
    return [code for skip, code in _BLOCK.findall(page.read_text()) if not skip]


PAGES = sorted(p for p in DOCS.glob("*.md") if runnable_blocks(p))


def test_quickstart_is_executed() -> None:
    assert DOCS / "quickstart.md" in PAGES


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_doc_code_blocks_run(page: Path, tmp_path: Path) -> None:
    script = "\n\n".join(runnable_blocks(page))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"{page.name} failed:\n{result.stderr[-4000:]}"
