"""Certificates for the tests' secured servers (the SASL_SSL Kafka broker, the Cassandra node with TLS): an
authority made for them, and a key and certificate for the server's address signed by it, with keytool.

Example::

    make_certificates(directory, "127.0.0.3", password)
    directory / "ca.pem"     # the authority, for the clients (PEM)
    directory / "node.p12"   # the server's key and certificate chain (PKCS12, under ``password``)
"""

from __future__ import annotations

import subprocess
from functools import partial
from pathlib import Path

from devstack.stack import StackError, _java


def make_certificates(directory: Path, host: str, password: str) -> None:
    """In ``directory`` (emptied first): a certificate authority, its certificate as ``ca.pem`` (for the driver),
    and ``node.p12``, a PKCS12 keystore under ``password`` with a key and certificate for ``host`` signed by it."""
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.iterdir():
        old.unlink()
    ca, node, ca_file = directory / "ca.p12", directory / "node.p12", directory / "ca.pem"
    keytool = partial(_keytool, directory)
    keytool("-genkeypair", "-alias", "ca", "-keyalg", "RSA", "-keysize", "2048", "-validity", "30",
            "-dname", "CN=purger test authority", "-ext", "bc:c", "-keystore", ca, "-storepass", password)
    keytool("-exportcert", "-rfc", "-alias", "ca", "-keystore", ca, "-storepass", password, "-file", ca_file)
    keytool("-genkeypair", "-alias", "node", "-keyalg", "RSA", "-keysize", "2048", "-validity", "30",
            "-dname", f"CN={host}", "-keystore", node, "-storepass", password)
    keytool("-certreq", "-alias", "node", "-keystore", node, "-storepass", password, "-file", directory / "node.csr")
    # The driver checks the node's address against the certificate's subject alternative names.
    keytool("-gencert", "-rfc", "-alias", "ca", "-keystore", ca, "-storepass", password, "-validity", "30",
            "-ext", f"san=ip:{host}", "-infile", directory / "node.csr", "-outfile", directory / "node.pem")
    keytool("-importcert", "-noprompt", "-alias", "ca", "-file", ca_file, "-keystore", node, "-storepass", password)
    keytool("-importcert", "-alias", "node", "-file", directory / "node.pem", "-keystore", node, "-storepass", password)


def _keytool(directory: Path, *arguments: str | Path) -> None:
    keytool = Path(_java()).resolve().with_name("keytool")
    result = subprocess.run([str(keytool), "-storetype", "PKCS12", *map(str, arguments)], capture_output=True, text=True)
    if result.returncode != 0:
        raise StackError(f"keytool {arguments[0]} in {directory} failed (exit {result.returncode}): "
                         f"{result.stdout}{result.stderr}")
