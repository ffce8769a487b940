"""TLS and node-authentication material for a deployment, made with `cryptography` (a Flower
dependency): a CA, a server certificate for the SuperLink's addresses, and one ECDSA P-384 key
pair per site in OpenSSH format (private key for `flower-supernode
--auth-supernode-private-key`, public key for `flwr supernode register`)."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from workbench.io import atomic_write_bytes


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP384R1())


def _write_private(path: Path, key, fmt) -> None:
    from cryptography.hazmat.primitives import serialization

    atomic_write_bytes(path, key.private_bytes(serialization.Encoding.PEM, fmt,
                                               serialization.NoEncryption()))
    path.chmod(0o600)


def make_tls(folder: str | Path, *, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
             days: int = 365, name: str = "workbench-fed") -> dict[str, Path]:
    """ca.crt/ca.key and server.crt/server.key (SANs: `hosts`) in `folder`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                       crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False,
                                       decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    srv_key = _key()
    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    srv = (x509.CertificateBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
           .issuer_name(ca_name).public_key(srv_key.public_key())
           .serial_number(x509.random_serial_number())
           .not_valid_before(start).not_valid_after(end)
           .add_extension(x509.SubjectAlternativeName(sans), critical=False)
           .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
           .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                          critical=False)
           .sign(ca_key, hashes.SHA256()))
    atomic_write_bytes(out / "ca.crt", ca.public_bytes(serialization.Encoding.PEM))
    _write_private(out / "ca.key", ca_key, serialization.PrivateFormat.PKCS8)
    atomic_write_bytes(out / "server.crt", srv.public_bytes(serialization.Encoding.PEM))
    _write_private(out / "server.key", srv_key, serialization.PrivateFormat.PKCS8)
    return {"ca": out / "ca.crt", "cert": out / "server.crt", "key": out / "server.key"}


def make_node_key(private: str | Path, public: str | Path) -> None:
    """An ECDSA P-384 pair: OpenSSH private key and `ecdsa-sha2-nistp384 ...` public key."""
    from cryptography.hazmat.primitives import serialization

    key = _key()
    private, public = Path(private), Path(public)
    _write_private(private, key, serialization.PrivateFormat.OpenSSH)
    pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                        serialization.PublicFormat.OpenSSH)
    atomic_write_bytes(public, pub + f" {private.stem}\n".encode())
