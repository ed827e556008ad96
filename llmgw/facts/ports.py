"""Which TCP ports a node already listens on, from /proc/net/tcp and tcp6."""

LISTEN_ARGV = ["sh", "-c", "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null"]


def parse_listening(text):
    """Return the set of local ports in state LISTEN (0A)."""
    ports = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3] == "0A" and ":" in fields[1]:
            try:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
            except ValueError:
                continue
    return ports
