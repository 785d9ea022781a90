"""Signed publishes: an ed25519 signature (``cryptography``) over the manifest's content digest bound to
the model's name and version, stored in the manifest's ``signature`` field (outside the digest).

    cann-export zoo keygen --out zoo-key      # zoo-key (private, PEM, mode 0600) and zoo-key.pub
    cann-export zoo publish m.pth --name m --sign zoo-key
    cann-export zoo verify m --key zoo-key.pub

The same keys come from openssl: ``openssl genpkey -algorithm ed25519 -out zoo-key`` and
``openssl pkey -in zoo-key -pubout -out zoo-key.pub``."""
from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from .zoo_errors import ZooError, ZooIntegrityError

SCHEMA = "cann-export/zoo-signature/1"


def payload(name: str, version: str, digest: str) -> bytes:
    """The signed bytes: what a consumer pins (name, version and the manifest's content digest)."""
    return json.dumps({"schema": SCHEMA, "name": name, "version": version, "digest": digest},
                      sort_keys=True, separators=(",", ":")).encode()


def _raw_public(public: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(public: Any) -> str:
    return hashlib.sha256(_raw_public(public)).hexdigest()[:16]


def _read(source: Any, what: str) -> bytes:
    if isinstance(source, bytes):
        return source
    path = Path(source)
    try:
        return path.read_bytes()
    except OSError as e:
        raise ZooError(f"cannot read the {what} ({type(e).__name__}: {e})", path=path) from e


def load_private(source: Any) -> Any:
    """An Ed25519PrivateKey from a PEM file path, PEM bytes, or the key object itself."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if isinstance(source, Ed25519PrivateKey):
        return source
    try:
        key = serialization.load_pem_private_key(_read(source, "signing key"), password=None)
    except (ValueError, TypeError) as e:
        raise ZooError(f"not an unencrypted PEM private key ({e}); make one with `cann-export zoo keygen`",
                       path=None if isinstance(source, bytes) else str(source)) from e
    if not isinstance(key, Ed25519PrivateKey):
        raise ZooError(f"the signing key is {type(key).__name__}, not ed25519; make one with `cann-export zoo keygen`")
    return key


def load_public(source: Any) -> Any:
    """An Ed25519PublicKey from a PEM file path, PEM bytes, or the key object itself."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if isinstance(source, Ed25519PublicKey):
        return source
    try:
        key = serialization.load_pem_public_key(_read(source, "public key"))
    except (ValueError, TypeError) as e:
        raise ZooError(f"not a PEM public key ({e}); pass the .pub file `cann-export zoo keygen` wrote",
                       path=None if isinstance(source, bytes) else str(source)) from e
    if not isinstance(key, Ed25519PublicKey):
        raise ZooError(f"the public key is {type(key).__name__}, not ed25519")
    return key


def keygen(out: str | os.PathLike, overwrite: bool = False) -> dict[str, str]:
    """Write an ed25519 key pair: ``out`` (private, PEM, 0600) and ``out.pub`` (public, PEM)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private_path, public_path = Path(out), Path(f"{out}.pub")
    for p in (private_path, public_path):
        if p.exists() and not overwrite:
            raise ZooError("already exists; choose another --out or pass --overwrite", path=p)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    private_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public_path.write_bytes(pub)
    return {"private_key": str(private_path), "public_key": str(public_path), "key_id": key_id(key.public_key())}


def _signature(key: Any, data: bytes) -> dict[str, str]:
    return {"alg": "ed25519", "key_id": key_id(key.public_key()), "schema": SCHEMA,
            "value": base64.b64encode(key.sign(data)).decode()}


class Signer:
    """The zoo's signing key: seals a final manifest (name and version chosen; the store calls it just
    before writing) and signs alias records."""

    def __init__(self, source: Any):
        self.key = load_private(source)
        self.key_id = key_id(self.key.public_key())
        self.public = self.key.public_key()

    def __call__(self, manifest: dict[str, Any]) -> dict[str, Any]:
        data = payload(manifest["name"], manifest["version"], manifest["digest"])
        return {**manifest, "signature": _signature(self.key, data)}

    def sign_record(self, record: dict[str, Any]) -> dict[str, Any]:
        return {**record, "signature": _signature(self.key, record_payload(record))}


def sealer(source: Any) -> Signer:
    """The Signer for an ed25519 private key (PEM path, bytes or key object)."""
    return Signer(source)


def record_payload(record: dict[str, Any]) -> bytes:
    """The signed bytes of an alias record: every field but the signature, canonical JSON."""
    return json.dumps({k: v for k, v in record.items() if k != "signature"}, sort_keys=True,
                      separators=(",", ":"), default=str).encode()


def _verify(public: Any, kid: str, sig: Any, data: bytes, where: str, unsigned: str, what: str) -> str:
    from cryptography.exceptions import InvalidSignature

    if not isinstance(sig, dict) or not sig.get("value"):
        raise ZooIntegrityError(f"{where} is not signed and a signature by key {kid} is required; nothing was "
                                f"loaded. {unsigned}")
    if sig.get("alg") != "ed25519" or sig.get("key_id") != kid:
        raise ZooIntegrityError(f"{where} is signed by key {str(sig.get('key_id'))[:32]}, not by the required key "
                                f"{kid}; nothing was loaded. Re-sign it with the right key")
    try:
        public.verify(base64.b64decode(str(sig["value"]), validate=True), data)
    except (InvalidSignature, ValueError) as e:
        raise ZooIntegrityError(f"{where}: the signature does not match the {what} (edited after signing, or "
                                f"moved to another name/version); nothing was loaded") from e
    return kid


def check(manifest: dict[str, Any], public_source: Any, where: str) -> str:
    """Raise unless ``manifest`` (already digest-checked) carries a valid signature by ``public_source``;
    returns the key id."""
    public = load_public(public_source)
    return _verify(public, key_id(public), manifest.get("signature"),
                   payload(str(manifest["name"]), str(manifest["version"]), str(manifest["digest"])), where,
                   "Publish it with --sign (sign=) using that key", "manifest")


def check_record(record: dict[str, Any], public_source: Any, where: str) -> str:
    """Raise unless the alias ``record`` carries a valid signature by ``public_source``; returns the key id."""
    public = load_public(public_source)
    name, alias = record.get("name"), record.get("alias")
    return _verify(public, key_id(public), record.get("signature"), record_payload(record), where,
                   f"Move the alias again with the key: `cann-export zoo alias {name} {alias} VERSION --sign KEY`",
                   "alias record")
