"""Two "hosts" made of Linux network namespaces, for tests that must cross a real network.

``two_hosts(work)`` makes two network namespaces joined by a veth pair, one IPv4 address on
each end (a /24 of their own) and loopback up, and nothing else: no default route, no other
interface, so whatever runs in them reaches only the other one. Each host has its own
$TMPDIR under ``work``, and its processes run in a private mount namespace in which the
other host's $TMPDIR is covered by an empty tmpfs: the namespaces share one filesystem, and
a process of host B that could see host A's temporary files (an agent's unix socket, say)
would never touch the network. Host A sees B's just as little.

On it: a Spark standalone cluster (``start_cluster``: the master and a 1-core worker on A,
a 1-core worker on B), processes on either host (``Host.run``, ``agent`` for ``udf-agent``
under ``udf_agent.testing.KapacitorDriver``), and packet captures of a host's veth end
(``capture``: a raw AF_PACKET socket, in pcap format). Everything is removed on the way out,
also when the caller fails: captures, processes, daemons, anything still running in the
namespaces, the namespaces (and with them the veth pair).

Names are ``udfh-PID-N-a``/``-b`` (PID: this process): parallel runs never collide, and
the namespaces of a run whose process is gone are removed by the next run.

Needs root, iproute2's ``ip`` and util-linux's ``unshare``; ``HostsUnavailable`` says why
not. ``python -m benchmarks.hosts capture IFACE FILE`` is the capture's own process (run
in the namespace by ``capture``); ``python -m benchmarks.hosts clean`` removes leftovers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from benchmarks.spark_servers import Daemons
    from udf_agent.testing import KapacitorDriver

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PREFIX = "udfh"
_NAME = re.compile(rf"^{PREFIX}-(\d+)-(\d+)-[ab]$")
# The pair's own /24: both ends live in namespaces of their own, so it cannot clash with
# any network of the machine's.
SUBNET = "10.213.7"
MASTER_PORT, MASTER_UI_PORT, WORKER_UI_PORT = 7077, 8080, 8081  # free: the namespaces are new
_runs = itertools.count()

# Run as ``sh -c HIDE hide DIR... -- COMMAND...`` in a new mount namespace: an empty tmpfs
# over each DIR, then COMMAND in its place (its process keeps the pid).
HIDE = 'while [ "$1" != -- ]; do mount -t tmpfs -o size=1m,mode=0700 udfh-hidden "$1" || exit 125; shift; done; shift; exec "$@"'


class HostsUnavailable(RuntimeError):
    """Two namespaced hosts cannot be made here (not root, no ``ip``, namespaces refused...)."""


@dataclasses.dataclass
class Host:
    """One end: a network namespace, its veth end and address, its own $TMPDIR, and the
    directories its processes must not see (the other host's $TMPDIR)."""

    label: str  # "A" or "B"
    netns: str
    iface: str
    address: str
    tmpdir: Path
    hidden: tuple[Path, ...] = ()

    def prefix(self) -> list[str]:
        """What runs a command on this host: in its network namespace, and in a private mount
        namespace with ``hidden`` covered. Every step execs the next: the command keeps the pid."""
        command = ["ip", "netns", "exec", self.netns]
        if self.hidden:
            command += ["unshare", "--mount", "--propagation", "private", "sh", "-c", HIDE, "hide", *map(str, self.hidden), "--"]
        return command

    def env(self) -> dict[str, str]:
        """The environment a process on this host gets over the caller's: its $TMPDIR, Spark's
        address, and the agent's shared Spark servers in a directory of the host's own (by
        default they live in /tmp/udf-agent-UID, the same on both hosts and on the machine)."""
        return {"TMPDIR": str(self.tmpdir), "SPARK_LOCAL_IP": self.address, "UDF_AGENT_SHARED_DIR": str(self.tmpdir / "udf-agent-shared")}

    def netns_id(self) -> tuple[int, int]:
        """The namespace's (device, inode), as /proc/PID/ns/net of its processes shows."""
        found = os.stat(f"/run/netns/{self.netns}")
        return found.st_dev, found.st_ino

    def run(self, *args: str, env: Mapping[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run([*self.prefix(), *args], env={**os.environ, **self.env(), **(env or {})}, **kwargs)


class Segment(NamedTuple):
    """A TCP segment seen by a capture (IPv4)."""

    time: float
    src: str
    sport: int
    dst: str
    dport: int
    flags: int
    payload: bytes


class Capture:
    """Frames captured on one host's veth end (pcap at ``path``); readable while it runs and after."""

    def __init__(self, path: Path, iface: str):
        self.path, self.iface = path, iface

    def frames(self) -> list[tuple[float, bytes]]:
        """(time, Ethernet frame) of every frame so far."""
        return list(read_pcap(self.path))

    def captured_bytes(self) -> bytes:
        """Every captured frame's bytes, one after the other: what crossed the wire, to search
        for strings that must (or must not) have crossed in the clear. Search for long strings
        (a random token of 16 bytes or more): a capture of a few hundred kilobytes holds any
        given 2-byte string by chance."""
        return b"".join(frame for _, frame in self.frames())

    def tcp(self) -> list[Segment]:
        """The IPv4 TCP segments among the frames."""
        return [segment for stamp, frame in self.frames() if (segment := tcp_segment(stamp, frame)) is not None]


class TwoHosts:
    """Two namespaced hosts, A and B (see the module's doc); made and removed by ``two_hosts``."""

    def __init__(self, work: Path, run: str):
        self.work = work
        self.run_name = run
        tmp_a, tmp_b = work / "hostA-tmp", work / "hostB-tmp"
        self.a = Host("A", f"{run}-a", _iface(run, "a"), f"{SUBNET}.1", tmp_a, (tmp_b,))
        self.b = Host("B", f"{run}-b", _iface(run, "b"), f"{SUBNET}.2", tmp_b, (tmp_a,))
        self.daemons: Daemons | None = None
        self.master_url: str | None = None
        self._processes: list[subprocess.Popen] = []
        self._drivers: list[KapacitorDriver] = []

    @property
    def hosts(self) -> tuple[Host, Host]:
        return self.a, self.b

    def host_of(self, pid: int) -> Host | None:
        """The host whose network namespace process ``pid`` runs in; None if neither."""
        where = _netns_of(pid)
        return next((host for host in self.hosts if where is not None and host.netns_id() == where), None)

    # ---- making and removing ----

    def make(self) -> None:
        for host in self.hosts:
            host.tmpdir.mkdir(parents=True, exist_ok=True)
            _ip("netns", "add", host.netns)
            # No IPv6 (link-local chatter, a second way out): IPv4 on the veth and loopback only.
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("netns", "exec", host.netns, "sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6; echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6")
        _ip("link", "add", self.a.iface, "netns", self.a.netns, "type", "veth", "peer", "name", self.b.iface, "netns", self.b.netns)
        for host in self.hosts:
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", host.iface)
            _ip("-n", host.netns, "link", "set", host.iface, "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
            routes = _ip("-n", host.netns, "route", "show").stdout
            if "default" in routes:
                raise RuntimeError(f"namespace {host.netns} has a default route: {routes}")

    def close(self) -> None:
        """Removes everything, whatever fails on the way."""
        for driver in self._drivers:
            with contextlib.suppress(Exception):
                driver.kill()
        for process in self._processes:
            _stop(process)
        if self.daemons is not None:
            with contextlib.suppress(Exception):
                self.daemons.stop()
        for host in self.hosts:
            _empty_and_delete(host.netns)

    # ---- running things ----

    def agent(self, *args: str, host: Host | None = None, env: Mapping[str, str] | None = None, cwd: str = ROOT) -> KapacitorDriver:
        """``udf-agent ARGS`` on ``host`` (A by default), driven as Kapacitor drives it; killed
        on the way out if still running."""
        from udf_agent.testing import AGENT, KapacitorDriver

        host = host or self.a
        driver = KapacitorDriver.command([*host.prefix(), *AGENT, *args], env={**host.env(), **(env or {})}, cwd=cwd)
        self._drivers.append(driver)
        return driver

    def start_cluster(self, timeout: float = 90, workers: Sequence[Host] | None = None, conf_dir: Path | None = None) -> str:
        """A Spark standalone master on A and a 1-core worker on each host of ``workers`` (both
        by default); the master's URL once they have registered. With ``conf_dir`` the daemons
        read their settings from its spark-defaults.conf ($SPARK_CONF_DIR), as a cluster's
        nodes read a secret. The daemons stop on the way out."""
        from benchmarks.spark_servers import Daemons

        if self.master_url is not None:
            return self.master_url
        daemons = self.daemons = Daemons(self.work / "spark")
        if conf_dir is not None:
            daemons.env["SPARK_CONF_DIR"] = str(conf_dir)
        url = f"spark://{self.a.address}:{MASTER_PORT}"
        master_log = daemons.start(
            "master", "spark-class", "org.apache.spark.deploy.master.Master", "--host", self.a.address, "--port", str(MASTER_PORT), "--webui-port", str(MASTER_UI_PORT),
            prefix=self.a.prefix(), env=self.a.env(),
        )
        daemons.wait_for("the master did not start", lambda: _log_has(master_log, "I have been elected leader"), master_log, timeout)
        logs = []
        for host in self.hosts if workers is None else workers:
            logs.append(
                daemons.start(
                    f"worker{host.label}", "spark-class", "org.apache.spark.deploy.worker.Worker", url, "--host", host.address, "--cores", "1", "--memory", "1g",
                    "--webui-port", str(WORKER_UI_PORT), "--work-dir", str(self.work / f"spark-work{host.label}"), prefix=host.prefix(), env=host.env(),
                )
            )
        for log in logs:
            daemons.wait_for(f"the worker of {log.stem} did not register", lambda log=log: _log_has(log, "Successfully registered with master"), log, timeout)
        self.master_url = url
        return url

    def spark_processes(self) -> dict[str, list[int]]:
        """The Python processes under each worker daemon (its executors' workers), by host label."""
        from benchmarks.driver import descendants

        assert self.daemons is not None
        found: dict[str, list[int]] = {}
        for process, (_, *args) in self.daemons._named.values():  # noqa: SLF001 (ours)
            if "org.apache.spark.deploy.worker.Worker" in args:
                host = self.host_of(process.pid)
                pythons = [pid for pid in descendants(process.pid) if _is_python(pid)]
                found.setdefault(host.label if host else "?", []).extend(pythons)
        return found

    @contextlib.contextmanager
    def capture(self, host: Host | None = None, timeout: float = 30) -> Iterator[Capture]:
        """Captures every frame on ``host``'s veth end (B's by default) until the block ends,
        from a process in its namespace; yields once the capture is running."""
        host = host or self.b
        path = self.work / f"capture-{host.label}-{next(_runs)}.pcap"
        process = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, sys.executable, "-m", "benchmarks.hosts", "capture", host.iface, str(path)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, start_new_session=True,
        )
        self._processes.append(process)
        try:
            assert process.stdout is not None
            ready, _, _ = select.select([process.stdout], [], [], timeout)
            line = process.stdout.readline() if ready else b""
            if line.strip() != b"capturing":
                _stop(process)
                err = process.stderr.read().decode(errors="replace") if process.stderr else ""
                raise RuntimeError(f"the capture on {host.iface} did not start: {line!r} {err}")
            yield Capture(path, host.iface)
        finally:
            _stop(process)


@contextlib.contextmanager
def two_hosts(work: Path) -> Iterator[TwoHosts]:
    """Two namespaced hosts under ``work`` (see the module's doc), removed on the way out.
    HostsUnavailable, before anything is made, if they cannot be made here."""
    why = unavailable()
    if why:
        raise HostsUnavailable(why)
    remove_leftovers()
    hosts = TwoHosts(work, f"{PREFIX}-{os.getpid()}-{next(_runs)}")
    try:
        try:
            hosts.make()
        except subprocess.CalledProcessError as exc:
            raise HostsUnavailable(f"could not make the namespaces: {' '.join(exc.cmd)}: {(exc.stderr or '').strip()}") from None
        yield hosts
    finally:
        hosts.close()


def unavailable() -> str | None:
    """Why two namespaced hosts cannot be made here; None if they may."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"no '{tool}' command (iproute2, util-linux)"
    try:
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close()
    except (OSError, AttributeError) as exc:
        return f"no raw packet sockets for the captures: {exc}"
    probe = f"{PREFIX}-{os.getpid()}-probe-{next(_runs)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"'ip netns add' failed: {made.stderr.strip()}"
    covered = tempfile.mkdtemp(prefix=f"{PREFIX}-probe-")
    try:
        hidden = subprocess.run(["ip", "netns", "exec", probe, "unshare", "--mount", "--propagation", "private", "sh", "-c", HIDE, "hide", covered, "--", "true"], capture_output=True, text=True)
        if hidden.returncode != 0:
            return f"no private mount namespace with a tmpfs in it: {hidden.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
        os.rmdir(covered)
    return None


def remove_leftovers() -> list[str]:
    """Deletes the namespaces (and whatever still runs in them) of runs whose process is gone:
    only names this module makes (``udfh-PID-N-a``/``b``, and its probes). The names deleted."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    removed = []
    for line in listed.splitlines():
        name = line.split(" ", 1)[0]
        match = _NAME.match(name) or re.match(rf"^{PREFIX}-(\d+)-probe-\d+$", name)
        if match is None or _alive(int(match.group(1))):
            continue
        _empty_and_delete(name)
        removed.append(name)
    return removed


# ---- pcap, frames, /proc ----


def read_pcap(path: Path) -> Iterator[tuple[float, bytes]]:
    """(time, frame) of each record of a pcap file (microsecond, little-endian: ``_capture``'s);
    a record still being written is left out."""
    data = path.read_bytes()
    offset = 24
    while offset + 16 <= len(data):
        seconds, micros, kept, _ = struct.unpack_from("<IIII", data, offset)
        if offset + 16 + kept > len(data):
            break
        yield seconds + micros / 1e6, data[offset + 16 : offset + 16 + kept]
        offset += 16 + kept


def tcp_segment(stamp: float, frame: bytes) -> Segment | None:
    """The IPv4 TCP segment an Ethernet frame carries; None if it carries none."""
    if len(frame) < 34 or frame[12:14] != b"\x08\x00":
        return None
    ip = frame[14:]
    header = (ip[0] & 0x0F) * 4
    total = struct.unpack_from("!H", ip, 2)[0]
    if ip[9] != socket.IPPROTO_TCP or len(ip) < header + 20:
        return None
    tcp = ip[header:total] if total else ip[header:]  # total 0: a segment offloaded whole
    offset = (tcp[12] >> 4) * 4
    sport, dport = struct.unpack_from("!HH", tcp, 0)
    return Segment(stamp, socket.inet_ntoa(ip[12:16]), sport, socket.inet_ntoa(ip[16:20]), dport, tcp[13], bytes(tcp[offset:]))


class TcpSocket(NamedTuple):
    local: str
    local_port: int
    remote: str
    remote_port: int
    state: str  # "ESTABLISHED", "LISTEN", ... (others as their hex code)


_STATES = {"01": "ESTABLISHED", "0A": "LISTEN"}


def tcp_sockets(pid: int) -> list[TcpSocket]:
    """The IPv4 TCP sockets process ``pid`` holds open, as its network namespace sees them."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    found = []
    with contextlib.suppress(OSError), open(f"/proc/{pid}/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            if fields[9] in inodes:
                (local, lport), (remote, rport) = (_address(fields[1]), _address(fields[2]))
                found.append(TcpSocket(local, lport, remote, rport, _STATES.get(fields[3], fields[3])))
    return found


def _address(hex_address: str) -> tuple[str, int]:
    address, port = hex_address.split(":")
    return socket.inet_ntoa(struct.pack("<I", int(address, 16))), int(port, 16)


def _netns_of(pid: int) -> tuple[int, int] | None:
    try:
        found = os.stat(f"/proc/{pid}/ns/net")
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _pids_in(netns: str) -> list[int]:
    try:
        found = os.stat(f"/run/netns/{netns}")
    except OSError:
        return []
    wanted = (found.st_dev, found.st_ino)
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and int(entry) != os.getpid() and _netns_of(int(entry)) == wanted]


def _is_python(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            first = cmdline.read().split(b"\0", 1)[0]
    except OSError:
        return False
    return b"python" in os.path.basename(first)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, killed but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _empty_and_delete(netns: str) -> None:
    """Kills whatever still runs in ``netns`` (ours: the namespace is), then deletes it; its
    veth end goes with it, and the pair with that end."""
    deadline = time.monotonic() + 10
    while (pids := _pids_in(netns)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    subprocess.run(["ip", "netns", "del", netns], capture_output=True)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signum)
        try:
            process.wait(10)
            return
        except subprocess.TimeoutExpired:
            pass


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True)


def _iface(run: str, label: str) -> str:
    """A veth end's name (15 characters at most), from the run's."""
    _, pid, index = run.split("-")
    return f"{PREFIX}{pid}.{index}{label}"[-15:]


def _log_has(path: Path, text: str) -> bool:
    try:
        return text in path.read_text(errors="replace")
    except OSError:
        return False


# ---- the capture's process ----

ETH_P_ALL = 0x0003
SNAPLEN = 262144  # an offloaded segment may reach 64 KiB and more


def _capture(iface: str, out: Path) -> None:
    """Writes every frame seen on ``iface`` to ``out`` (pcap) until SIGTERM or SIGINT; says
    "capturing" on stdout once its socket is bound."""
    stopping = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.append(True))
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind((iface, 0))
    sock.settimeout(0.1)
    with open(out, "wb") as pcap:
        pcap.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, SNAPLEN, 1))  # 1: Ethernet
        pcap.flush()
        print("capturing", flush=True)
        while True:
            if stopping:
                sock.setblocking(False)  # what is queued still, then the end
            try:
                frame = sock.recv(SNAPLEN)
            except TimeoutError:
                continue
            except BlockingIOError:
                break
            now = time.time()
            pcap.write(struct.pack("<IIII", int(now), int(now % 1 * 1e6), len(frame), len(frame)) + frame)
            pcap.flush()


def main(argv: Sequence[str]) -> int:
    if len(argv) == 3 and argv[0] == "capture":
        _capture(argv[1], Path(argv[2]))
        return 0
    if len(argv) == 1 and argv[0] == "clean":
        for name in remove_leftovers():
            print(f"deleted {name}")
        return 0
    print("usage: python -m benchmarks.hosts capture IFACE FILE | clean", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
