"""SSH to nodes with asyncssh: pinned host keys, one reused connection, a cap on channels."""
import asyncio
import posixpath
import secrets
import shlex

import asyncssh

from ..errors import HostKeyMismatch, NodeError
from .transport import LONG_FILE_SECONDS, Result, Transport, kept, pump

# Stock sshd allows 10 sessions per connection; the 11th channel fails to open.
DEFAULT_MAX_SESSIONS = 8
SUDO_NEEDS_PASSWORD = "a password is required"


def fingerprint(public_key_text):
    """Return the SHA256:… fingerprint of an OpenSSH public key line."""
    return asyncssh.import_public_key(public_key_text).get_fingerprint("sha256")


def public_key_line(private_key_path):
    """Return the OpenSSH public key line of a private key file."""
    key = asyncssh.read_private_key(str(private_key_path))
    return key.export_public_key().decode().strip()


def generate_identity(path):
    """Write a new ed25519 private key (0600) and its .pub next to it."""
    key = asyncssh.generate_private_key("ssh-ed25519", comment="llmgw-control-plane")
    key.write_private_key(str(path))
    key.write_public_key(str(path) + ".pub")
    path.chmod(0o600)


async def fetch_host_key(addr, port, timeout=10):
    """Return the node's host public key line, as offered to anyone who connects."""
    try:
        key = await asyncio.wait_for(asyncssh.get_server_host_key(addr, port), timeout)
    except (OSError, asyncssh.Error, asyncio.TimeoutError) as e:
        raise NodeError(f"{addr}:{port}", f"cannot reach SSH to read its host key: {e or type(e).__name__}")
    if key is None:
        raise NodeError(f"{addr}:{port}", "offered no host key")
    return key.export_public_key().decode().strip()


class SSHTransport(Transport):
    """One node over SSH. Connects lazily (trying each address in turn), reconnects after a failure.

    With sudo, every command runs as `sudo -n -- argv` and files are copied through /tmp.
    """

    def __init__(self, name, addrs, user, client_key, host_key, connect_timeout=10,
                 max_sessions=DEFAULT_MAX_SESSIONS, sudo=False, password=None, command_timeout=None,
                 agent_path=None):
        self.name, self.addrs, self.user = name, list(addrs), user
        self.addr, self.port = self.addrs[0]
        self.client_key, self.password = client_key, password
        # Only the one-time bootstrap may use the operator's agent; the control plane never does.
        self.agent_path = agent_path
        self.host_key = host_key
        self.connect_timeout = connect_timeout
        self.sudo = sudo
        # Commands that say nothing about time still end: a hung one must not hold a task forever.
        self.command_timeout = command_timeout
        self._conn = None
        self._retired = False
        self._connecting = asyncio.Lock()
        self._sessions = asyncio.Semaphore(max_sessions)

    async def _connection(self):
        if self._retired:
            raise NodeError(self.name, "its connection was closed (the node's address, user or "
                            "host key changed, or it stopped answering); the next pass retries")
        async with self._connecting:
            if self._conn is not None and not self._conn.is_closed():
                return self._conn
            errors = []
            for addr, port in self.addrs:
                try:
                    self._conn = await self._connect(addr, port)
                    self.addr, self.port = addr, port
                    return self._conn
                except HostKeyMismatch:
                    raise  # another machine answering at one of its addresses: stop here
                except NodeError as e:
                    errors.append(e)
            if len(errors) == 1:
                raise errors[0]
            raise NodeError(self.name, "no address answered: " + "; ".join(
                str(e).removeprefix(f"{self.name}: ") for e in errors))

    async def _connect(self, addr, port):
        if not self.host_key:
            raise NodeError(self.name, "has no pinned host key; add it again with "
                            "`flask llmgw add-node` to pin one")
        trusted = ([asyncssh.import_public_key(self.host_key)], [], [])
        if self.password:
            auth = {"password": self.password, "client_keys": None, "agent_path": None}
        elif self.agent_path:
            auth = {"agent_path": self.agent_path}
        else:
            auth = {"client_keys": [self.client_key], "agent_path": None}
        try:
            return await asyncio.wait_for(asyncssh.connect(
                addr, port, username=self.user, known_hosts=trusted, config=None,
                keepalive_interval=15, keepalive_count_max=3, **auth), self.connect_timeout)
        except asyncssh.HostKeyNotVerifiable as e:
            raise HostKeyMismatch(self.name, (
                f"the host key of {addr}:{port} is not the pinned one "
                f"({fingerprint(self.host_key)}); if the machine was really reinstalled, re-pin "
                f"it with `flask llmgw add-node {self.name} --addr {addr}:{port} --repin`")) from e
        except asyncssh.PermissionDenied as e:
            how = "the password" if self.password else "the control plane's key"
            raise NodeError(self.name, f"{self.user}@{addr} refused {how}; install the key with "
                            f"`flask llmgw add-node {self.name} --addr {addr} "
                            f"--bootstrap-key ~/.ssh/id_ed25519` (or --password)") from e
        except (OSError, asyncssh.Error, asyncio.TimeoutError) as e:
            raise NodeError(self.name, f"cannot connect to {addr}:{port}: "
                            f"{e or type(e).__name__}") from e

    async def run(self, argv, input=None, timeout=None):
        conn = await self._connection()
        command = shlex.join(["sudo", "-n", "--", *argv] if self.sudo else argv)
        try:
            async with self._sessions:
                done = await conn.run(command, input=input.encode() if isinstance(input, str) else input,
                                      check=False, timeout=timeout or self.command_timeout,
                                      encoding=None)
        except asyncssh.TimeoutError as e:
            raise NodeError(self.name, f"{command} did not finish in {timeout or self.command_timeout} s",
                            argv=argv) from e
        except (OSError, asyncssh.Error) as e:
            await self._drop()
            raise NodeError(self.name, f"lost the connection running {command}: "
                            f"{e or type(e).__name__}", argv=argv) from e
        status = done.exit_status if done.exit_status is not None else 255
        stderr = _text(done.stderr)
        if self.sudo and status == 1 and SUDO_NEEDS_PASSWORD in stderr:
            raise NodeError(self.name, f"sudo asks {self.user} for a password, and llmgw cannot type "
                            f"one; allow it without (\"{self.user} ALL=(ALL) NOPASSWD: ALL\" in "
                            f"/etc/sudoers.d/llmgw) or add the node with --user root", argv=argv)
        return Result(list(argv), status, _text(done.stdout), stderr)

    async def put(self, local_path, remote_path):
        conn = await self._connection()
        # SFTP writes as the SSH user; with sudo the file is staged in a directory the user may
        # write beside the target (same filesystem, so the move is a rename) and moved by root.
        target = remote_path
        if self.sudo:
            stage = posixpath.join(posixpath.dirname(remote_path), ".llmgw-upload")
            await self._prepare_stage(stage)
            target = posixpath.join(stage, secrets.token_hex(8))
        try:
            try:
                async with self._sessions:
                    async with conn.start_sftp_client() as sftp:
                        await sftp.put(str(local_path), target)
            except (OSError, asyncssh.Error) as e:
                raise NodeError(self.name, f"copying {local_path} to {remote_path} over SFTP failed: "
                                f"{e}. Check that the SFTP subsystem of sshd on {self.addr} is "
                                f"enabled.") from e
            if self.sudo:
                await self._move_in(target, remote_path)
        finally:
            if self.sudo:
                await self.run(["rm", "-f", target])  # nothing left behind when a copy fails

    async def send(self, local_path, remote_path, progress=None, max_rate=0):
        conn = await self._connection()
        # With sudo the bytes land in a staging file named after the target, so that a copy
        # cut short is found and continued there, and root moves it in once it is whole.
        stage = posixpath.join(posixpath.dirname(remote_path), ".llmgw-upload")
        target = posixpath.join(stage, posixpath.basename(remote_path)) if self.sudo else remote_path
        if self.sudo:
            await self._prepare_stage(stage)
        try:
            async with self._sessions:
                async with conn.start_sftp_client() as sftp:
                    try:
                        found = kept((await sftp.stat(target)).size or 0, local_path)
                    except asyncssh.SFTPNoSuchFile:
                        found = 0
                    async with sftp.open(target, "r+b" if found else "wb") as f:
                        done = await pump(local_path, found, f.write, progress, max_rate)
        except (OSError, asyncssh.Error) as e:
            raise NodeError(self.name, f"copying {local_path} to {remote_path} over SFTP stopped: "
                            f"{e or type(e).__name__}; the next attempt continues where it "
                            f"stopped") from e
        if self.sudo:
            await self._move_in(target, remote_path)
        return done

    async def _prepare_stage(self, stage):
        """A directory the SSH user may write (sudo nodes), beside the target: same filesystem."""
        await self.check(["sh", "-c", 'mkdir -p "$0" && chown "$1" "$0" && chmod 700 "$0"',
                          stage, self.user], what="preparing the upload directory")

    async def _move_in(self, staged, remote_path):
        await self.check(["sh", "-c", 'mv -f "$0" "$1" && chown 0:0 "$1"', staged, remote_path],
                         timeout=LONG_FILE_SECONDS, what=f"moving the upload into {remote_path}")

    async def _drop(self):
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def close(self):
        self._retired = True
        await self._drop()


def _text(value):
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
