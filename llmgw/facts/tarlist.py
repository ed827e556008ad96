"""The members of an archive as GNU `tar --numeric-owner -tvzf` lists them on a node."""
import re

KINDS = {"-": "file", "d": "dir", "l": "symlink", "h": "hardlink"}

# 'lrwxrwxrwx 0/0  0 2026-11-29 18:43 name -> target': numeric owners, so no owner name (one
# may hold a space, 'domain users') can shift the columns and hide a member's real name. A
# line this does not read is kept as 'unreadable', which refuses the archive.
LINE = re.compile(r"^(?P<type>\S)\S{9}\S*\s+\d+/\d+\s+(?P<size>\d+|\d+,\s*\d+)\s+"
                  r"\d{4}-\d{2}-\d{2}\s+\d{2}:\d{2}(?::\d{2})?\s(?P<rest>.*)$")


def listing_argv(path, max_members):
    """List the archive, stopping one line past max_members (the node's output is bounded).

    The pipeline's status is head's, so a tar that fails says so in a line of its own, which
    no listing line looks like: it is read as unreadable and refuses the archive."""
    return ["sh", "-c", '{ tar --numeric-owner -tvzf "$0" 2>&1 || echo "llmgw: tar failed with status $?"; } '
                        '| head -n "$1"', path, str(max_members + 1)]


def _lines(text):
    for line in text.splitlines():
        if line.strip():
            yield line, LINE.match(line)


def parse_listing(text):
    """Return [(name, kind, linkname)] from the verbose listing."""
    members = []
    for line, m in _lines(text):
        if m is None:
            members.append((line, "unreadable", ""))
            continue
        kind = KINDS.get(m["type"], "other")
        rest, link = m["rest"], ""
        if kind == "symlink" and rest.count(" -> ") != 1:
            kind = "other"  # a name or target containing ' -> ' cannot be read safely: refused
        elif kind == "symlink":
            rest, link = rest.split(" -> ", 1)
        elif kind == "hardlink" and " link to " in rest:
            rest, link = rest.split(" link to ", 1)
        members.append((rest.rstrip("/") if kind == "dir" else rest, kind, link))
    return members


def unpacked_bytes(text):
    """Return the bytes the listing's regular files take once unpacked."""
    return sum(int(m["size"]) for _, m in _lines(text) if m and m["type"] == "-")
