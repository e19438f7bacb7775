"""Local multi-process clusters for tf.distribute recipes: ports, TF_CONFIG, and processes that never outlive us;
placed on this machine or on hosts emulated on it (`tfperf.cluster.hosts`)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tfperf.cluster.errors import ClusterError
from tfperf.measure.processes import child_env


def ring_t2(n: int, size: float, alpha: float, beta: float) -> float:
    """Ring all-reduce of `size` bytes over n ranks: 2(n-1) steps, each a message of size/n bytes (latency alpha
    seconds, bandwidth beta bytes/s): 2(n-1)/n * size/beta + 2(n-1) alpha."""
    return 0.0 if n == 1 else 2 * (n - 1) * (alpha + size / n / beta)


def exposed_t2(t1: float, readiness: Sequence[tuple[float, float]], n: int, alpha: float, beta: float, *,
               backward_share: float = 2 / 3) -> float:
    """The all-reduce time a step on n hosts adds to t1 when each gradient is all-reduced as soon as backpropagation
    has made it and the link is free (wait-free backpropagation, as Horovod does from a graph: every gradient that
    waits when the link frees goes in one fused message). `readiness`: (share of the backward pass done, bytes) per
    gradient; the backward pass is the last `backward_share` of t1 (forward one matmul per layer, backward two).
    With every gradient ready only at the end it is the ring model's t2."""
    start = t1 * (1 - backward_share)
    ready = sorted((start + share * t1 * backward_share, size) for share, size in readiness)
    clock, i = 0.0, 0
    while i < len(ready):
        clock = max(clock, ready[i][0])
        fused = 0.0
        while i < len(ready) and ready[i][0] <= clock:
            fused += ready[i][1]
            i += 1
        clock += ring_t2(n, fused, alpha, beta)
    return max(0.0, clock - t1)


def launch(cmd: Sequence, env: Mapping[str, str] | None = None, timeout: float = 1800) -> str:
    """Run a launcher (horovodrun) to its end; its stdout, or a ClusterError naming what failed. Python's folder
    leads PATH: horovodrun starts `python` from it."""
    import sys

    env = dict(env or os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    try:
        proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"{' '.join(map(str, cmd[:4]))} ... did not finish within {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise ClusterError(f"{' '.join(map(str, cmd[:4]))} ... exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return proc.stdout


def free_ports(count: int) -> list[int]:
    """`count` TCP ports that were free a moment ago (bound together, so they are distinct)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def local_cluster(tasks: Mapping[str, int]) -> dict[str, list[str]]:
    """A cluster spec on localhost, e.g. {"worker": 2, "ps": 1} -> {"worker": ["localhost:p", ...], ...}."""
    ports = iter(free_ports(sum(tasks.values())))
    return {role: [f"localhost:{next(ports)}" for _ in range(n)] for role, n in tasks.items() if n}


@contextlib.contextmanager
def placed(link: str | None, count: int, host_of: Callable[[str, int], int]) -> Iterator[Placement]:
    """Where a recipe's cluster runs: this machine (no `link`), or `count` emulated hosts joined by `link`
    ('1gbit'), each task on host `host_of(job, index)`, the link measured first; down when the block ends."""
    if not link:
        yield Placement()
        return
    from tfperf.cluster.hosts import Hosts, available, parse_link

    why = available()
    if why:
        raise ClusterError(why)
    with Hosts(count, parse_link(link)) as hosts:
        measured = hosts.measure(0, 1) if count > 1 else None
        yield Placement(hosts, host_of, {
            "asked_mbit_s": hosts.link.bits_per_s / 1e6, "addresses": ", ".join(hosts.addresses),
            **({"measured_mbit_s": measured.bits_per_s / 1e6, "rtt_us": measured.rtt_s * 1e6} if measured else {})})


def tf_config(cluster: Mapping[str, Sequence[str]], task_type: str, index: int) -> str:
    """The TF_CONFIG value that tells one process its cluster and its own place in it."""
    return json.dumps({"cluster": dict(cluster), "task": {"type": task_type, "index": index}})


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where each task of a cluster runs: on this machine (no hosts), or on host `host_of(job, index)` of
    emulated `hosts`, at its address; `link` holds the link as measured (asked and measured Mbit/s, round trip)."""

    hosts: Any = None  # tfperf.cluster.hosts.Hosts
    host_of: Callable[[str, int], int] = lambda job, index: 0
    link: Mapping[str, Any] | None = None

    def cluster(self, tasks: Mapping[str, int]) -> dict[str, list[str]]:
        """A cluster spec, e.g. {"worker": 2, "ps": 1} -> {"worker": ["10.77.0.1:p", ...], ...}."""
        if self.hosts is None:
            return local_cluster(tasks)
        ports = iter(free_ports(sum(tasks.values())))  # distinct, so tasks sharing a host do not collide
        return {role: [f"{self.hosts.addresses[self.host_of(role, i)]}:{next(ports)}" for i in range(n)]
                for role, n in tasks.items() if n}

    def command(self, job: str, index: int, argv: Sequence) -> list[str]:
        """`argv` as task (job, index) runs it: unchanged here, or in its host's namespace, on its cores."""
        if self.hosts is None:
            return [str(a) for a in argv]
        return self.hosts.command(self.host_of(job, index), argv)

    def where(self, job: str, index: int) -> str:
        """The task's host, for messages and records: 'localhost', or the host's address."""
        return "localhost" if self.hosts is None else self.hosts.addresses[self.host_of(job, index)]


class LocalCluster:
    """Processes started together, logged to files, waited for with a deadline, killed if anything fails."""

    def __init__(self, log_dir: Path | str):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.tasks: list[tuple[str, subprocess.Popen, Path]] = []

    def start(self, name: str, cmd: Sequence, env: Mapping[str, str]) -> subprocess.Popen:
        """Start one task; its stdout and stderr go to <log_dir>/<name>.log."""
        log = self.log_dir / f"{name}.log"
        with open(log, "w") as f:
            proc = subprocess.Popen([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=child_env({**os.environ, **env}))
        self.tasks.append((name, proc, log))
        return proc

    def wait(self, names: Sequence[str] | None = None, timeout: float = 600) -> None:
        """Wait for the named tasks (default: all) to exit 0; raise ClusterError on a failure or the deadline."""
        deadline = time.monotonic() + timeout
        pending = [t for t in self.tasks if names is None or t[0] in names]
        while pending:
            for name, proc, log in list(pending):
                code = proc.poll()
                if code is None:
                    continue
                pending.remove((name, proc, log))
                if code != 0:
                    raise ClusterError(f"task {name} exited with {code}; last lines of {log}:\n{self.tail(log)}")
            if pending and time.monotonic() > deadline:
                stuck = ", ".join(name for name, _, _ in pending)
                raise ClusterError(f"task(s) {stuck} did not finish within {timeout:.0f} s; logs in {self.log_dir}")
            time.sleep(0.05)

    def output(self, name: str) -> str:
        """Everything a task has logged so far."""
        return next(log for n, _, log in self.tasks if n == name).read_text()

    @staticmethod
    def tail(log: Path, lines: int = 15) -> str:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        for _, proc, _ in self.tasks:  # servers (ps, workers of a coordinator) run until killed
            if proc.poll() is None:
                proc.kill()
                proc.wait()
