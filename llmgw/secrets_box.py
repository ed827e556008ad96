"""Secrets kept encrypted at rest (an external endpoint's API key), with a key file under the root."""
import os
import tempfile
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from .errors import LlmgwError


def _key(root):
    """Return the key, creating the file on first use. Two processes starting at once (the
    control plane's workers, a command) both end up with the same key: it is written whole to
    a file of its own and then linked into place, which only one of them can do; a reader never
    sees a file half written."""
    path = Path(root) / "secrets" / "fernet.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".fernet.")  # mode 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(Fernet.generate_key())
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass  # another process made it first: use that one
        finally:
            os.unlink(tmp)
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
