"""Secrets kept encrypted at rest (external endpoints' and engines' API keys), with a key file
under the root. Every control plane sharing a database needs the same file."""
import os
import tempfile
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from .errors import LlmgwError


def key_path(root):
    return Path(root) / "secrets" / "fernet.key"


def ensure(root):
    """Make the key file unless it exists; return whether this call made it.

    Two processes starting at once (the control plane's workers, a command) both end up with
    the same key: it is written whole to a file of its own and then linked into place, which
    only one of them can do; a reader never sees a file half written."""
    path = key_path(root)
    made = False
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
                made = True
            except FileExistsError:
                pass  # another process made it first: use that one
        finally:
            os.unlink(tmp)
    return made


_boxes = {}  # root -> Fernet: the file is read once a process, not once a secret


def _box(root):
    box = _boxes.get(root)
    if box is None:
        ensure(root)
        box = _boxes[root] = Fernet(key_path(root).read_bytes())
    return box


def seal(root, text):
    return _box(root).encrypt(text.encode()).decode() if text else ""


class Unreadable(LlmgwError):
    """A sealed secret that this control plane's key file cannot open."""


def unseal(root, token, what="the endpoint"):
    if not token:
        return ""
    try:
        return _box(root).decrypt(token.encode()).decode()
    except InvalidToken as e:
        raise Unreadable(f"{what}'s stored key cannot be decrypted with {key_path(root)}: it was "
                         f"sealed with another key file. Every control plane sharing a database "
                         f"needs the same file; copy it from the one that stored the key.") from e
