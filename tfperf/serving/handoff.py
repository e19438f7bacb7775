"""Connections to the REST port dealt to worker processes in turn, by the process that accepts them.

Worker processes that each listen on the port with SO_REUSEPORT get the connections the kernel's hash of each
address gives them: 32 keep-alive connections over 2 workers split 14/18, 15/17, 13/19 and 12/20 in four runs (an
even split has a 14% chance), and the split holds for as long as the connections do. A worker with 20 is
saturated while the other idles at times (and batches of 16 fill on one and wait out their timeout on the other):
under wrk, 15/17 answered 12,576 requests/s and 12/20 10,010 (seed CNN, ONNX, batch 16). Node.js's cluster module
deals connections from its primary process for the same reason ("over 70% of all connections ended up in just two
processes, out of a total of eight"). So with workers, `tfperf serve`'s own process listens on the REST port,
accepts, and passes each connection (its file descriptor, over a Unix socket: SCM_RIGHTS) to the next worker that
said it is ready; the workers serve it as if they had accepted it. A connection costs the dealer one accept and
one sendmsg; a request costs it nothing. gRPC's port stays shared through SO_REUSEPORT: grpcio cannot serve a
connection it did not accept.
"""

from __future__ import annotations

import selectors
import socket
import threading

READY = b"ready"


def pair() -> tuple[socket.socket, socket.socket]:
    """A dealer's end and a worker's end of one worker's handoff channel (messages, each whole)."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def say_ready(channel: socket.socket) -> None:
    """A worker tells the dealer that it serves: connections are dealt to it from now on."""
    channel.sendall(READY)


def receive(channel: socket.socket) -> list[socket.socket] | None:
    """The connections waiting on a worker's channel ([] when none is; None once the dealer is gone)."""
    try:
        message, fds, _, _ = socket.recv_fds(channel, 16, 16)
    except BlockingIOError:
        return []
    if not message and not fds:
        return None
    return [socket.socket(fileno=fd) for fd in fds]


class Dealer:
    """Accepts on `listener` (bound, not yet listening) once a worker is ready, and deals each connection to the
    ready workers in turn, on a thread of its own; `close()` stops it."""

    def __init__(self, listener: socket.socket, channels: list[socket.socket], backlog: int = 1024):
        self.listener, self.channels, self.backlog = listener, channels, backlog
        self.ready: list[socket.socket] = []
        self.dealt = 0  # connections handed to workers so far
        self._wake_reader, self._wake = socket.socketpair()
        self._thread = threading.Thread(target=self._run, name="dealer", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop accepting (closing again does nothing); connections already dealt stay with their workers."""
        if self._wake.fileno() < 0:
            return
        self._wake.send(b"x")
        self._thread.join(10)
        for sock in (self.listener, self._wake, self._wake_reader):
            sock.close()

    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._wake_reader, selectors.EVENT_READ)
            for channel in self.channels:
                selector.register(channel, selectors.EVENT_READ)
            listening = False
            while True:
                for key, _ in selector.select():
                    sock = key.fileobj
                    if sock is self._wake_reader:
                        return
                    if sock is self.listener:
                        self._deal()
                        continue
                    message = sock.recv(16)
                    if message == READY and sock not in self.ready:
                        self.ready.append(sock)
                        if not listening:  # the port opens when the first worker serves, not before
                            self.listener.listen(self.backlog)
                            self.listener.setblocking(False)
                            selector.register(self.listener, selectors.EVENT_READ)
                            listening = True
                    elif not message:  # the worker is gone
                        selector.unregister(sock)
                        if sock in self.ready:
                            self.ready.remove(sock)

    def _deal(self) -> None:
        try:
            connection, _ = self.listener.accept()
        except (BlockingIOError, ConnectionAbortedError):
            return
        with connection:  # the worker holds its own copy once sent
            while self.ready:
                channel = self.ready[self.dealt % len(self.ready)]
                try:
                    socket.send_fds(channel, [b"c"], [connection.fileno()])
                except OSError:  # that worker is gone: the next one takes it
                    self.ready.remove(channel)
                    continue
                self.dealt += 1
                return
