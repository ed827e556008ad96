"""How the control plane runs a command on a node: over SSH, or locally for the demo node."""
import abc
import asyncio
import functools
import os
import shlex
import shutil
import time
from dataclasses import dataclass

from ..errors import NodeError

# Hashing or moving a model file of tens of GB takes minutes, not ssh.command_timeout.
LONG_FILE_SECONDS = 3600


@dataclass
class Result:
    argv: list
    exit_status: int
    stdout: str
    stderr: str

    @property
    def ok(self):
        return self.exit_status == 0

    def tail(self, n=3):
        """Return the last n lines of stderr (or stdout when stderr is empty)."""
        text = (self.stderr or self.stdout).strip().splitlines()
        return " | ".join(text[-n:])


def _measured(run):
    """Wrap a transport's run: every command counts in llmgw_ssh_commands_total by outcome
    (ok, a non-zero exit, or an error: no connection, a timeout, a broken session), and is
    noted for the node page's pane of what the control plane did there."""
    @functools.wraps(run)
    async def measured(self, argv, input=None, timeout=None):
        from .. import metrics
        from ..services import command_log
        began = time.monotonic()
        try:
            result = await run(self, argv, input=input, timeout=timeout)
        except NodeError as e:
            metrics.SSH_COMMANDS(self.name, "error").inc()
            command_log.note(self.name, argv, None, time.monotonic() - began, str(e))
            raise
        metrics.SSH_COMMANDS(self.name, "ok" if result.ok else "nonzero").inc()
        command_log.note(self.name, argv, result.exit_status, time.monotonic() - began,
                         "" if result.ok else result.tail(1))
        return result
    return measured


class Transport(abc.ABC):
    """A way to run commands and copy files onto one node."""

    name = "?"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "run" in cls.__dict__ and not getattr(cls.__dict__["run"], "__isabstractmethod__", False):
            cls.run = _measured(cls.__dict__["run"])

    @abc.abstractmethod
    async def run(self, argv, input=None, timeout=None):
        """Run argv on the node and return its Result."""

    @abc.abstractmethod
    async def put(self, local_path, remote_path):
        """Copy a local file to a path on the node."""

    @abc.abstractmethod
    async def send(self, local_path, remote_path, progress=None, max_rate=0):
        """Copy a local file to remote_path, continuing what an earlier copy left there.

        A model's weights take minutes to copy, and a reconciler restart or a broken
        connection must not start them over: bytes already at remote_path are kept when there
        are no more of them than the file has (their hash is checked by the caller at the
        end). progress(done, total, sent) is called as blocks land; max_rate caps bytes/s.
        Returns (bytes sent now, bytes found there already).
        """

    async def close(self):
        return None

    async def check(self, argv, input=None, timeout=None, what=None):
        """Run argv and raise NodeError naming it when it fails."""
        result = await self.run(argv, input=input, timeout=timeout)
        if not result.ok:
            raise NodeError(self.name, f"{what or shlex.join(argv)} failed "
                            f"(exit {result.exit_status}): {result.tail()}",
                            argv=argv, exit_status=result.exit_status, stderr=result.stderr)
        return result


class LocalTransport(Transport):
    """Runs commands on the control plane's own machine (the demo's node), without SSH."""

    def __init__(self, name="local"):
        self.name = name

    async def run(self, argv, input=None, timeout=None):
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True)
        except (FileNotFoundError, PermissionError) as e:
            # What a shell over SSH would say: exit 127/126 and a line on stderr.
            status = 127 if isinstance(e, FileNotFoundError) else 126
            return Result(list(argv), status, "", f"{argv[0]}: {e.strerror}")
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(input.encode() if isinstance(input, str) else input), timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise NodeError(self.name, f"{shlex.join(argv)} did not finish in {timeout} s", argv=argv)
        return Result(list(argv), proc.returncode, out.decode("utf-8", "replace"),
                      err.decode("utf-8", "replace"))

    async def put(self, local_path, remote_path):
        await asyncio.to_thread(shutil.copyfile, local_path, remote_path)

    async def send(self, local_path, remote_path, progress=None, max_rate=0):
        try:
            found = kept(os.path.getsize(remote_path), local_path)
        except OSError:
            found = 0
        fd = os.open(remote_path, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if not found else 0), 0o644)
        turn = asyncio.Lock()

        async def write(data, offset):
            async with turn:  # in order, one at a time: a file on a local disk needs no window
                await asyncio.to_thread(os.pwrite, fd, data, offset)
        try:
            return await pump(local_path, found, write, progress, max_rate)
        finally:
            os.close(fd)


BLOCK = 1 << 20  # read and written in blocks of 1 MiB,
WINDOW = 8  # this many in flight at once (SFTP writes each wait for their own answer)


def kept(found, local_path):
    """Return how many bytes of an earlier copy to keep: none when there are more of them than
    the file has (not a copy of it; the target is then written afresh)."""
    return found if found <= os.path.getsize(local_path) else 0


async def pump(local_path, found, write, progress=None, max_rate=0):
    """Write local_path's bytes from offset `found` (what kept() kept) on with
    write(data, offset); see send()."""
    total = os.path.getsize(local_path)
    # The blocks of one window are written in any order, so a copy killed mid-window may have
    # left a hole below its last byte: the last window's worth is written again.
    found = max(0, found - WINDOW * BLOCK)
    pos = found
    sent, started = 0, time.monotonic()
    if progress:
        progress(pos, total, 0)
    with open(local_path, "rb") as src:
        while pos < total:
            blocks = await asyncio.to_thread(_read_blocks, src, pos, min(WINDOW, -(-(total - pos) // BLOCK)))
            if not blocks:
                break  # the file shrank under us: the hash check at the end says so
            await asyncio.gather(*(write(data, offset) for offset, data in blocks))
            n = sum(len(data) for _, data in blocks)
            pos, sent = pos + n, sent + n
            if progress:
                progress(pos, total, sent)
            if max_rate:
                ahead = sent / max_rate - (time.monotonic() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
    return sent, found


def _read_blocks(src, pos, count):
    src.seek(pos)
    blocks = []
    for _ in range(count):
        data = src.read(BLOCK)
        if not data:
            break
        blocks.append((pos, data))
        pos += len(data)
    return blocks
