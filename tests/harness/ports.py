"""A free TCP port on loopback, for the servers the tests start."""
import socket


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_range(size):
    """Return the first port of `size` consecutive ports free on loopback, below the kernel's
    ephemeral range (32768 and up), so that no outgoing connection's source port can take one
    between the moment a port is chosen and the moment an engine binds it."""
    import random
    for _ in range(200):
        base = random.randrange(20000, 32768 - size)
        try:
            for port in range(base, base + size + 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no {size} free ports in a row between 20000 and 32767")
