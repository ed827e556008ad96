"""The members of an archive as `tar -tvzf` lists them on a node."""

KINDS = {"-": "file", "d": "dir", "l": "symlink", "h": "hardlink"}


def listing_argv(path):
    return ["tar", "-tvzf", path]


def parse_listing(text):
    """Return [(name, kind, linkname)] from GNU tar's verbose listing."""
    members = []
    for line in text.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 6 or not fields[0]:
            continue
        kind = KINDS.get(fields[0][0], "other")
        rest, link = fields[5], ""
        if kind == "symlink" and rest.count(" -> ") != 1:
            kind = "other"  # a name or target containing ' -> ' cannot be read safely: refused
        elif kind == "symlink":
            rest, link = rest.split(" -> ", 1)
        elif kind == "hardlink" and " link to " in rest:
            rest, link = rest.split(" link to ", 1)
        members.append((rest.rstrip("/") if kind == "dir" else rest, kind, link))
    return members
