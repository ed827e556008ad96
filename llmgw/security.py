"""Password hashing and API key generation; keys are stored only as hashes."""
import functools
import hashlib
import secrets

from werkzeug.security import check_password_hash, generate_password_hash

from .green import off_the_hub

KEY_PREFIX = "sk-llmgw-"


def hash_password(password):
    """Hash a password with scrypt (werkzeug's maintained default KDF), off gevent's hub: one
    hash is tens of milliseconds of CPU every stream of the worker would otherwise wait for."""
    return off_the_hub(generate_password_hash, password, "scrypt")


# Checked when no account has the email given, so that an unknown account costs what a known
# one does and the time of an answer does not tell which emails have accounts.
@functools.lru_cache(maxsize=1)
def _nobody():
    return generate_password_hash(secrets.token_urlsafe(16), method="scrypt")


def check_password(stored, password):
    """Return whether password matches the stored hash (None: no such account; the same work
    is done against a hash nobody's password matches), off gevent's hub."""
    matched = off_the_hub(check_password_hash, stored or _nobody(), password)
    return matched and stored is not None


def generate_password():
    """Return a random password for a generated administrator."""
    return secrets.token_urlsafe(15)


def generate_key():
    """Return a new API key (shown once)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key):
    """Hash an API key. Keys carry 256 bits of entropy, so a plain SHA-256 is enough."""
    return hashlib.sha256(key.encode()).hexdigest()


def display_prefix(key):
    """Return the part of a key safe to show in lists."""
    return key[: len(KEY_PREFIX) + 6]
