"""Reading a release archive in the control plane's cache: its members, never its contents."""
import tarfile
from pathlib import Path

from ..errors import InstallError
from ..plans import archive

KINDS = ((tarfile.TarInfo.isreg, "file"), (tarfile.TarInfo.isdir, "dir"),
         (tarfile.TarInfo.issym, "symlink"), (tarfile.TarInfo.islnk, "hardlink"))


def tar_members(path, max_members=archive.MAX_MEMBERS, max_bytes=archive.MAX_UNPACKED_BYTES):
    """Return [(name, kind, linkname)] of a .tar.gz, read as a stream (run in a thread).

    tarfile keeps every member it has read; a listing needs none of them, so they are dropped
    as it goes, and reading stops one member past the bounds: a 1.5-million-member archive
    costs a moment and a little memory, not a minute and most of a gigabyte.
    """
    out, unpacked = [], 0
    try:
        with tarfile.open(path, "r|*") as tar:
            for m in tar:
                kind = next((k for test, k in KINDS if test(m)), "other")
                out.append((m.name, kind, m.linkname))
                unpacked += m.size if kind == "file" else 0
                tar.members = []
                why = archive.too_big(len(out), unpacked, max_members, max_bytes)
                if why:
                    raise InstallError(f"{Path(path).name} was refused: {why}")
    except tarfile.TarError as e:
        raise InstallError(f"{Path(path).name} is not a readable .tar.gz archive: {e}") from e
    return out
