"""What an operator may say about a node: its name, addresses, labels, fabric, interface.

Everything here is checked before it is stored, so nothing odd ever reaches a node's shell
or a unit name; the messages say what was wrong and what would do.
"""
import re

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
LABEL_KEY = re.compile(r"^[a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._:-]{0,61}[A-Za-z0-9])?$|^$")
IFACE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}$")
HCA = re.compile(r"^[A-Za-z0-9_]{1,32}$")
HOST = re.compile(r"^[A-Za-z0-9.:_-]+$")


class SpecError(ValueError):
    """A value the operator gave cannot be used; the message names it and the fix."""


def check_name(name):
    if not NAME.match(name or ""):
        raise SpecError(f"{name!r} is not a usable node name: use lower-case letters, digits and "
                        f"dashes, starting with a letter or digit (e.g. gpu-07).")
    return name


def parse_addr(addr):
    """Split HOST[:PORT] (or [v6]:PORT) into (host, port)."""
    addr = addr.strip()
    m = re.match(r"^\[([^\]]+)\](?::(\d+))?$", addr) or re.match(r"^([^:\s]+)(?::(\d+))?$", addr)
    if not m or not HOST.match(m.group(1)):
        raise SpecError(f"--addr {addr!r} is not HOST or HOST:PORT (e.g. 10.0.0.17 or node7:2222).")
    port = int(m.group(2) or 22)
    if not 0 < port < 65536:
        raise SpecError(f"port {port} in --addr {addr!r} is out of range 1-65535.")
    return m.group(1), port


def parse_addrs(text):
    """Return [(host, port)] from 'HOST[:PORT][,HOST[:PORT]…]', tried in that order."""
    parts = [p for p in (text or "").split(",") if p.strip()]
    if not parts:
        raise SpecError("--addr is empty; give HOST[:PORT], or several separated by commas.")
    return [parse_addr(p) for p in parts]


def parse_labels(items):
    """Return {key: value} from ['key=value', …]."""
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not LABEL_KEY.match(key) or not LABEL_VALUE.match(value):
            raise SpecError(f"--label {item!r} is not key=value with a key of lower-case letters, "
                            f"digits, '.', '_', '/', '-' and a value of letters, digits, '.', '_', "
                            f"':', '-' (e.g. --label gpu=fast).")
        labels[key] = value
    return labels


def parse_fabric(text):
    """Return (name, [hca, …]) from NAME[:hca1,hca2]."""
    if not text:
        return "", []
    name, _, hcas = text.partition(":")
    hca_list = [h for h in hcas.split(",") if h] if hcas else []
    if not NAME.match(name) or not all(HCA.match(h) for h in hca_list):
        raise SpecError(f"--fabric {text!r} is not NAME[:hca1,hca2] (e.g. --fabric ib-a:mlx5_0,mlx5_1).")
    return name, hca_list


def check_iface(name):
    if name and not IFACE.match(name):
        raise SpecError(f"--mgmt-iface {name!r} is not an interface name (e.g. eth0, enp3s0f1).")
    return name or ""


DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h)?$", re.IGNORECASE)
DURATION_SECONDS = {"s": 1, "m": 60, "h": 3600}


def parse_duration(text, flag):
    """Return whole seconds from '90s', '10m', '1.5h' or a bare number of seconds."""
    m = DURATION.match(str(text).strip())
    if not m:
        raise ValueError(f"{flag} {text!r} is not a duration; write e.g. 90s, 10m or 1h.")
    seconds = int(float(m.group(1)) * DURATION_SECONDS[(m.group(2) or "s").lower()])
    if seconds < 1:
        raise ValueError(f"{flag} {text!r} is under a second; give at least 1s.")
    return seconds
