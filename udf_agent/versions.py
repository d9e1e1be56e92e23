"""What differs between the Spark lines udf-agent runs on (3.5 and 4.x), found at run time from
what is installed rather than from version strings spread through the code: the packages
PySpark's own extras declare (its Connect client's, the numpy its SQL side takes), whether what
is installed satisfies them and udf-agent's own requirements, and the Java each line runs on.

Read from package metadata only: nothing here imports pyspark, so a light relay can ask."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata

# The Spark lines udf-agent is built and tested on (setup.cfg's pyspark range).
SUPPORTED_SPARK = ((3, 5), (5, 0))
# Java a line runs on where it is not Spark 4's 17 or later (udf-agent itself needs 17, java.py).
JAVA_BY_SPARK_LINE = {(3, 5): (17,)}

# Conflicts no package declares: pyarrow 26 refuses to import beside numpy 1 (Spark 3.5's).
UNDECLARED = (("pyarrow", ">=26", "numpy", "<2"),)

_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_CLAUSE = re.compile(r"\s*(<=|>=|==|!=|~=|<|>)\s*([0-9][0-9A-Za-z.*+!-]*)\s*")


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: (3, 5, 9) for "3.5.9", (4, 1, 0) for "4.1.0.dev1"."""
    numbers = []
    for part in version.split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
        if digits.group() != part:  # "0rc1": a pre-release of its numbers
            break
    return tuple(numbers)


@dataclass(frozen=True)
class Requirement:
    """One requirement line of a package's metadata: its package, its version clauses, and the
    extra it belongs to (None: always)."""

    package: str
    clauses: tuple[tuple[str, str], ...]
    extra: str | None

    @classmethod
    def parse(cls, line: str) -> Requirement:
        spec, _, marker = line.partition(";")
        named = _NAME.match(spec)
        if named is None:
            raise ValueError(f"not a requirement: {line!r}")
        rest = spec[named.end():]
        rest = re.sub(r"^\s*\[[^\]]*\]", "", rest).strip().strip("()")  # its own extras: the package is what counts
        clauses = tuple((m.group(1), m.group(2)) for m in map(_CLAUSE.fullmatch, filter(None, rest.split(","))) if m)
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
        return cls(named.group(1), clauses, extra.group(1) if extra else None)

    def accepts(self, version: str) -> bool:
        have = release(version)
        for op, wanted in self.clauses:
            if wanted.endswith(".*"):  # == X.Y.*: the same leading numbers
                prefix = release(wanted[:-2])
                same = have[: len(prefix)] == prefix
                if (op == "==" and not same) or (op == "!=" and same):
                    return False
                continue
            want = release(wanted)
            width = max(len(have), len(want))
            a, b = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
            if op == "~=":  # compatible release: >= it, same leading numbers but the last
                ok = a >= b and a[: len(want) - 1] == b[: len(want) - 1]
            else:
                ok = {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b, "!=": a != b}[op]
            if not ok:
                return False
        return True

    def __str__(self) -> str:
        return self.package + ",".join(op + version for op, version in self.clauses)


def requirements(package: str, extras: tuple[str, ...] = ()) -> list[Requirement]:
    """``package``'s declared requirements: those always needed and those of ``extras``."""
    declared = metadata.requires(package) or []
    wanted = [Requirement.parse(line) for line in declared]
    return [r for r in wanted if r.extra is None or r.extra in extras]


def installed(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def pyspark_version() -> str | None:
    return installed("pyspark")


def spark_line(version: str) -> tuple[int, int]:
    major, minor, *_ = release(version) + (0, 0)
    return major, minor


def missing_connect_client() -> list[str]:
    """The packages PySpark's Connect client needs (its ``connect`` extra, as the installed
    pyspark declares it: Spark 4 added zstandard) that are not installed here."""
    if pyspark_version() is None:
        return ["pyspark"]
    return [r.package for r in requirements("pyspark", ("connect",)) if r.extra == "connect" and installed(r.package) is None]


def unmet(package: str, extras: tuple[str, ...] = ()) -> list[str]:
    """Each requirement of ``package`` (and ``extras``) the installed packages do not meet,
    saying what is installed: "numpy<2,>=1.15 (pyspark's; numpy 2.1.0 is installed)"."""
    problems = []
    for requirement in requirements(package, extras):
        have = installed(requirement.package)
        if have is None:
            if requirement.extra is None:
                problems.append(f"{requirement} ({package}'s; not installed)")
        elif not requirement.accepts(have):
            problems.append(f"{requirement} ({package}'s; {requirement.package} {have} is installed)")
    return problems


def undeclared_conflicts() -> list[str]:
    """The installed pairs of UNDECLARED that do not go together."""
    found = []
    for package, its_range, other, other_range in UNDECLARED:
        have, other_have = installed(package), installed(other)
        if have and other_have and Requirement.parse(package + its_range).accepts(have) and Requirement.parse(other + other_range).accepts(other_have):
            found.append(f"{package} {have} does not import beside {other} {other_have}")
    return found


def java_fits(spark_version: str, java_major: int) -> bool:
    """Whether this Spark line is documented to run on Java ``java_major`` (a line not in the
    table: Java 17 or later, as Spark 4 needs)."""
    supported = JAVA_BY_SPARK_LINE.get(spark_line(spark_version))
    return java_major in supported if supported is not None else java_major >= 17


def connect_client_fits(client: str, server: str) -> bool:
    """A Spark Connect client may be older than its server, never newer (Spark's own rule)."""
    return spark_line(client) <= spark_line(server)


def connect_client_warning(client: str, server: str) -> str | None:
    """What to say when this pyspark ``client`` is newer than the Connect ``server``'s Spark."""
    if connect_client_fits(client, server):
        return None
    line = ".".join(map(str, spark_line(server)))
    return f"this pyspark {client} is newer than the Spark Connect server's Spark {server}, which Spark does not support: install pyspark[connect]=={line}.* beside udf-agent"
