"""The line `tfperf serve` prints once it listens, and its reading by whoever started the server: written and
parsed here only, so that the two cannot drift apart."""

from __future__ import annotations

import re

_READY = re.compile(r"^serving .* on http://[^ ]+:(?P<rest>\d+) .* and grpc://[^ ]+:(?P<grpc>\d+)")


def ready_line(name: str, version: int, describe: str, host: str, ports: tuple[int, int], worker: str = "") -> str:
    """The line `tfperf serve` prints once it listens (one per worker process), read back by `ready_ports`."""
    return (f"serving {name} version {version} ({describe}) on http://{host}:{ports[0]} (TF Serving REST "
            f"/v1/models/{name}, KServe v2 /v2/models/{name}) and grpc://{host}:{ports[1]}"
            f"{' ' + worker if worker else ''}\n")


def ready_ports(line: str) -> tuple[int, int] | None:
    """The REST and gRPC ports a `ready_line` names, or None for any other line."""
    match = _READY.match(line)
    return (int(match["rest"]), int(match["grpc"])) if match else None
