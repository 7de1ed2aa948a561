"""A TCP proxy in front of PostgreSQL that can cut the network: every connection
through it is dropped and new ones are refused until the cut ends."""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit


class Partition:
    """A proxy to the server of `server_url`; clients use `url` (same database, user,
    search_path). `cut()` drops every connection and refuses new ones; `heal()` ends it."""

    def __init__(self, server_url: str) -> None:
        parts = urlsplit(server_url)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._listener = socket.create_server(("127.0.0.1", 0))
        port = self._listener.getsockname()[1]
        netloc = f"{parts.username}@127.0.0.1:{port}" if parts.username else f"127.0.0.1:{port}"
        query = [(k, v) for k, v in parse_qsl(parts.query) if k != "sslmode"]
        query.append(("sslmode", "disable"))
        self.url = urlunsplit(
            parts._replace(netloc=netloc, query=urlencode(query, quote_via=quote))
        )
        self._cut = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._closed = False
        self.refused = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        """Drop every connection now and refuse new ones."""
        self._cut.set()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _close(sock)

    def heal(self) -> None:
        """Let connections through again."""
        self._cut.clear()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                self.refused += 1
                _close(client)
                continue
            try:
                server = socket.create_connection(self._upstream)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        _close(sink)
        _close(source)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
