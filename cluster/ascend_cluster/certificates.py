"""The local cluster's public key infrastructure: one CA that signs every serving and client certificate, and the
service-account signing key. Made once under ``<root>/pki`` and kept, so kubeconfigs stay valid across restarts.

Identities follow kubeadm's: the admin is in ``system:masters``; kube-controller-manager and kube-scheduler are
``system:kube-controller-manager`` / ``system:kube-scheduler`` (their bootstrap RBAC roles); a node agent is
``system:node:<name>`` in ``system:nodes`` (the Node authorizer and NodeRestriction admit it as a kubelet); the API
server reaches kubelets as ``kube-apiserver-kubelet-client``.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_FOR = datetime.timedelta(days=3650)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _private_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    os.chmod(path, 0o600)


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
                     + [x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


class Authority:
    """The CA under ``folder`` (made on first use) and the certificates it issues into the same folder."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.ca = KeyPair(self.folder / "ca.crt", self.folder / "ca.key")
        if not self.ca.cert.exists():
            self._make_ca()
        self._key = serialization.load_pem_private_key(self.ca.key.read_bytes(), None)
        self._cert = x509.load_pem_x509_certificate(self.ca.cert.read_bytes())

    def _make_ca(self) -> None:
        key = _private_key()
        now = datetime.datetime.now(datetime.timezone.utc)
        name = _name("ascend-train-local-ca")
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + VALID_FOR)
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        _write_key(self.ca.key, key)
        self.ca.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, file_stem: str, common_name: str, organizations: tuple[str, ...] = (), *,
              server_names: tuple[str, ...] = (), client: bool = True) -> KeyPair:
        """A certificate for ``common_name`` (kept if already issued). ``server_names``: the DNS names and IPs it
        serves as (it is then a serving certificate too)."""
        pair = KeyPair(self.folder / f"{file_stem}.crt", self.folder / f"{file_stem}.key")
        if pair.cert.exists() and pair.key.exists():
            return pair
        key = _private_key()
        now = datetime.datetime.now(datetime.timezone.utc)
        usages = ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else []) + (
            [ExtendedKeyUsageOID.SERVER_AUTH] if server_names else [])
        builder = (x509.CertificateBuilder().subject_name(_name(common_name, organizations))
                   .issuer_name(self._cert.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
                   .not_valid_after(now + VALID_FOR)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
        if server_names:
            alt = []
            for entry in server_names:
                try:
                    alt.append(x509.IPAddress(ipaddress.ip_address(entry)))
                except ValueError:
                    alt.append(x509.DNSName(entry))
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        _write_key(pair.key, key)
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return pair

    def signing_key(self, file_stem: str = "service-accounts") -> KeyPair:
        """The key pair that signs service-account tokens (the ``.crt`` slot holds the public key)."""
        pair = KeyPair(self.folder / f"{file_stem}.pub", self.folder / f"{file_stem}.key")
        if not pair.key.exists():
            key = _private_key()
            _write_key(pair.key, key)
            pair.cert.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                serialization.PublicFormat.SubjectPublicKeyInfo))
        return pair
