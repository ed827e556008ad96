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
    """Return a sentence per unsafe member of [(name, kind, linkname)]; kind is file/dir/symlink/other."""
    out = []
    for name, kind, link in members:
        if escapes(name):
            out.append(f"{name} would unpack outside the install directory")
        elif kind == "symlink" and (link.startswith("/")
                                    or escapes(posixpath.join(posixpath.dirname(name), link))):
            out.append(f"{name} is a link to {link}, outside the install directory")
        elif kind == "hardlink":
            out.append(f"{name} is a hard link, which a release archive has no need of")
        elif kind == "other":
            out.append(f"{name} is a device or FIFO, which a release archive has no need of")
    return out


def tar_members(path):
    """Read [(name, kind, linkname)] from a .tar.gz file (reading only, never extracting)."""
    kinds = []
    with tarfile.open(path, "r:*") as tar:
        for m in tar:
            kind = ("file" if m.isreg() else "dir" if m.isdir() else "symlink" if m.issym()
                    else "hardlink" if m.islnk() else "other")
            kinds.append((m.name, kind, m.linkname))
    return kinds
