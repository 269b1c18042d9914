#!/usr/bin/env python3
"""Ed25519 key files and fencing proofs as fencing-layer's ProofSigner makes them, for the
transcript scripts of docs/authenticity.md and docs/operating-marks.md (the `openssl` CLI signs).

    proof.py keypair SEED SECRET PUBLIC   # the key pair of sha256(SEED), written as keygen writes it
    proof.py sign SECRET LOCK TOKEN       # the Fencing-Proof of TOKEN for LOCK under SECRET

A key file is one line, the 32-byte key in URL-safe base64 without padding; the signed message
is `fencing-proof-v1`, a zero byte, the lock name's length (big-endian u64), the name, and the
token (big-endian u64); the proof is the signature in the same base64
(fencing-layer/src/verify/proof.rs).
"""
import base64
import hashlib
import os
import struct
import subprocess
import sys
import tempfile

# PKCS#8 DER of an Ed25519 private key, before its 32-byte seed (RFC 8410).
PKCS8_PREFIX = bytes.fromhex("302e020100300506032b657004220420")


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64(text):
    text = text.strip()
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def openssl(seed, *args, data=b""):
    with tempfile.TemporaryDirectory() as tmp:
        key = os.path.join(tmp, "key.der")
        with open(key, "wb") as f:
            f.write(PKCS8_PREFIX + seed)
        return subprocess.run(["openssl", *args, "-inkey" if args[0] == "pkeyutl" else "-in", key, "-keyform" if args[0] == "pkeyutl" else "-inform", "DER"],
                              input=data, capture_output=True, check=True).stdout


def public_key(seed):
    # The SubjectPublicKeyInfo's last 32 bytes are the key.
    return openssl(seed, "pkey", "-pubout", "-outform", "DER")[-32:]


def sign(seed, lock, token):
    name = lock.encode()
    message = b"fencing-proof-v1\0" + struct.pack(">Q", len(name)) + name + struct.pack(">Q", token)
    with tempfile.NamedTemporaryFile() as f:
        f.write(message)
        f.flush()
        return openssl(seed, "pkeyutl", "-sign", "-rawin", "-in", f.name)


def main(argv):
    if len(argv) == 5 and argv[1] == "keypair":
        seed = hashlib.sha256(argv[2].encode()).digest()
        with open(argv[3], "w") as f:
            f.write(b64(seed) + "\n")
        os.chmod(argv[3], 0o600)
        with open(argv[4], "w") as f:
            f.write(b64(public_key(seed)) + "\n")
    elif len(argv) == 5 and argv[1] == "sign":
        with open(argv[2]) as f:
            seed = unb64(f.read())
        print(b64(sign(seed, argv[3], int(argv[4]))))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
