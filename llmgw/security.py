"""Password hashing and API key generation; keys are stored only as hashes."""
import hashlib
import secrets

from werkzeug.security import check_password_hash, generate_password_hash

KEY_PREFIX = "sk-llmgw-"


def hash_password(password):
    """Hash a password with scrypt (werkzeug's maintained default KDF)."""
    return generate_password_hash(password, method="scrypt")


def check_password(stored, password):
    """Return whether password matches the stored hash."""
    return check_password_hash(stored, password)


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
