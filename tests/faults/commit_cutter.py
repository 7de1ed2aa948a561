"""A TCP proxy in front of PostgreSQL that can lose a COMMIT's answer.

Every connection of the runtime goes through the proxy. When armed, the proxy
forwards the client's COMMIT to the server as usual, reads the server's reply,
and at its CommandComplete "COMMIT" message cuts the connection instead of
passing the message on: the transaction is committed on the server, and the
client hears nothing but a closed socket. That is a lost COMMIT response.

The server's byte stream is split into protocol messages (type byte, 32-bit
length) to find that message; the URL it hands out disables SSL and GSS
encryption, so the stream is plain protocol from the first byte.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

COMMIT_COMPLETE = b"C" + struct.pack("!I", 4 + len(b"COMMIT\x00")) + b"COMMIT\x00"


class CommitCutter:
    """A proxy to the PostgreSQL server of `server_url`; `url` is what clients use."""

    def __init__(self, server_url: str) -> None:
        parts = urlsplit(server_url)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._listener = socket.create_server(("127.0.0.1", 0))
        port = self._listener.getsockname()[1]
        netloc = f"{parts.username}@127.0.0.1:{port}" if parts.username else f"127.0.0.1:{port}"
        query = [
            (k, v) for k, v in parse_qsl(parts.query) if k not in ("sslmode", "gssencmode")
        ] + [("sslmode", "disable"), ("gssencmode", "disable")]
        self.url = urlunsplit(
            parts._replace(netloc=netloc, query=urlencode(query, quote_via=quote))
        )
        self._armed = threading.Event()
        self.cuts = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self) -> None:
        """Lose the answer of the next COMMIT any connection sends."""
        self._armed.set()

    @property
    def armed(self) -> bool:
        return self._armed.is_set()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                _close(sock)

    # -- plumbing ------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._upstream)
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._pump_up, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pump_down, args=(server, client), daemon=True).start()

    def _pump_up(self, client: socket.socket, server: socket.socket) -> None:
        try:
            while data := client.recv(65536):
                server.sendall(data)
        except OSError:
            pass
        finally:
            _close(server)

    def _pump_down(self, server: socket.socket, client: socket.socket) -> None:
        pending = b""
        try:
            while data := server.recv(65536):
                pending += data
                forward = b""
                while len(pending) >= 5:
                    length = struct.unpack("!I", pending[1:5])[0]
                    if len(pending) < 1 + length:
                        break
                    message, pending = pending[: 1 + length], pending[1 + length :]
                    if message == COMMIT_COMPLETE and self._take_the_cut():
                        if forward:
                            client.sendall(forward)
                        return  # the COMMIT happened; its answer goes nowhere
                    forward += message
                if forward:
                    client.sendall(forward)
        except OSError:
            pass
        finally:
            _close(client)
            _close(server)

    def _take_the_cut(self) -> bool:
        with self._lock:
            if not self._armed.is_set():
                return False
            self._armed.clear()
            self.cuts += 1
            return True


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
