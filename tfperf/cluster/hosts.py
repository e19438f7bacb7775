"""Hosts on one Linux machine that behave like hosts on a network: each a network namespace with its own address
on a bridge, its link shaped with `tc` (a token bucket each way: full duplex at the rate asked), its processes
pinned to cores of its own, and, when asked, an sshd of its own so that launchers that ssh into hosts
(horovodrun -H) work unchanged. What it is not: no NIC offloads or RDMA, the shaping runs on the same cores
as the work, and the kernels here have no sch_netem, so added delay works only where netem exists.

Setup and teardown are idempotent: `Hosts` removes what it made when its block ends however it ends, and a
set left by a killed run (same prefix) is removed by the next. Traffic stays inside the namespaces it made.
Needs root and iproute2 (`ip`, `tc`); `available()` says in one line what is missing.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tfperf.cluster.errors import ClusterError

# Link presets by name: a rate in bits per second.
PRESETS = {"100mbit": 100e6, "1gbit": 1e9, "10gbit": 10e9, "25gbit": 25e9}
PREFIX = "tfph"  # every namespace, bridge and veth this module makes starts with it
SUBNET = "10.77.0"
LAUNCHER = f"{SUBNET}.254"  # the root namespace's address on the bridge (where a launcher runs)
KEEPALIVE_S = 2  # ssh's keepalive interval: a session to a lost host ends after 3 unanswered (about 6 s)


def parse_link(text: str) -> Link:
    """'1gbit', '200mbit', '10gbit,50us', '1e9': a rate (and a one-way delay), or ValueError in one line."""
    rate_text, _, delay_text = text.strip().lower().partition(",")
    rate = PRESETS.get(rate_text)
    if rate is None:
        match = re.fullmatch(r"([0-9.]+(?:e[0-9]+)?)\s*(k|m|g)?(?:bit|bps|b)?", rate_text)
        if not match:
            raise ValueError(f"--link {text!r}: give a rate such as 1gbit, 200mbit or 10gbit (presets: "
                             f"{', '.join(PRESETS)}), and optionally a delay: 1gbit,50us")
        rate = float(match[1]) * {None: 1, "k": 1e3, "m": 1e6, "g": 1e9}[match[2]]
    delay = None
    if delay_text:
        match = re.fullmatch(r"([0-9.]+)\s*(us|ms|s)", delay_text.strip())
        if not match:
            raise ValueError(f"--link {text!r}: the delay after the comma must read like 50us or 1ms")
        delay = float(match[1]) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[match[2]]
    if not 1e5 <= rate <= 1e12:
        raise ValueError(f"--link {text!r}: a rate between 100kbit and 1000gbit")
    return Link(rate, delay, text.strip())


def available() -> str | None:
    """None when hosts can be made here; else why not, in one line (not root, no iproute2)."""
    if os.geteuid() != 0:
        return "emulated hosts need root (network namespaces and tc): run as root, or without them over loopback"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"emulated hosts need iproute2's `{tool}`: install iproute2 (make install does, as root)"
    return None


def netem_available() -> bool:
    """True when the kernel has sch_netem (added delay); these machines' kernels have not."""
    if Path("/sys/module/sch_netem").exists():
        return True
    return subprocess.run(["modprobe", "-n", "sch_netem"], capture_output=True).returncode == 0 if shutil.which(
        "modprobe") else False


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise HostsError(f"ip {' '.join(args)} failed: {done.stderr.strip()[:200]}")
    return done


def _tc(*args: str) -> None:
    done = subprocess.run(["tc", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise HostsError(f"tc {' '.join(args)} failed: {done.stderr.strip()[:200]}")


def stale(prefix: str = PREFIX) -> list[str]:
    """The namespaces a killed run with this prefix left behind."""
    listed = _ip("netns", "list", check=False).stdout.split()
    return [name for name in listed if re.fullmatch(rf"{prefix}\d+", name)]


def clean(prefix: str = PREFIX) -> list[str]:
    """Remove every namespace (and its processes), veth, bridge and hosts file this prefix names: idempotent; what
    was removed."""
    removed = []
    for name in stale(prefix):
        pids = _ip("netns", "pids", name, check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        _ip("netns", "delete", name, check=False)
        removed.append(name)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        match = re.match(rf"\d+: ({prefix}[a-z0-9]*)[@:]", line)
        if match:
            _ip("link", "delete", match[1], check=False)
            removed.append(match[1])
    for folder in Path("/etc/netns").glob(f"{prefix}*") if Path("/etc/netns").is_dir() else []:
        shutil.rmtree(folder, ignore_errors=True)
    return removed


class HostsError(ClusterError):
    """Hosts that could not be made or used; the message says which command failed and why. A ClusterError, so
    that a recipe whose cluster runs on emulated hosts ends in that one line, not a traceback."""


@dataclasses.dataclass(frozen=True)
class Link:
    """A link's rate (bits/s) and one-way delay (None: none added), and how it was asked for."""

    bits_per_s: float
    delay_s: float | None = None
    text: str = ""

    def __str__(self) -> str:
        return self.text or f"{self.bits_per_s / 1e9:g} Gbit/s"

    @property
    def bucket_bytes(self) -> int:
        """tc tbf's bucket for this rate: a rate's worth of a timer tick, and a whole 64 KiB GSO segment. It fills
        while the link idles and lets that much through at once, which a wire does not: the ring model is told."""
        return max(64 * 1024, int(self.bits_per_s) // 8 // 250)


@dataclasses.dataclass(frozen=True)
class Measured:
    """A link as a plain socket measured it: bandwidth one way (bits/s) and the round trip of a small message."""

    bits_per_s: float
    rtt_s: float


class Hosts:
    """`count` hosts h0..hN-1 joined by `link`, in `with Hosts(2, parse_link("1gbit")) as hosts:`."""

    def __init__(self, count: int, link: Link, *, prefix: str = PREFIX, ssh: bool = False,
                 cores: Sequence[Sequence[int]] | None = None):
        if count < 1 or count > 200:
            raise ValueError("between 1 and 200 hosts")
        self.count, self.link, self.prefix, self.ssh = count, link, prefix, ssh
        usable = sorted(os.sched_getaffinity(0))
        # Each host its own cores where there are enough; else they share them (said by `shared_cores`).
        self.cores = [list(c) for c in cores] if cores else [[usable[i % len(usable)]] for i in range(count)]
        self.shared_cores = len({c for cs in self.cores for c in cs}) < sum(len(cs) for cs in self.cores)
        self.names = [f"{prefix}{i}" for i in range(count)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(count)]
        self.bridge = f"{prefix}br"
        self.dir = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
        self.key: Path | None = None
        self.delay_applied = False
        self._sshd: list[subprocess.Popen] = []

    # setup and teardown -------------------------------------------------------------------------------

    def __enter__(self) -> Hosts:
        why = available()
        if why:
            raise HostsError(why)
        clean(self.prefix)  # what a killed run left
        try:
            self._up()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _up(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{LAUNCHER}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        hostname = socket.gethostname()
        for i, (name, address) in enumerate(zip(self.names, self.addresses)):
            outer, inner = f"{self.prefix}v{i}", f"{self.prefix}i{i}"
            _ip("netns", "add", name)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", name)
            # Every host's interface has one name: Horovod requires it (--network-interfaces eth0).
            _ip("-n", name, "link", "set", inner, "name", "eth0")
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", name, "link", "set", "lo", "up")
            _ip("link", "set", outer, "master", self.bridge)
            _ip("link", "set", outer, "up")
            # Full duplex at the rate: a token bucket on the host's egress, and one on the bridge's side toward it.
            self._shape(["ip", "netns", "exec", name], "eth0")
            self._shape([], outer)
            # Every namespace shares the machine's hostname, which resolves to 127.0.0.1; `ip netns exec` mounts
            # /etc/netns/NAME/hosts over /etc/hosts, so each resolves it to its own address (Gloo dials it).
            hosts = Path("/etc/netns") / name / "hosts"
            hosts.parent.mkdir(parents=True, exist_ok=True)
            hosts.write_text(f"127.0.0.1 localhost\n{address} {hostname} {name}\n" +
                             "".join(f"{a} {n}\n" for n, a in zip(self.names, self.addresses) if n != name))
        if self.ssh:
            self._start_sshd()

    def _shape(self, inside: list[str], device: str) -> None:
        rate, burst = int(self.link.bits_per_s), self.link.bucket_bytes
        command = [*inside, "tc", "qdisc", "add", "dev", device, "root"]
        if self.link.delay_s:
            if not netem_available():
                raise HostsError(f"--link {self.link}: this kernel has no sch_netem, so no delay can be added; give "
                                 f"the rate alone")
            done = subprocess.run([*command, "handle", "1:", "netem", "delay", f"{self.link.delay_s * 1e6:.0f}us"],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise HostsError(f"netem failed: {done.stderr.strip()[:200]}")
            command = [*inside, "tc", "qdisc", "add", "dev", device, "parent", "1:1", "handle", "10:"]
            self.delay_applied = True
        done = subprocess.run([*command, "tbf", "rate", f"{rate}bit", "burst", str(burst), "latency", "50ms"],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise HostsError(f"tc tbf on {device} failed: {done.stderr.strip()[:200]}")

    def _start_sshd(self) -> None:
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        if not Path(sshd).exists():
            raise HostsError("ssh into the hosts needs openssh-server (apt-get install openssh-server; make install "
                             "does, as root)")
        self.key = self.dir / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)], check=True)
        host_key = self.dir / "host_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
        authorized = self.dir / "authorized_keys"
        authorized.write_text(Path(f"{self.key}.pub").read_text())
        os.chmod(authorized, 0o600)
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation folder
        # Launchers call `ssh HOST ...` with their own options (horovodrun adds StrictHostKeyChecking=no): an `ssh`
        # first on PATH adds the run's key, and keeps known_hosts untouched. With keepalives (`env(keepalive=True)`)
        # the session of a host that went away ends within seconds (by default it waits for TCP, minutes): Horovod
        # Elastic's driver waits for every worker's command to end before it goes on without them.
        config = self.dir / "ssh_config"
        config.write_text(f"Host *\n  IdentityFile {self.key}\n  StrictHostKeyChecking no\n  UserKnownHostsFile "
                          f"/dev/null\n  LogLevel ERROR\n  BatchMode yes\n")
        keepalive = f"-o ServerAliveInterval={KEEPALIVE_S} -o ServerAliveCountMax=3"
        wrapper = self.dir / "bin" / "ssh"
        wrapper.parent.mkdir(exist_ok=True)
        wrapper.write_text(f"#!/bin/sh\nexec {shutil.which('ssh')} -F {config} ${{TFPERF_SSH_KEEPALIVE:+{keepalive}}} "
                           f"\"$@\"\n")
        os.chmod(wrapper, 0o755)
        for i, (name, address) in enumerate(zip(self.names, self.addresses)):
            config = self.dir / f"sshd_{name}.conf"
            config.write_text(f"ListenAddress {address}\nPort 22\nHostKey {host_key}\nAuthorizedKeysFile {authorized}\n"
                              f"PermitRootLogin prohibit-password\nPasswordAuthentication no\nUsePAM no\n"
                              f"StrictModes no\nPidFile {self.dir}/sshd_{name}.pid\nAcceptEnv *\n"
                              f"LogLevel ERROR\n")
            self._sshd.append(subprocess.Popen(self.command(i, [sshd, "-D", "-e", "-f", str(config)]),
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 20
        for address in self.addresses:
            while subprocess.run(["ssh", *self.ssh_options(), address, "true"], capture_output=True).returncode:
                if time.monotonic() > deadline:
                    raise HostsError(f"sshd on {address} did not answer within 20 s")
                time.sleep(0.1)

    def env(self, *, keepalive: bool = False) -> dict[str, str]:
        """The environment to run a launcher in (`command(0, ...)`): this Python's folder and the run's ssh first
        on PATH, so that `horovodrun -H` reaches the hosts with the run's key and finds the same Python there;
        with `keepalive`, ssh sessions to a host that stops answering end after about 3 * KEEPALIVE_S seconds."""
        folders = [str(Path(sys.executable).parent), *([str(self.dir / "bin")] if self.ssh else [])]
        env = {k: v for k, v in os.environ.items() if k != "TFPERF_SSH_KEEPALIVE"}
        return {**env, "PATH": os.pathsep.join([*folders[::-1], os.environ.get("PATH", "")]),
                **({"TFPERF_SSH_KEEPALIVE": "1"} if keepalive else {})}

    def horovodrun(self, argv: Sequence[str], *, per_host: int = 1, on: Sequence[int] | None = None,
                   options: Sequence[str] = ()) -> list[str]:
        """horovodrun over every host (or those `on`), `per_host` ranks each, with Gloo on their eth0, launched
        from host 0 as one launches from a machine of the cluster (its rendezvous address is then on the hosts'
        network)."""
        on = range(self.count) if on is None else on
        hosts = ",".join(f"{self.addresses[i]}:{per_host}" for i in on)
        # On host 0 alone horovodrun runs locally, over 127.0.0.1, which eth0 does not carry.
        interfaces = [] if list(on) == [0] else ["--network-interfaces", "eth0"]
        return self.command(0, [self._horovodrun, "-np", str(per_host * len(on)), "-H", hosts, "--gloo",
                                *interfaces, "--start-timeout", "120", *options, *argv])

    def elastic_horovodrun(self, argv: Sequence[str], *, on: Sequence[int] | None = None, launcher: int = 0,
                           min_np: int = 1, options: Sequence[str] = ()) -> list[str]:
        """Horovod Elastic over the hosts `on` (default all), one rank each, launched from host `launcher` (a head
        node of its own keeps the driver reachable whichever host is lost): the hosts are discovered by a script
        that lists those whose sshd answers, so that a host whose link goes down leaves the job."""
        on = list(range(self.count) if on is None else on)
        script = self.dir / "discover_hosts.sh"
        # Each host's sshd, probed from the launcher with a 1 s limit: a lost host is dropped at the next discovery.
        script.write_text("#!/bin/bash\n" + "".join(
            f"timeout 1 bash -c '</dev/tcp/{self.addresses[i]}/22' 2>/dev/null && echo {self.addresses[i]}:1\n"
            for i in on) + "exit 0\n")  # a host that does not answer is left out, not an error (Horovod would stop)
        os.chmod(script, 0o755)
        return self.command(launcher, [self._horovodrun, "-np", str(len(on)), "--min-np", str(min_np), "--max-np",
                                       str(len(on)), "--host-discovery-script", str(script), "--network-interfaces",
                                       "eth0", "--start-timeout", "120", *options, *argv])

    @property
    def _horovodrun(self) -> str:
        return str(Path(sys.executable).parent / "horovodrun")

    def cut(self, host: int, *, down: bool = True) -> None:
        """Take host `host` off the network (its link down), as a host that fails or is unplugged; or, with
        down=False, put it back."""
        _ip("link", "set", f"{self.prefix}v{host}", "down" if down else "up")

    def reachable(self, host: int, *, from_host: int = 0, timeout: float = 1.0) -> bool:
        """Whether host `host`'s sshd (or, without ssh, its address) answers from `from_host` within `timeout`."""
        probe = f"import socket; socket.create_connection(('{self.addresses[host]}', 22), {timeout}).close()"
        done = subprocess.run(self.command(from_host, [sys.executable, "-c", probe]), capture_output=True,
                              timeout=timeout + 30)
        return done.returncode == 0

    def ssh_options(self) -> list[str]:
        """ssh's options for the hosts: the run's key, no prompts, no known_hosts left behind."""
        return ["-i", str(self.key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "LogLevel=ERROR", "-o", "BatchMode=yes"]

    def close(self) -> None:
        """Stop the sshds, remove the namespaces, links and files: idempotent."""
        for proc in self._sshd:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        clean(self.prefix)
        shutil.rmtree(self.dir, ignore_errors=True)

    # using them ---------------------------------------------------------------------------------------

    def command(self, host: int, argv: Sequence[str]) -> list[str]:
        """`argv` as run in host `host`'s namespace, on its cores."""
        cores = ",".join(map(str, self.cores[host]))
        return ["ip", "netns", "exec", self.names[host], "taskset", "-c", cores, *map(str, argv)]

    def run(self, host: int, argv: Sequence[str], **options) -> subprocess.Popen:
        """Start `argv` in host `host` (its network, its cores); the caller waits for it."""
        return subprocess.Popen(self.command(host, argv), **options)

    def measure(self, a: int = 0, b: int = 1, megabytes: int = 32, pings: int = 200) -> Measured:
        """The link from host a to host b as a plain TCP socket sees it: bytes a sends b in a second, and the
        median round trip of a 1-byte message (TCP_NODELAY)."""
        server = self.run(b, [sys.executable, "-c", _SINK, self.addresses[b]], stdout=subprocess.PIPE, text=True)
        try:
            port = server.stdout.readline().split()[-1]  # "ready PORT"
            done = subprocess.run(self.command(a, [sys.executable, "-c", _SOURCE, self.addresses[b], port,
                                                   str(megabytes), str(pings)]), capture_output=True, text=True,
                                  timeout=300)
            if done.returncode != 0:
                raise HostsError(f"the link test from {self.names[a]} to {self.names[b]} failed: "
                                 f"{done.stderr.strip()[-200:]}")
            bits, rtt = (float(v) for v in done.stdout.split())
            return Measured(bits, rtt)
        finally:
            server.kill()
            server.wait()


class Loopback(Hosts):
    """`count` 'hosts' that are this machine over loopback, each on cores of its own: what runs where hosts cannot
    be made (not root), with the same interface and no link shaped (`link` None)."""

    def __init__(self, count: int, *, cores: Sequence[Sequence[int]] | None = None):
        super().__init__(count, Link(0.0, None, "loopback"), cores=cores)
        self.link = None
        self.names = [f"loopback{i}" for i in range(count)]
        self.addresses = ["127.0.0.1"] * count

    def __enter__(self) -> Loopback:
        return self

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def command(self, host: int, argv: Sequence[str]) -> list[str]:
        return ["taskset", "-c", ",".join(map(str, self.cores[host])), *map(str, argv)]

    def horovodrun(self, argv: Sequence[str], *, per_host: int = 1, on: Sequence[int] | None = None,
                   options: Sequence[str] = ()) -> list[str]:
        n = per_host * (self.count if on is None else len(on))
        return [self._horovodrun, "-np", str(n), "-H", f"localhost:{n}", "--gloo", "--start-timeout", "120",
                *options, *argv]


# A sink that reads what is sent and echoes 1-byte pings; a source that sends `megabytes` then pings.
_SINK = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 0)); s.listen(1); print("ready", s.getsockname()[1], flush=True)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
size = int.from_bytes(c.recv(8, socket.MSG_WAITALL), "little"); got = 0
while got < size:
    got += len(c.recv(1 << 20))
c.sendall(b"k")
while True:
    b = c.recv(1)
    if not b:
        break
    c.sendall(b)
"""
_SOURCE = """
import socket, statistics, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
size = int(sys.argv[3]) << 20; block = b"x" * (1 << 20)
t0 = time.perf_counter(); s.sendall(size.to_bytes(8, "little"))
for _ in range(size >> 20):
    s.sendall(block)
s.recv(1); seconds = time.perf_counter() - t0
rtts = []
for _ in range(int(sys.argv[4])):
    t = time.perf_counter(); s.sendall(b"p"); s.recv(1); rtts.append(time.perf_counter() - t)
print(size * 8 / seconds, statistics.median(rtts))
"""
