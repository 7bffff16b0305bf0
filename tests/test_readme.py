"""The README's example runs as written, and its set-up commands name real entry points."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert blocks, "the README should show a Python example"
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_docs_home_shows_the_readme_commands():
    commands = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    home = (ROOT / "docs" / "index.md").read_text()
    for command in commands:
        assert command in home
