"""The resident workers' channel: who may join, and what protects what crosses hosts.

A worker on the agent's host takes its unix socket, in a directory only the agent's user may
enter. Across hosts a worker connects over TCP, and that connection is always TLS 1.3: the
agent makes an ephemeral key and self-signed certificate at each start, and the worker pins
the certificate by its SHA-256 fingerprint, which reaches it inside the job Spark ships (as
protected as Spark's own traffic: ``spark.authenticate``, ``spark.network.crypto.enabled``,
``spark.ssl.*``). Every message after the handshake is encrypted and authenticated by TLS, so
none can be read or forged on the path.

On either channel the worker and the agent prove to each other that they hold the task's
random token by challenge and response: each answers the other's fresh nonce with an HMAC of
it under the token. The token itself never crosses, and a recorded handshake proves nothing
to an agent whose nonce is new.

The worker's side needs only the standard library: it runs in Spark's Python workers.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import os
import secrets
import socket
import ssl

NONCE_BYTES = 32
# What each side's proof is an HMAC of, after this label: the two cannot be swapped.
_AGENT_LABEL = b"udf-agent resident agent\0"
_WORKER_LABEL = b"udf-agent resident worker\0"


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def agent_proof(token: str, worker_nonce: bytes, agent_nonce: bytes) -> bytes:
    """The agent's answer to a worker's nonce (with its own nonce, so it is never the same twice)."""
    return hmac.new(token.encode(), _AGENT_LABEL + worker_nonce + agent_nonce, hashlib.sha256).digest()


def worker_proof(token: str, agent_nonce: bytes, hello: bytes) -> bytes:
    """The worker's answer to the agent's nonce, binding its whole hello (slot, launch, nonce)."""
    return hmac.new(token.encode(), _WORKER_LABEL + agent_nonce + hello, hashlib.sha256).digest()


def proven(expected: bytes, told: object) -> bool:
    return isinstance(told, (bytes, bytearray)) and hmac.compare_digest(expected, bytes(told))


def fingerprint(certificate_der: bytes) -> str:
    return hashlib.sha256(certificate_der).hexdigest()


def connect_tls(sock: socket.socket, expected_fingerprint: str) -> ssl.SSLSocket:
    """``sock`` past a TLS 1.3 handshake with the agent whose certificate has
    ``expected_fingerprint`` (ConnectionError for any other: no byte of ours reaches it)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    # The certificate is self-signed and names no host: it is pinned by its fingerprint instead.
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    tls = context.wrap_socket(sock)
    told = tls.getpeercert(binary_form=True)
    if told is None or not hmac.compare_digest(fingerprint(told), expected_fingerprint):
        tls.close()
        raise ConnectionError("the workers' port answered with a certificate other than the agent's")
    return tls


class AgentCertificate:
    """The agent's ephemeral key and self-signed certificate, made at each start and kept in
    memory (on disk only for the instant OpenSSL loads it, in ``private_dir``, which only this
    user may enter): ``context`` serves TLS 1.3 with it, ``fingerprint`` is what workers pin."""

    def __init__(self, private_dir: str):
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "udf-agent resident workers")])
        now = datetime.datetime.now(datetime.timezone.utc)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            # A clock that differs between hosts does not matter: the certificate is pinned, not validated.
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .sign(key, hashes.SHA256())
        )
        self.fingerprint = fingerprint(certificate.public_bytes(serialization.Encoding.DER))
        pem = certificate.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_3
        path = os.path.join(private_dir, f"identity-{secrets.token_hex(8)}.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(pem)
            self.context.load_cert_chain(path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def accept(self, sock: socket.socket, timeout: float) -> ssl.SSLSocket:
        """``sock`` past the server side of a TLS handshake, within ``timeout`` seconds
        (ssl.SSLError for a peer that does not speak TLS 1.3, OSError for one gone)."""
        sock.settimeout(timeout)
        tls = self.context.wrap_socket(sock, server_side=True)
        tls.settimeout(None)
        return tls
