"""Certificates the tests make: a CA, a server certificate for the loopback addresses, client
certificates signed by the CA, and a client certificate from a CA nobody trusts."""

import datetime
import ipaddress
from pathlib import Path
from typing import Iterable, Optional, Tuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class CA:
    def __init__(self, cn: str = "test CA") -> None:
        self.key = _key()
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn))
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(minutes=5))
                     .not_valid_after(now + datetime.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
                     .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                  content_commitment=False, key_encipherment=False,
                                                  data_encipherment=False, key_agreement=False,
                                                  encipher_only=False, decipher_only=False), critical=True)
                     .sign(self.key, hashes.SHA256()))

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, cn: str, dns: Iterable[str] = (), ips: Iterable[str] = (), server: bool = True,
              serial: Optional[int] = None) -> Tuple[bytes, bytes]:
        """(certificate PEM, key PEM)"""
        key = _key()
        now = datetime.datetime.now(datetime.timezone.utc)
        sans = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        b = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(self.cert.subject)
             .public_key(key.public_key()).serial_number(serial or x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
             .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                            critical=False)
             .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                   else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = b.sign(self.key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


class PKI:
    """Files in ``d``: ca.crt, server.crt/key, client.crt/key (CA-signed, SAN
    prometheus.monitoring.svc), other-client.crt/key (CA-signed, another SAN), rogue.crt/key
    (signed by a CA the server does not trust)."""

    def __init__(self, d: Path) -> None:
        self.dir = d
        self.ca = CA()
        self.write("ca.crt", self.ca.pem)
        self.server_cert("server", serial=1001)
        self.client_cert("client", "prometheus.monitoring.svc")
        self.client_cert("other-client", "someone.else.svc")
        rogue = CA("rogue CA")
        cert, key = rogue.issue("rogue", dns=["prometheus.monitoring.svc"], server=False)
        self.write("rogue.crt", cert)
        self.write("rogue.key", key)

    def write(self, name: str, data: bytes) -> Path:
        p = self.dir / name
        p.write_bytes(data)
        return p

    def server_cert(self, stem: str, serial: int) -> None:
        cert, key = self.ca.issue("sidecar", dns=["localhost"], ips=["127.0.0.1", "::1"], serial=serial)
        self.write(f"{stem}.crt", cert)
        self.write(f"{stem}.key", key)

    def client_cert(self, stem: str, san: str) -> None:
        cert, key = self.ca.issue(stem, dns=[san], server=False)
        self.write(f"{stem}.crt", cert)
        self.write(f"{stem}.key", key)

    def path(self, name: str) -> str:
        return str(self.dir / name)
