"""Processes of a cluster on this machine: a launcher run to its end, free ports, cluster specs and TF_CONFIG, and
tasks started together that never outlive us."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tfperf.cluster.errors import ClusterError
from tfperf.measure.processes import child_env


def launch(cmd: Sequence, env: Mapping[str, str] | None = None, timeout: float = 1800) -> str:
    """Run a launcher (horovodrun) to its end; its stdout, or a ClusterError naming what failed. Python's folder
    leads PATH: horovodrun starts `python` from it."""
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


def tf_config(cluster: Mapping[str, Sequence[str]], task_type: str, index: int) -> str:
    """The TF_CONFIG value that tells one process its cluster and its own place in it."""
    return json.dumps({"cluster": dict(cluster), "task": {"type": task_type, "index": index}})


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
