"""What differs between Spark 3.5 and 4.x, read from package metadata (udf_agent/versions.py):
requirement lines, the Connect client's packages as the installed pyspark declares them, and
the doctor's line saying whether what is installed fits together."""

from __future__ import annotations

import pytest

from udf_agent import versions
from udf_agent.tools.doctor import check_versions
from udf_agent.versions import Requirement, connect_client_fits, connect_client_warning, java_fits, release

# As pyspark 3.5.9 and 4.3.0 declare their Connect extras (their METADATA's Requires-Dist).
SPARK_35 = [
    "py4j<0.10.9.10,>=0.10.9.7",
    'numpy<2,>=1.15; extra == "sql"',
    'pyarrow>=4.0.0; extra == "sql"',
    'grpcio>=1.56.0; extra == "connect"',
    'grpcio-status>=1.56.0; extra == "connect"',
    'googleapis-common-protos>=1.56.4; extra == "connect"',
    'numpy<2,>=1.15; extra == "connect"',
]
SPARK_4 = [
    "py4j<0.10.9.10,>=0.10.9.7",
    'numpy>=1.21; extra == "sql"',
    'grpcio>=1.67.0; extra == "connect"',
    'grpcio-status>=1.67.0; extra == "connect"',
    'googleapis-common-protos>=1.65.0; extra == "connect"',
    'zstandard>=0.25.0; extra == "connect"',
]


@pytest.mark.parametrize(
    "line, version, accepted",
    [
        ('numpy<2,>=1.15; extra == "sql"', "1.26.4", True),
        ('numpy<2,>=1.15; extra == "sql"', "2.1.0", False),
        ("protobuf<8,>=5.26.1", "5.26.1", True),
        ("protobuf<8,>=5.26.1", "5.26.0", False),
        ("protobuf<8,>=5.26.1", "7.36.2", True),
        ("protobuf<8,>=5.26.1", "8.0.0", False),
        ("pyspark[connect]<5,>=3.5", "4.0.0.dev1", True),
        ("pyspark<5,>=3.5", "3.4.4", False),
        ("pandas~=2.2", "2.3.3", True),
        ("pandas~=2.2", "3.0.0", False),
        ("click==8.*", "8.1.7", True),
        ("click!=8.1.0", "8.1.0", False),
        ("prometheus_client (>=0.20,<1)", "0.21.1", True),
    ],
)
def test_a_requirement_line_accepts_what_pip_would(line, version, accepted):
    assert Requirement.parse(line).accepts(version) is accepted


def test_a_requirement_line_knows_its_extra():
    assert Requirement.parse('zstandard>=0.25.0; extra == "connect"').extra == "connect"
    assert Requirement.parse("py4j<0.10.9.10,>=0.10.9.7").extra is None
    assert release("4.1.0rc1") == (4, 1, 0) and release("3.5.9") == (3, 5, 9)


@pytest.mark.parametrize("declared, missing", [(SPARK_35, []), (SPARK_4, ["zstandard"])])
def test_the_connect_client_needs_what_the_installed_pyspark_declares(monkeypatch, declared, missing):
    """Spark 4's client needs zstandard, 3.5's does not: asking for it beside 3.5 would refuse
    every --remote of a working install."""
    monkeypatch.setattr(versions.metadata, "requires", lambda package: declared if package == "pyspark" else [])
    monkeypatch.setattr(versions, "installed", lambda package: None if package == "zstandard" else "9.9")
    assert versions.missing_connect_client() == missing


def test_java_and_connect_rules_of_each_spark_line():
    assert java_fits("3.5.9", 17) and not java_fits("3.5.9", 21)
    assert java_fits("4.0.1", 21) and not java_fits("4.0.1", 11)
    assert java_fits("4.9.0", 25)  # a line newer than the table: 17 or later
    assert connect_client_fits("3.5.9", "4.0.1") and connect_client_fits("4.0.1", "4.0.5")
    assert not connect_client_fits("4.0.1", "3.5.9")
    assert connect_client_warning("3.5.9", "4.0.1") is None
    assert "install pyspark[connect]==3.5.* beside udf-agent" in (connect_client_warning("4.0.1", "3.5.9") or "")


def test_the_doctor_names_the_versions_found_and_says_what_does_not_fit(monkeypatch):
    found = check_versions(17)
    assert found.ok, found.detail  # this environment was installed by pip from setup.cfg
    assert f"Spark {versions.pyspark_version()} (pyspark), protobuf {versions.installed('protobuf')}, Java 17" in found.detail
    # Spark 3.5 beside numpy 2 and pyarrow 26 beside numpy 1, on Java 21: each said.
    have = {"pyspark": "3.5.9", "numpy": "2.1.0", "protobuf": "5.26.1", "pyarrow": "26.0.1"}
    monkeypatch.setattr(versions.metadata, "requires", lambda package: SPARK_35 if package == "pyspark" else [])
    monkeypatch.setattr(versions, "installed", lambda package: have.get(package, "1.0"))
    broken = check_versions(21)
    assert not broken.ok
    assert "numpy<2,>=1.15 (pyspark's; numpy 2.1.0 is installed)" in broken.detail
    assert "Spark 3.5.9 does not run on Java 21" in broken.detail
    have["numpy"] = "1.26.4"
    assert "pyarrow 26.0.1 does not import beside numpy 1.26.4" in check_versions(None).detail
