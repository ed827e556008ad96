"""Secrets kept encrypted at rest (an external endpoint's API key), with a key file under the root."""
import os
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from .errors import LlmgwError


def _key(root):
    path = Path(root) / "secrets" / "fernet.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(Fernet.generate_key())
    return path.read_bytes()


def seal(root, text):
    return Fernet(_key(root)).encrypt(text.encode()).decode() if text else ""


def unseal(root, token):
    if not token:
        return ""
    try:
        return Fernet(_key(root)).decrypt(token.encode()).decode()
    except InvalidToken as e:
        raise LlmgwError(f"a stored secret cannot be decrypted with {Path(root) / 'secrets' / 'fernet.key'}; "
                         f"was the key file replaced? Add the endpoint again with its key.") from e
