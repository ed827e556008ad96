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


_boxes = {}  # (root, the file's mtime) -> Fernet: read once, and again when the file is replaced

COPY_IT = ("Every control plane sharing a database needs the same file: copy it from the one "
           "that stored the key (the processes read it again when it changes).")


class Unreadable(LlmgwError):
    """A sealed secret that this control plane's key file cannot open."""


def _box(root, create):
    path = key_path(root)
    if create:
        ensure(root)
    try:
        stamp = path.stat().st_mtime_ns
        box = _boxes.get((root, stamp))
        if box is None:
            box = _boxes[(root, stamp)] = Fernet(path.read_bytes())
    except FileNotFoundError:
        # Never made here on reading: a key file made now could open nothing stored before.
        raise Unreadable(f"there is no {path} to open stored keys with. {COPY_IT}") from None
    except (OSError, ValueError) as e:
        raise Unreadable(f"{path} cannot be used to open stored keys ({e}). {COPY_IT}") from e
    return box


def seal(root, text):
    return _box(root, create=True).encrypt(text.encode()).decode() if text else ""


_said = set()  # sealed values already logged as unreadable by this process


def unseal_or_log(root, token, what, log):
    """Return unseal(...), or None when this control plane cannot open it: logged once per
    sealed value, not at every pass or every read of the routes."""
    try:
        return unseal(root, token, what)
    except Unreadable as e:
        if token not in _said:
            _said.add(token)
            log.error("%s", e)
        return None


def unseal(root, token, what="the endpoint"):
    if not token:
        return ""
    box = _box(root, create=False)
    try:
        return box.decrypt(token.encode()).decode()
    except InvalidToken as e:
        raise Unreadable(f"{what}'s stored key cannot be decrypted with {key_path(root)}: it was "
                         f"sealed with another key file. {COPY_IT}") from e
