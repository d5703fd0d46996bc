"""TLS on the broker's ports: the certificate, and telling TLS from plaintext on one port.

The certificate is the configured one (``--tls-cert``/``--tls-key``), or a self-signed one
made at start-up: the Java, Go and C++ 5.x gRPC clients speak TLS by default and do not check
the certificate, and the proxy serves them a self-signed one in its TLS test mode (on by
default). The gRPC port offers ALPN ``h2`` only (grpc-go insists on it).

``--tls-mode`` (RocketMQ's ``tls.server.mode``, permissive by default there too) applies to
both ports: ``permissive`` serves TLS and plaintext on the same port, told apart by the first
byte (0x16 is a TLS handshake record; no Remoting frame and no HTTP/2 preface starts with
it); ``enforcing`` closes a connection whose first byte is not TLS; ``disabled`` serves
plaintext only (a TLS hello is then just bytes that do not parse). A client gets
:data:`FIRST_BYTE_TIMEOUT_S` to send its first byte and finish its handshake; a silent one
holds nothing longer.
"""

from __future__ import annotations

import datetime
import enum
import ipaddress
import socket
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

#: How long the self-signed certificate is valid (it is made anew at every start).
_VALIDITY = datetime.timedelta(days=3650)


def server_context(
    cert: Path | None,
    key: Path | None,
    *,
    now: datetime.datetime,
    alpn: tuple[str, ...] = (),
) -> ssl.SSLContext:
    """A server context offering ``alpn``: ``cert``/``key`` (PEM, key unencrypted), or a
    self-signed certificate for ``localhost`` / 127.0.0.1 made now.

    Raises:
        OSError, ssl.SSLError: the files cannot be read or do not match.
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    if alpn:
        context.set_alpn_protocols(list(alpn))
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


def client_context(ca: Path | None) -> ssl.SSLContext:
    """What the broker connects to its name servers with: verifying their certificate against
    the PEM bundle ``ca`` (host name included), or, without one, encrypting without checking
    whom it talks to (RocketMQ's client test mode, which its ``tls.enable`` clients default to:
    it protects against eavesdroppers, not against an active man in the middle).

    Raises:
        OSError, ssl.SSLError: ``ca`` cannot be read.
    """
    if ca is not None:
        return ssl.create_default_context(cafile=str(ca))
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
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


#: How long a new connection may take to send its first byte (and a TLS client its
#: handshake) before it is closed.
FIRST_BYTE_TIMEOUT_S: Final = 10.0
#: The first byte of a TLS record carrying a handshake (a ClientHello).
_TLS_HANDSHAKE: Final = 0x16


class TlsMode(enum.Enum):
    """``--tls-mode`` (see the module docstring)."""

    DISABLED = "disabled"
    PERMISSIVE = "permissive"
    ENFORCING = "enforcing"


@dataclass(frozen=True, slots=True)
class TlsPolicy:
    """How one port treats TLS: the mode and the context it serves TLS with."""

    mode: TlsMode
    context: ssl.SSLContext | None

    async def accept(self, stream: trio.abc.Stream) -> tuple[trio.abc.Stream | None, bool]:
        """The stream to serve — ``stream`` itself for plaintext, a handshaken
        ``trio.SSLStream`` for TLS — and whether it is TLS; None when the connection must be
        closed instead (silent or broken within :data:`FIRST_BYTE_TIMEOUT_S`, plaintext in
        enforcing mode); in disabled mode everything is plaintext. Memory streams (tests) are
        plaintext."""
        if self.mode is TlsMode.DISABLED or self.context is None:
            return stream, False
        with trio.move_on_after(FIRST_BYTE_TIMEOUT_S):
            tls = await speaks_tls(stream)
            if tls is None:
                return None, False  # closed or reset first
            if not tls:
                return (None, False) if self.mode is TlsMode.ENFORCING else (stream, False)
            wrapped = trio.SSLStream(stream, self.context, server_side=True)
            try:
                await wrapped.do_handshake()
            except trio.BrokenResourceError:
                return None, True
            return wrapped, True
        return None, False  # silent for too long (before its first byte, or in the handshake)


async def speaks_tls(stream: trio.abc.Stream) -> bool | None:
    """Whether the first byte is a TLS handshake record, without consuming it; None when the
    peer closed or reset the connection first. A stream without a socket (a memory stream)
    is plaintext."""
    sock = getattr(stream, "socket", None)
    if sock is None:
        return False
    try:
        first = await sock.recv(1, socket.MSG_PEEK)
    except OSError:
        return None
    if not first:
        return None
    return bool(first[0] == _TLS_HANDSHAKE)
