"""The TLS context of the gRPC port: the configured certificate, or a self-signed one.

The Java, Go and C++ 5.x clients speak TLS by default and do not check the certificate; the
proxy serves them a self-signed one in its TLS test mode (on by default), and so do we when no
``--tls-cert``/``--tls-key`` is given. The Python and Node clients default to plaintext, which
the same port serves (the server tells them apart by the first byte). ALPN offers ``h2``
only: grpc-go insists on it.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

#: How long the self-signed certificate is valid (it is made anew at every start).
_VALIDITY = datetime.timedelta(days=3650)


def server_context(
    cert: Path | None, key: Path | None, *, now: datetime.datetime
) -> ssl.SSLContext:
    """A server context with ALPN ``h2``: ``cert``/``key`` (PEM, key unencrypted), or a
    self-signed certificate for ``localhost`` / 127.0.0.1 made now.

    Raises:
        OSError, ssl.SSLError: the files cannot be read or do not match.
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.set_alpn_protocols(["h2"])
    if cert is not None and key is not None:
        context.load_cert_chain(cert, key)
        return context
    cert_pem, key_pem = self_signed(now)
    with tempfile.TemporaryDirectory(prefix="trimq-tls-") as tmp:
        cert_file, key_file = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
        cert_file.write_bytes(cert_pem)
        key_file.write_bytes(key_pem)
        context.load_cert_chain(cert_file, key_file)
    return context


def self_signed(now: datetime.datetime) -> tuple[bytes, bytes]:
    """A self-signed certificate and its key (PEM) for ``localhost`` and 127.0.0.1."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trimq self-signed")])
    alt_names = x509.SubjectAlternativeName(
        [
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + _VALIDITY)
        .add_extension(alt_names, critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem
