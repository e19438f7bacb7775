"""Where a recipe's cluster runs: this machine, or hosts emulated on it (`tfperf.cluster.hosts`) joined by a shaped
link, each task on its host."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from tfperf.cluster.errors import ClusterError
from tfperf.cluster.processes import free_ports, local_cluster


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
