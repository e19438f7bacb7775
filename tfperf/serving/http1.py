"""A small HTTP/1.1 client for load, on an asyncio event loop: each request written once as the bytes that go on the
wire, each answer read by a Protocol that knows only what a load test needs (the status, the headers, a body of
Content-Length or chunked), over kept-alive connections opened as requests need them.

aiohttp's client spends about 200 us of CPU a request in Python (its request and response objects, a task per
call); on the server's own machine that is CPU the server lacks, and LoadGen's open loop, which sends from
Python, then measured the client (issue 49). Here a request costs a write of prepared bytes and a parse of the
answer's head (`benchmarks/load_client_cost.py`).

`Pool.send(wire, done)` is called on the loop's thread; `done(answer_or_exception)` is called there too.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import Callable, Mapping

MOST_CONNECTIONS = 256  # requests beyond this many at once wait in the pool for a connection to come free
HEAD_END = b"\r\n\r\n"


@dataclasses.dataclass(frozen=True)
class Answer:
    """One HTTP answer: its status, its headers (names in lower case) and its body."""

    status: int
    headers: dict[str, str]
    body: bytes


class HTTPError(Exception):
    """An answer that is not HTTP/1.x, or a connection that closed or stalled before its answer was complete."""


def wire(method: str, host: str, port: int, path: str, body: bytes = b"",
         headers: Mapping[str, str] | None = None) -> bytes:
    """One request as the bytes that go on the wire: request line, headers and body in one write (written apart,
    the body waits for the peer's delayed ACK under Nagle's algorithm)."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    given = {k.lower() for k in (headers or {})}
    if body and "content-type" not in given:
        lines.append("Content-Type: application/json")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items() if k.lower() not in ("host", "content-length")]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _head(raw: bytes) -> tuple[int, dict[str, str], bool]:
    """An answer's status, headers and whether its connection stays open for the next request."""
    lines = raw.decode("latin-1").split("\r\n")
    status = lines[0].split(" ", 2)
    if len(status) < 2 or not status[0].startswith("HTTP/1.") or not status[1].isdigit():
        raise HTTPError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    # HTTP/1.1 keeps a connection unless told to close it; HTTP/1.0 closes it unless told to keep it.
    connection = headers.get("connection", "").lower()
    kept = connection != "close" if status[0] != "HTTP/1.0" else connection == "keep-alive"
    return int(status[1]), headers, kept


class _Connection(asyncio.Protocol):
    """One kept-alive connection: a request at a time, its answer read as it arrives."""

    def __init__(self, pool: Pool):
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.done: Callable | None = None  # the request in flight's callback
        self.sent_at = 0.0
        self.head: tuple[int, dict[str, str], bool] | None = None
        self.lost = False
        self.length: int | None = None  # the body's length once known (None: chunked or until close)
        self.chunks: list[bytes] | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def send(self, data: bytes, done: Callable) -> None:
        self.done, self.sent_at = done, time.monotonic()
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        try:
            while self.done is not None and self._parse():
                pass
        except HTTPError as exc:
            self._fail(exc)

    def _parse(self) -> bool:
        """Read what the buffer holds of the answer; True when an answer was completed."""
        if self.head is None:
            end = self.buffer.find(HEAD_END)
            if end < 0:
                return False
            self.head = _head(bytes(self.buffer[:end]))
            del self.buffer[:end + 4]
            headers = self.head[1]
            if "chunked" in headers.get("transfer-encoding", "").lower():
                self.length, self.chunks = None, []
            elif "content-length" in headers:
                self.length = int(headers["content-length"])
            elif self.head[0] in (204, 304) or 100 <= self.head[0] < 200:
                self.length = 0
            else:
                self.length = None  # the body runs until the server closes: read in connection_lost
        if self.chunks is not None:
            return self._parse_chunks()
        if self.length is None or len(self.buffer) < self.length:
            return False
        body = bytes(self.buffer[:self.length])
        del self.buffer[:self.length]
        self._complete(body)
        return True

    def _parse_chunks(self) -> bool:
        while True:
            end = self.buffer.find(b"\r\n")
            if end < 0:
                return False
            size = int(bytes(self.buffer[:end]).split(b";")[0], 16)
            if size == 0:  # the last chunk, then trailers up to an empty line
                trailer_end = self.buffer.find(HEAD_END, end) if self.buffer[end:end + 4] != HEAD_END else end
                if trailer_end < 0:
                    return False
                del self.buffer[:trailer_end + 4]
                self._complete(b"".join(self.chunks))
                return True
            if len(self.buffer) < end + 2 + size + 2:
                return False
            self.chunks.append(bytes(self.buffer[end + 2:end + 2 + size]))
            del self.buffer[:end + 2 + size + 2]

    def _complete(self, body: bytes) -> None:
        status, headers, kept = self.head
        done, self.done, self.head, self.length, self.chunks = self.done, None, None, None, None
        if kept and not self.lost:
            self.pool._idle(self)
        elif not self.lost:
            self.transport.close()  # connection_lost then takes it out of the pool
        done(Answer(status, headers, body))

    def _fail(self, exc: Exception) -> None:
        done, self.done = self.done, None
        if self.transport is not None:
            self.transport.close()
        if done is not None:
            done(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.pool._lost(self)
        if self.done is not None and self.head is not None and self.length is None and self.chunks is None:
            self._complete(bytes(self.buffer))  # a body that ran until the server closed
        elif self.done is not None:
            self._fail(HTTPError("the connection closed before the answer was complete"
                                 + (f" ({type(exc).__name__}: {exc})" if exc else "")))


class Pool:
    """Kept-alive connections to one host and port, opened as requests need them (up to `most`), on `loop`; a
    request that waits longer than `timeout_s` for its answer fails with HTTPError and its connection closes."""

    def __init__(self, loop: asyncio.AbstractEventLoop, host: str, port: int, *, most: int = MOST_CONNECTIONS,
                 timeout_s: float = 60.0):
        self.loop, self.host, self.port, self.most, self.timeout_s = loop, host, port, most, timeout_s
        self.free: list[_Connection] = []
        self.busy: set[_Connection] = set()
        self.opening = 0
        self.waiting: collections.deque[tuple[bytes, Callable]] = collections.deque()
        self.closed = False
        self._watch = None

    def send(self, data: bytes, done: Callable) -> None:
        """Send `data` (`wire`'s bytes) on a free connection, or once one is free; `done(answer or exception)`
        is called on the loop's thread when it is answered. Call on the loop's thread."""
        if self.closed:
            done(HTTPError("the client is closed"))
            return
        if self.free:
            connection = self.free.pop()
            self.busy.add(connection)
            connection.send(data, done)
        else:
            self.waiting.append((data, done))
            if len(self.busy) + self.opening < self.most and self.opening < len(self.waiting):
                self.opening += 1
                self.loop.create_task(self._open())
        if self._watch is None:
            self._watch = self.loop.call_later(1.0, self._timeouts)

    async def request(self, data: bytes) -> Answer:
        """`send` as a coroutine: the answer, or the exception raised."""
        answered = self.loop.create_future()
        self.send(data, lambda found: answered.set_exception(found) if isinstance(found, BaseException)
                  else answered.set_result(found))
        return await answered

    async def _open(self) -> None:
        try:
            _, connection = await self.loop.create_connection(lambda: _Connection(self), self.host, self.port)
        except OSError as exc:
            self.opening -= 1
            if not self.busy and not self.opening:  # nothing will free a connection: the waiting fail now
                while self.waiting:
                    self.waiting.popleft()[1](exc)
            return
        self.opening -= 1
        self._idle(connection)

    def _idle(self, connection: _Connection) -> None:
        self.busy.discard(connection)
        if self.waiting and not self.closed:
            self.busy.add(connection)
            connection.send(*self.waiting.popleft())
        else:
            self.free.append(connection)

    def _lost(self, connection: _Connection) -> None:
        self.busy.discard(connection)
        if connection in self.free:
            self.free.remove(connection)
        if self.waiting and not self.closed and len(self.busy) + self.opening < self.most:
            self.opening += 1
            self.loop.create_task(self._open())

    def _timeouts(self) -> None:
        self._watch = None
        late = time.monotonic() - self.timeout_s
        for connection in [c for c in self.busy if c.done is not None and c.sent_at < late]:
            connection._fail(HTTPError(f"no answer within {self.timeout_s:g} s"))
        if self.busy and not self.closed:
            self._watch = self.loop.call_later(1.0, self._timeouts)

    def close(self) -> None:
        """Close every connection; requests still waiting fail. Call on the loop's thread."""
        self.closed = True
        if self._watch is not None:
            self._watch.cancel()
        for connection in [*self.free, *self.busy]:
            if connection.transport is not None:
                connection.transport.close()
        while self.waiting:
            self.waiting.popleft()[1](HTTPError("the client is closed"))
