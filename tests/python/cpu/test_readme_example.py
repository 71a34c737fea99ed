"""The README's CPU example runs as written: the first ```python block under the README's "CPU example"
heading, executed as a script (numpy and msa only; it checks its own output with asserts)."""
import re
from pathlib import Path

import pytest


def readme() -> Path:
    """README.md of the repository holding this test (looked up from here, whatever the test's folder)."""
    for folder in Path(__file__).resolve().parents:
        if (folder / "README.md").is_file() and (folder / "CMakeLists.txt").is_file():
            return folder / "README.md"
    pytest.fail("README.md not found above " + str(Path(__file__).parent))


def cpu_example(text: str) -> str:
    """The first ```python block after the heading whose title starts with 'CPU example'."""
    heading = re.search(r"^#+ CPU example.*$", text, re.MULTILINE)
    assert heading, "README.md has no '## CPU example' heading"
    block = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL).search(text, heading.end())
    assert block, "no ```python block after the 'CPU example' heading"
    return block.group(1)


def test_readme_cpu_example_runs(capsys):
    code = cpu_example(readme().read_text())
    assert "import msa" in code and "torch" not in code
    exec(compile(code, "README.md (CPU example)", "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out.strip(), "the example prints what it computed"
