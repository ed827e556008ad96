"""How the control plane runs a command on a node: over SSH, or locally for the demo node."""
import abc
import asyncio
import shlex
import shutil
from dataclasses import dataclass

from ..errors import NodeError


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


class Transport(abc.ABC):
    """A way to run commands and copy files onto one node."""

    name = "?"

    @abc.abstractmethod
    async def run(self, argv, input=None, timeout=None):
        """Run argv on the node and return its Result."""

    @abc.abstractmethod
    async def put(self, local_path, remote_path):
        """Copy a local file to a path on the node."""

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
