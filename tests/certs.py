"""Throwaway PKI for the transport tests: a CA, a server certificate for localhost/127.0.0.1 and client
certificates, written as PEM files at test time (nothing is committed)."""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass
class Pki:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(path: str, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _issue(ca_key, ca_name: x509.Name, common_name: str, usage, sans: list | None = None):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(ca_name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _ca(common_name: str):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(_name(common_name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def make_pki(directory: str, prefix: str = "") -> Pki:
    """A CA and one server + one client certificate signed by it, as PEM files in `directory`."""
    os.makedirs(directory, exist_ok=True)
    path = lambda name: os.path.join(directory, prefix + name)  # noqa: E731
    ca_key, ca_cert = _ca(f"{prefix}seed-test-ca")
    server_key, server_cert = _issue(
        ca_key, ca_cert.subject, "localhost", ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    client_key, client_cert = _issue(ca_key, ca_cert.subject, "seed-actor", ExtendedKeyUsageOID.CLIENT_AUTH)
    pem = serialization.Encoding.PEM
    return Pki(ca=_write(path("ca.pem"), ca_cert.public_bytes(pem)),
               server_cert=_write(path("server.pem"), server_cert.public_bytes(pem)),
               server_key=_write(path("server.key"), _key_pem(server_key)),
               client_cert=_write(path("client.pem"), client_cert.public_bytes(pem)),
               client_key=_write(path("client.key"), _key_pem(client_key)))
