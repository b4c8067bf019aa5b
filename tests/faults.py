"""Fault injection in front of a real server: a TCP proxy that can be cut and restored.

The server behind it is the real one; the proxy only decides whether bytes get
through, so a client sees exactly what it would see when a data centre's
endpoint goes away (connections refused mid-way or reset).

Example::

    proxy = TcpProxy("127.0.0.1", 9000).start()   # proxy.port forwards to 9000
    proxy.cut()        # new and open connections fail
    proxy.restore()
"""

from __future__ import annotations

import socket
import threading


class TcpProxy:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.broken = threading.Event()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> "TcpProxy":
        threading.Thread(target=self._accept, name="tcp-proxy", daemon=True).start()
        return self

    def cut(self) -> None:
        with self._lock:
            self.broken.set()
            for sock in self._open:
                sock.close()
            self._open.clear()

    def restore(self) -> None:
        self.broken.clear()

    def _accept(self) -> None:
        while True:
            client, _ = self.listener.accept()
            if self.broken.is_set():
                client.close()
                continue
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                # A cut that came while this connection was being made must close it too.
                if self.broken.is_set():
                    client.close()
                    server.close()
                    continue
                self._open.update((client, server))
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.close()
                except OSError:
                    pass
            with self._lock:
                self._open.discard(source)
                self._open.discard(sink)
