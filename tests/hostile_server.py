"""A real, misbehaving HTTP server on loopback, for the fault suite (test-only, never shipped).

Raw sockets, so that it can do what no well-behaved server library would: stop accepting,
dribble headers a byte at a time, lie about lengths, stream forever, bomb, reset. ``fault`` is
switched at any time with ``set_fault``, which also cuts the connections already open (like a
server restarting into its new behaviour), so the client's next read meets the new fault.

``FAULTS`` maps every fault to the ``vllm_sidecar_poll_errors_total`` reason the sidecar must
count for it; ``GOOD`` lists the odd-but-valid answers it must read (1xx first, chunked, gzip,
HTTP/1.0 read-to-close). ``set_raw`` answers with any bytes the fuzzers choose.
"""

from __future__ import annotations

import gzip
import random
import select
import socket
import ssl
import struct
import threading
import zlib
from collections import deque
from typing import Callable, Deque, Dict, List, Optional, Tuple

# fault -> the reason the sidecar counts
FAULTS: Dict[str, str] = {
    "slow_accept": "timeout",         # the listener stops accepting: connect lands in the backlog, no answer
    "never_answers": "timeout",       # accepts, reads the request, holds the connection silently
    "header_dribble": "timeout",      # the status line and headers a byte every 50 ms
    "body_dribble": "timeout",        # headers at once, the body 16 bytes every 50 ms
    "stream_forever": "timeout",      # no length, a metric line every 20 ms, never ends
    "chunked_forever": "too_large",   # chunked, endless 4 KB chunks as fast as the socket takes them
    "gzip_bomb": "too_large",         # 16 KB of gzip that inflates to 16 MB
    "big_page": "too_large",          # a 10 MB page (Content-Length announces it)
    "big_page_chunked": "too_large",  # the same, chunked, so that only reading can tell
    "short_body": "connection",       # Content-Length larger than the body, then close
    "close_mid_headers": "connection",
    "close_mid_body": "connection",
    "close_at_once": "connection",    # reads the request, closes without a byte
    "rst": "connection",              # reads the request, answers with a TCP reset
    "long_body": "protocol",          # a body larger than its Content-Length
    "huge_headers": "protocol",       # 2 MB of headers
    "not_http": "protocol",           # another protocol's banner on the port
    "continue_forever": "protocol",   # 100 Continue, again and again
    "bad_gzip": "protocol",           # Content-Encoding: gzip on a plain body
    "bad_chunk": "protocol",          # chunk size line that is not hex
    "html_login": "parse",            # 200 with an HTML login page
    "garbage_200": "parse",           # 200 with bytes that are not metrics
    "non_utf8": "parse",              # a page with bytes that are not UTF-8
    "redirect_loop": "http_other",    # 302 to itself (with a token in the Location)
    "s401": "unauthorized",
    "s403": "unauthorized",
    "s404": "http_4xx",
    "s500": "http_5xx",
    "s503": "http_5xx",
}
GOOD = ("ok", "continue_then_ok", "chunked_ok", "chunked_gzip_ok", "http10_close", "plain_though_gzip_asked")

DRIBBLE_SECONDS = 0.05
LEAK = "LEAKED-LOCATION-TOKEN"  # in the redirect's Location: must never reach a log line


_BOMB: Optional[bytes] = None


def _bomb() -> bytes:
    """16 MB of zeros as gzip (about 16 KB), made once."""
    global _BOMB
    if _BOMB is None:
        z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        block = b"\0" * (1 << 20)
        _BOMB = b"".join(z.compress(block) for _ in range(16)) + z.flush()
    return _BOMB


class HostileServer:
    def __init__(self, page: Callable[[], str], host: str = "127.0.0.1",
                 tls: Optional[ssl.SSLContext] = None) -> None:
        self.page = page
        self.host = host
        self.tls = tls
        self._fault = "ok"
        self._raw = b""
        self.generation = 0
        self.require_auth: Optional[str] = None  # answer 401 unless Authorization is exactly this
        self.requests: Deque[Tuple[str, Dict[str, str], str]] = deque(maxlen=5000)
        self.lock = threading.Lock()
        self._stopping = threading.Event()
        self._conns: set = set()
        self._threads: List[threading.Thread] = []
        self._acceptor: Optional[threading.Thread] = None
        self._listener: Optional[socket.socket] = None
        self.port = 0

    # -- control -------------------------------------------------------------------------------
    @property
    def fault(self) -> str:
        return self._fault

    def set_fault(self, fault: str) -> None:
        if fault not in FAULTS and fault not in GOOD:
            raise ValueError(fault)
        with self.lock:
            self._fault = fault
            self.generation += 1
            conns = list(self._conns)
        for c in conns:  # wake and end the handlers of the old behaviour; each closes its own socket
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def set_raw(self, data: bytes) -> None:
        """Answer every request with exactly ``data``, then close: the fuzzers' hostile answers
        (any bytes, a malformed status line or header). Not one of ``FAULTS``: what the client
        must make of it is the fuzzer's to say. Cuts the connections open, as ``set_fault``."""
        with self.lock:
            self._raw = bytes(data)
            self._fault = "raw"
            self.generation += 1
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def answered(self, fault: Optional[str] = None) -> int:
        with self.lock:
            return sum(1 for r in self.requests if fault is None or r[2] == fault)

    def start(self) -> "HostileServer":
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((self.host, self.port))
        ls.listen(64)
        self.port = ls.getsockname()[1]
        self._listener = ls
        self._stopping.clear()
        _bomb()
        self._acceptor = threading.Thread(target=self._accept_loop, name=f"hostile:{self.port}", daemon=True)
        self._acceptor.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        with self.lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._acceptor is not None:
            self._acceptor.join(5)
        for t in self._threads:
            t.join(5)
        self._threads = [t for t in self._threads if t.is_alive()]
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        assert not self._threads and not self._acceptor.is_alive(), f"threads left behind: {self._threads}"

    # -- accepting -----------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        ls = self._listener
        while not self._stopping.is_set():
            if self._fault == "slow_accept":
                self._stopping.wait(0.02)
                continue
            r, _, _ = select.select([ls], [], [], 0.05)
            if not r:
                continue
            try:
                conn, _ = ls.accept()
            except OSError:
                continue
            with self.lock:
                self._conns.add(conn)
                gen = self.generation
            t = threading.Thread(target=self._serve, args=(conn, gen), daemon=True, name="hostile-conn")
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
            t.start()

    def _live(self, gen: int) -> bool:
        return not self._stopping.is_set() and gen == self.generation

    def _hold(self, gen: int) -> None:
        while self._live(gen):
            self._stopping.wait(0.02)

    def _serve(self, conn: socket.socket, gen: int) -> None:
        sock = conn
        try:
            if self._fault in ("never_answers", "slow_accept"):  # slow_accept: accepted just as it began
                self._hold(gen)
                return
            if self.tls is not None:
                conn.settimeout(2)
                sock = self.tls.wrap_socket(conn, server_side=True)
            sock.settimeout(0.05)
            buf = b""
            while self._live(gen):
                while b"\r\n\r\n" not in buf:
                    if not self._live(gen) or len(buf) > 65536:
                        return
                    try:
                        data = sock.recv(65536)
                    except (socket.timeout, ssl.SSLWantReadError):
                        continue
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1] if len(lines[0].split(" ")) > 1 else "/"
                headers = {}
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    headers[k.strip().lower()] = v.strip()
                fault = self._fault
                with self.lock:
                    self.requests.append((path, headers, fault))
                sock.settimeout(5)
                if not self._answer(sock, fault, path, headers, gen):
                    return
                sock.settimeout(0.05)
        except (OSError, ssl.SSLError):
            return
        finally:
            with self.lock:
                self._conns.discard(conn)
            try:
                sock.close()
            except OSError:
                pass

    # -- answering -----------------------------------------------------------------------------
    def _page(self) -> bytes:
        return self.page().encode()

    @staticmethod
    def _head(status: str, headers: Dict[str, str], version: str = "HTTP/1.1") -> bytes:
        return (f"{version} {status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()

    def _ok(self, sock, headers, body: Optional[bytes] = None) -> None:
        body = self._page() if body is None else body
        h = {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        if "gzip" in headers.get("accept-encoding", ""):
            body = gzip.compress(body, 1)
            h["Content-Encoding"] = "gzip"
        h["Content-Length"] = str(len(body))
        sock.sendall(self._head("200 OK", h) + body)

    def _sleep(self, gen: int, s: float) -> bool:
        self._stopping.wait(s)
        return self._live(gen)

    def _answer(self, sock, fault: str, path: str, headers: Dict[str, str], gen: int) -> bool:  # noqa: C901
        """Answer one request; True keeps the connection for the next one."""
        text = {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        if fault == "raw":
            sock.sendall(self._raw)
            return False
        if path.split("?", 1)[0] != "/metrics":
            sock.sendall(self._head("404 Not Found", {"Content-Length": "0"}))
            return True
        if self.require_auth is not None and headers.get("authorization") != self.require_auth:
            sock.sendall(self._head("401 Unauthorized", {"Content-Length": "0"}))
            return True
        if fault == "ok":
            self._ok(sock, headers)
            return True
        if fault == "continue_then_ok":
            sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n")
            self._ok(sock, headers)
            return True
        if fault in ("chunked_ok", "chunked_gzip_ok"):
            body = self._page()
            h = {**text, "Transfer-Encoding": "chunked"}
            if fault == "chunked_gzip_ok":
                body = gzip.compress(body, 1)
                h["Content-Encoding"] = "gzip"
            out = [self._head("200 OK", h)]
            for i in range(0, len(body), 7000):
                part = body[i:i + 7000]
                out.append(b"%x;ext=1\r\n%s\r\n" % (len(part), part))
            out.append(b"0\r\nX-Trailer: yes\r\n\r\n")
            sock.sendall(b"".join(out))
            return True
        if fault == "http10_close":
            sock.sendall(self._head("200 OK", text, "HTTP/1.0") + self._page())
            return False
        if fault == "plain_though_gzip_asked":  # gzip is asked for, a server may still send text
            body = self._page()
            sock.sendall(self._head("200 OK", {**text, "Content-Length": str(len(body))}) + body)
            return True
        if fault == "header_dribble":
            body = self._page()
            for b in self._head("200 OK", {**text, "Content-Length": str(len(body))}):
                sock.sendall(bytes([b]))
                if not self._sleep(gen, DRIBBLE_SECONDS):
                    return False
            sock.sendall(body)
            return True
        if fault == "body_dribble":
            body = self._page()
            sock.sendall(self._head("200 OK", {**text, "Content-Length": str(len(body))}))
            for i in range(0, len(body), 16):
                sock.sendall(body[i:i + 16])
                if not self._sleep(gen, DRIBBLE_SECONDS):
                    return False
            return True
        if fault == "stream_forever":
            sock.sendall(self._head("200 OK", {**text, "Connection": "close"}))
            while self._sleep(gen, 0.02):
                sock.sendall(b'vllm:num_requests_running{model_name="tiny-llama"} 1\n')
            return False
        if fault == "chunked_forever":
            sock.sendall(self._head("200 OK", {**text, "Transfer-Encoding": "chunked"}))
            line = b'vllm:num_requests_running{model_name="tiny-llama"} 1\n' * 80
            chunk = b"%x\r\n%s\r\n" % (len(line), line)
            while self._live(gen):
                sock.sendall(chunk)
            return False
        if fault == "gzip_bomb":
            bomb = _bomb()
            sock.sendall(self._head("200 OK", {**text, "Content-Encoding": "gzip",
                                                "Content-Length": str(len(bomb))}) + bomb)
            return True
        if fault in ("big_page", "big_page_chunked"):
            line = b'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 1.0\n'
            block = line * (65536 // len(line))
            n = (10 << 20) // len(block) + 1
            if fault == "big_page":
                sock.sendall(self._head("200 OK", {**text, "Content-Length": str(n * len(block))}))
                for _ in range(n):
                    sock.sendall(block)
            else:
                sock.sendall(self._head("200 OK", {**text, "Transfer-Encoding": "chunked"}))
                for _ in range(n):
                    sock.sendall(b"%x\r\n%s\r\n" % (len(block), block))
                sock.sendall(b"0\r\n\r\n")
            return True
        if fault in ("short_body", "close_mid_body"):
            body = self._page()
            announced = len(body) + 1000 if fault == "short_body" else len(body)
            sent = body if fault == "short_body" else body[:len(body) // 2]
            sock.sendall(self._head("200 OK", {**text, "Content-Length": str(announced)}) + sent)
            return False
        if fault == "close_mid_headers":
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/pl")
            return False
        if fault == "close_at_once":
            return False
        if fault == "rst":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        if fault == "long_body":
            body = self._page()
            sock.sendall(self._head("200 OK", {**text, "Content-Length": str(len(body) // 2)}) + body)
            return True
        if fault == "huge_headers":
            sock.sendall(b"HTTP/1.1 200 OK\r\n")
            pad = b"X-Pad-%d: " + b"a" * 1000 + b"\r\n"
            for i in range(2000):
                sock.sendall(pad % i)
            sock.sendall(b"Content-Length: 0\r\n\r\n")
            return True
        if fault == "not_http":
            sock.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
            self._hold(gen)
            return False
        if fault == "continue_forever":
            for _ in range(50):
                sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            self._hold(gen)
            return False
        if fault == "bad_gzip":
            body = self._page()
            sock.sendall(self._head("200 OK", {**text, "Content-Encoding": "gzip",
                                                "Content-Length": str(len(body))}) + body)
            return True
        if fault == "bad_chunk":
            sock.sendall(self._head("200 OK", {**text, "Transfer-Encoding": "chunked"}) + b"zz\r\nhello\r\n0\r\n\r\n")
            return True
        if fault == "html_login":
            body = b"<!DOCTYPE html><html><body><form action=/login>Sign in</form></body></html>\n"
            sock.sendall(self._head("200 OK", {"Content-Type": "text/html; charset=utf-8",
                                               "Content-Length": str(len(body))}) + body)
            return True
        if fault == "garbage_200":
            rnd = random.Random(7)
            body = bytes(rnd.randrange(32, 127) for _ in range(4000)) + b"\n{{{ not metrics }}}\n"
            sock.sendall(self._head("200 OK", {**text, "Content-Length": str(len(body))}) + body)
            return True
        if fault == "non_utf8":
            body = self._page().replace(b'model_name="tiny-llama"', b'model_name="tiny-\xff\xfe"', 1)
            sock.sendall(self._head("200 OK", {**text, "Content-Length": str(len(body))}) + body)
            return True
        if fault == "redirect_loop":
            loc = f"{self.url}/metrics?token={LEAK}"
            sock.sendall(self._head("302 Found", {"Location": loc, "Content-Length": "0"}))
            return True
        if fault.startswith("s") and fault[1:].isdigit():
            body = b"error\n"
            sock.sendall(self._head(f"{fault[1:]} Error", {"Content-Type": "text/plain",
                                                           "Content-Length": str(len(body))}) + body)
            return True
        raise AssertionError(f"fault {fault} not implemented")
