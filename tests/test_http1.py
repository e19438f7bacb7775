"""tfperf.serving.http1: the load client's HTTP/1.1 reads every way a server may frame its answer, and fails a
request it cannot complete in one line instead of hanging."""

import asyncio

import pytest

from tfperf.serving import http1


def serve_scripted(answers: list[bytes]):
    """A server that answers each request it reads (up to its blank line and Content-Length body) with the next of
    `answers` (b"" closes the connection without answering, b"hang" never answers); what it read, with the peer
    it came from, is in the list returned beside."""
    pending = list(answers)
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while pending:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            seen.append((writer.get_extra_info("peername"), head + await reader.readexactly(length)))
            answer = pending.pop(0)
            if answer == b"hang":
                await asyncio.sleep(60)
            if not answer:
                break
            writer.write(answer)
            await writer.drain()
        writer.close()

    return handle, seen


async def exchange(answers: list[bytes], requests: int, **pool_options):
    handle, seen = serve_scripted(answers)
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = http1.Pool(asyncio.get_running_loop(), "127.0.0.1", port, **pool_options)
    data = http1.wire("POST", "127.0.0.1", port, "/v1/models/m:predict", b'{"instances": [1]}')
    got = []
    for _ in range(requests):
        try:
            got.append(await pool.request(data))
        except http1.HTTPError as exc:
            got.append(exc)
    pool.close()
    server.close()
    return got, seen, pool


def test_answers_framed_by_length_by_chunks_and_by_close_are_read_whole_over_one_kept_connection():
    by_length = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nInference-Header-Content-Length: 2\r\n\r\nhello"
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"3\r\nabc\r\n4;ext=1\r\ndefg\r\n0\r\nX-Trailer: 1\r\n\r\n")
    until_close = b"HTTP/1.0 503 Service Unavailable\r\n\r\nbusy"
    got, seen, pool = asyncio.run(exchange([by_length, chunked, until_close], 3))
    assert [(a.status, a.body) for a in got] == [(200, b"hello"), (200, b"abcdefg"), (503, b"busy")]
    assert got[0].headers["inference-header-content-length"] == "2"  # names in lower case, values kept
    # The request went in one write, with its length and type, and all three on the one kept connection.
    first = seen[0][1]
    assert first.startswith(b"POST /v1/models/m:predict HTTP/1.1\r\n") and b"Content-Length: 18" in first
    assert b"Content-Type: application/json" in first and first.endswith(b'{"instances": [1]}')
    assert len(seen) == 3 and len({peer for peer, _ in seen}) == 1


def test_a_request_the_server_drops_or_never_answers_fails_in_one_line():
    got, _, _ = asyncio.run(exchange([b""], 1))
    assert isinstance(got[0], http1.HTTPError) and "closed before the answer was complete" in str(got[0])
    got, _, pool = asyncio.run(exchange([b"hang"], 1, timeout_s=0.5))
    assert isinstance(got[0], http1.HTTPError) and "no answer within 0.5 s" in str(got[0])
    assert not pool.busy
    with pytest.raises(http1.HTTPError, match="not an HTTP/1.x answer"):
        raise asyncio.run(exchange([b"SSH-2.0-OpenSSH\r\n\r\n"], 1))[0][0]


def test_requests_beyond_the_most_connections_wait_for_one_to_come_free():
    async def many() -> tuple[list[int], int]:
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        handle, seen = serve_scripted([answer] * 12)
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = http1.Pool(asyncio.get_running_loop(), "127.0.0.1", port, most=3)
        data = http1.wire("GET", "127.0.0.1", port, "/v2/models/m")
        answers = await asyncio.gather(*(pool.request(data) for _ in range(12)))
        pool.close()
        server.close()
        return [a.status for a in answers], len({peer for peer, _ in seen})

    statuses, opened = asyncio.run(many())
    assert statuses == [200] * 12 and opened == 3


def test_pythons_own_http_server_speaking_http_1_0_is_answered_a_connection_a_request():
    """http.server's default handler (HTTP/1.0: each answer's body runs until it closes the connection, without a
    Content-Length when the handler writes none), as a server nobody here wrote."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"echo:" + body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]

    async def three() -> list[bytes]:
        pool = http1.Pool(asyncio.get_running_loop(), "127.0.0.1", port)
        got = [await pool.request(http1.wire("POST", "127.0.0.1", port, "/", f"r{i}".encode())) for i in range(3)]
        pool.close()
        return [(a.status, a.body) for a in got]

    try:
        assert asyncio.run(three()) == [(200, b"echo:r0"), (200, b"echo:r1"), (200, b"echo:r2")]
    finally:
        server.shutdown()
