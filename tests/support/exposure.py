"""Who can reach a running purger, seen from outside it: the sockets listening on a port, a network namespace of
the test's own to connect from, and the Spark UI's kill endpoint.

The namespace is joined to this machine by a veth pair on a /30 of 198.18.0.0/15 (RFC 2544's range for tests),
so that its one route leads to this machine's end of the pair: a connection from it reaches this machine as one
from another host would, through an interface other than the loopback, and goes nowhere else.

Example::

    assert listening_addresses(9108) == {"127.0.0.1"}
    with NetworkNamespace() as outside:
        outside.connects(9108)      # False: nothing listens for it on this machine's end of the pair
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

# /proc/net/tcp's state of a listening socket.
_LISTEN = "0A"


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the sockets listening on TCP ``port``, IPv4 and IPv6 (/proc/net/tcp, tcp6)."""
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            local, _remote, state = line.split()[1:4]
            address, local_port = local.split(":")
            if state == _LISTEN and int(local_port, 16) == port:
                found.add(str(_proc_address(address)))
    return found


def _proc_address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/tcp{,6} writes it: 32-bit words in hex, each in the host's byte order."""
    raw = b"".join(int(hex_address[i:i + 8], 16).to_bytes(4, sys.byteorder) for i in range(0, len(hex_address), 8))
    return ipaddress.ip_address(raw)


class NetworkNamespace:
    """A network namespace of the test's own (``unshare --net``), joined to this machine by a veth pair: ``host``
    is this machine's end, the only address the namespace reaches. Needs root, ``unshare``, ``nsenter`` and
    ``ip`` (``available``)."""

    def __init__(self) -> None:
        # Names and a /30 from this process's id, so that two test runs on one machine do not meet.
        pid = os.getpid()
        self.link = f"pxp{pid % 100000}"
        subnet = ipaddress.ip_network("198.18.0.0/15").network_address + (pid % 32768) * 4
        self.host, self.inside = str(subnet + 1), str(subnet + 2)

    @staticmethod
    def available() -> bool:
        return os.geteuid() == 0 and all(shutil.which(tool) for tool in ("unshare", "nsenter", "ip"))

    def __enter__(self) -> "NetworkNamespace":
        self.holder = subprocess.Popen(["unshare", "--net", "sleep", "infinity"])
        try:
            self._wait_apart()
            _run("ip", "link", "add", self.link, "type", "veth", "peer", "name", "eth0", "netns", str(self.holder.pid))
            _run("ip", "addr", "add", f"{self.host}/30", "dev", self.link)
            _run("ip", "link", "set", self.link, "up")
            self._run_inside("ip", "addr", "add", f"{self.inside}/30", "dev", "eth0")
            self._run_inside("ip", "link", "set", "eth0", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_) -> None:
        # The pair goes with the namespace, and the namespace with its last process.
        self.holder.kill()
        self.holder.wait()

    def _wait_apart(self) -> None:
        """Until the holder is in its own namespace: before that, a link given to it would be this machine's."""
        ours = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 30
        while os.readlink(f"/proc/{self.holder.pid}/ns/net") == ours:
            assert time.monotonic() < deadline and self.holder.poll() is None, "unshare --net did not start"
            time.sleep(0.05)

    def connects(self, port: int) -> bool:
        """Whether a TCP connection from the namespace to ``host``:``port`` is accepted."""
        code = ("import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)\n"
                "except ConnectionRefusedError:\n    sys.exit(3)")
        answer = self._python(code, self.host, str(port))
        assert answer.returncode in (0, 3), answer.stderr
        return answer.returncode == 0

    def post(self, port: int, path: str, fields: dict[str, str]) -> tuple[int, str]:
        """POST ``fields`` as a form to ``host``:``port`` ``path`` from the namespace, as a browser on another
        host would; the answer's status and Location (a redirect is not followed)."""
        code = ("import sys, urllib.error, urllib.request\n"
                "class Stay(urllib.request.HTTPRedirectHandler):\n"
                "    def redirect_request(self, *_args, **_kwargs):\n        return None\n"
                "try:\n    answer = urllib.request.build_opener(Stay).open(sys.argv[1], data=sys.argv[2].encode(), "
                "timeout=20)\nexcept urllib.error.HTTPError as error:\n    answer = error\n"
                "print(answer.status, answer.headers.get('Location') or '')")
        answer = self._python(code, f"http://{self.host}:{port}{path}", urllib.parse.urlencode(fields))
        assert answer.returncode == 0, answer.stderr
        status, location = (answer.stdout.strip().split(" ", 1) + [""])[:2]
        return int(status), location

    def _python(self, code: str, *args: str) -> subprocess.CompletedProcess:
        # -I: the plain interpreter, none of this checkout's imports.
        return subprocess.run(["nsenter", "--net", f"--target={self.holder.pid}", sys.executable, "-I", "-c", code,
                               *args], capture_output=True, text=True, timeout=60)

    def _run_inside(self, *command: str) -> None:
        _run("nsenter", "--net", f"--target={self.holder.pid}", *command)


def _run(*command: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"{' '.join(command)}: {done.stderr}"


def kill_forms(ui_url: str, page: str) -> list[str]:
    """The kill forms a UI page (``/jobs/``, ``/stages/``) offers: one per running job or stage, when kills are
    enabled."""
    body = urllib.request.urlopen(f"{ui_url}{page}", timeout=20).read().decode()
    return re.findall(r'<form action="[^"]*/kill/"', body)
