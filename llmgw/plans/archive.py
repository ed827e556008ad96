"""Whether a release archive may be unpacked: nothing in it may land or point outside its
directory, and it is not bigger than any release needs to be."""
import posixpath

# A llama.cpp release (CUDA build included) unpacks to a few hundred files and under 2 GiB;
# these leave ample room and stop an archive of a million members or a gigabyte-per-megabyte
# bomb before it is unpacked (or listed in full: listings stop one past the bound).
MAX_MEMBERS = 20_000
MAX_UNPACKED_BYTES = 16 * 1024 ** 3


def too_big(members, unpacked_bytes, max_members=MAX_MEMBERS, max_bytes=MAX_UNPACKED_BYTES):
    """Return the sentence refusing an archive of that many members and bytes, or None."""
    if members > max_members:
        return f"it holds more than {max_members:,} members, far more than any release needs"
    if unpacked_bytes > max_bytes:
        return (f"it would unpack to more than {max_bytes:,} bytes ({unpacked_bytes:,} listed so "
                f"far), far more than any release needs")
    return None


def escapes(path):
    """Return whether a relative archive path leaves the directory it is unpacked in."""
    if path.startswith("/"):
        return True
    norm = posixpath.normpath(path)
    return norm == ".." or norm.startswith("../")


def refusals(members):
    """Return a sentence per unsafe member of [(name, kind, linkname)]; kind is file/dir/symlink/other.

    Links may only name a file beside or below them ('libggml.so -> libggml.so.0'): a link
    with '..' in it could be chained with another ('a -> ..', 'a/b -> ..') to climb out, so
    none is accepted, and no member may be written through a link.
    """
    out = []
    links = set()
    for name, kind, link in members:
        if kind == "unreadable":
            out.append(f"a line of its listing could not be read ({name[:120]!r})")
            continue
        norm = posixpath.normpath(name)
        through = next((p for p in _parents(norm) if p in links), None)
        if escapes(name):
            out.append(f"{name} would unpack outside the install directory")
        elif through:
            out.append(f"{name} would be written through the link {through}")
        elif kind == "symlink" and (link.startswith("/") or ".." in link.split("/")):
            out.append(f"{name} is a link to {link}, outside the install directory")
        elif kind == "hardlink":
            out.append(f"{name} is a hard link, which a release archive has no need of")
        elif kind == "other":
            out.append(f"{name} is a device or FIFO, which a release archive has no need of")
        if kind == "symlink":
            links.add(norm)
    return out


def _parents(path):
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]
