"""Which TCP ports a node already uses, from /proc/net/tcp and tcp6."""

LISTEN_ARGV = ["sh", "-c", "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null"]


TIME_WAIT = "06"


def parse_taken(text):
    """Return the local ports of every socket but those in TIME_WAIT: listening ones, and the
    source ports of connections, which the kernel hands out from the same range as engines'
    ports and which make an engine's bind fail with 'Address already in use' just the same."""
    ports = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3] != TIME_WAIT and ":" in fields[1] and fields[0] != "sl":
            try:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
            except ValueError:
                continue
    return ports
