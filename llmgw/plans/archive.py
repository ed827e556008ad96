"""Whether a release archive may be unpacked: nothing in it may land or point outside its directory."""
import posixpath
import tarfile


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


def tar_members(path):
    """Read [(name, kind, linkname)] from a .tar.gz file (reading only, never extracting)."""
    kinds = []
    with tarfile.open(path, "r:*") as tar:
        for m in tar:
            kind = ("file" if m.isreg() else "dir" if m.isdir() else "symlink" if m.issym()
                    else "hardlink" if m.islnk() else "other")
            kinds.append((m.name, kind, m.linkname))
    return kinds
