"""What `.ci/run` relies on from the test tools it installs."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.integration
def test_an_xdist_group_runs_in_one_test_process(tmp_path):
    """`.ci/run` keeps the cluster tests (``xdist_group("cluster")``) in one of its two test
    processes, so that Spark clusters come and go one at a time and each module's cluster is
    started once. pytest-xdist 3.8 under pytest 9.2 groups nothing (it renames grouped tests
    through a field pytest 9 no longer reads: pytest-dev/pytest-xdist#1386), and then each
    cluster was started twice, two at once; setup.cfg holds pytest below 9 for it."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_grouped.py").write_text(
        textwrap.dedent(
            """
            import pytest

            pytestmark = pytest.mark.xdist_group("together")

            @pytest.fixture(params=["a", "b"])
            def where(request):
                return request.param

            @pytest.mark.parametrize("n", range(3))
            def test_one(where, n):
                pass
            """
        )
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "test_grouped.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    workers = re.findall(r"\[(gw\d+)\].* PASSED test_grouped\.py::test_one", run.stdout)
    assert len(workers) == 6, run.stdout
    assert len(set(workers)) == 1, f"the group's tests ran in {sorted(set(workers))}:\n{run.stdout}"
