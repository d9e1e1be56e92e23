"""Every example in the README runs as written: its Python files, its test, and its `$` commands."""

import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", README, re.S)


def python_files():
    """The README's Python blocks, each headed by the file name it is meant to be saved as."""
    files = {}
    for language, body in BLOCKS:
        if language == "python":
            first, _, rest = body.partition("\n")
            assert first.startswith("# ") and first.endswith(".py"), f"a README Python block does not name its file: {first!r}"
            files[first[2:]] = body
    return files


def shell_examples():
    """(command, shown output lines) of each `$ udf-agent ...` example."""
    examples = []
    for language, body in BLOCKS:
        if language != "sh" or not body.startswith("$ "):
            continue
        command, _, shown = body.partition("\n")
        examples.append((command[2:], [line for line in shown.splitlines() if line.strip()]))
    return examples


def test_the_readme_has_the_examples_this_file_runs():
    assert set(python_files()) == {"mypkg/mymod.py", "test_mymod.py"}
    assert {shlex.split(command)[1] for command, _ in shell_examples()} == {"info", "replay"}


@pytest.mark.integration
def test_the_readme_udf_and_its_test_pass_as_written(tmp_path):
    for name, body in python_files().items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_mymod.py"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


@pytest.mark.integration
@pytest.mark.parametrize("command, shown", shell_examples(), ids=lambda value: value if isinstance(value, str) else "")
def test_each_readme_command_prints_what_the_readme_shows(command, shown, tmp_path):
    argv = shlex.split(command)
    assert argv[0] == "udf-agent"
    done = subprocess.run([sys.executable, "-m", "udf_agent", *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    printed = (done.stdout + "\n" + done.stderr).splitlines()
    for line in shown:
        if line == "..." or "/path/to/" in line:
            continue  # elided, or where the reader's own installation lives
        assert line in printed, f"README shows {line!r}; the command printed:\n" + "\n".join(printed)


@pytest.mark.integration
def test_the_readme_demo_matches_kapacitors_reference():
    assert "examples/demo.py" in BLOCKS[0][1]  # the README's first command runs it
    done = subprocess.run([sys.executable, "examples/demo.py"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "demo OK: results match Kapacitor's reference" in done.stdout


def test_the_readme_fits_on_a_page_and_every_document_it_names_exists():
    # The details live in docs/ and benchmarks/README.md: the README is what a newcomer reads whole.
    assert len(README.splitlines()) <= 300
    named = set(re.findall(r"\b((?:docs|benchmarks)/[\w./-]+\.(?:md|py))\b", README))
    assert {"docs/benchmarks.md", "docs/cli.md", "docs/kapacitor.md", "docs/troubleshooting.md"} <= named
    assert [path for path in sorted(named) if not os.path.exists(os.path.join(ROOT, path))] == []
