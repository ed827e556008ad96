"""Install an engine on a node: verified, complete, or not at all."""
import asyncio
import datetime
import json
import posixpath
import time
from importlib import resources

from ..errors import InstallError, LlmgwError
from ..facts.host import packaging_family
from ..facts.ldd import missing_libraries
from ..models import EngineInstall, NodeEvent, utcnow
from ..executors import archive_read
from ..executors.transport import LONG_FILE_SECONDS
from ..facts import tarlist
from ..plans import archive, packages
from ..plans.engines import Unsupported, choose, slow_cpu_warning
from ..plans.probes import parse_version, probe_argv

MARKER = ".llmgw-installed"
RETRY_FIRST, RETRY_MAX = 60, 600


def engine_dir(base_dir, build):
    return posixpath.join(base_dir, "engines", build.engine, build.dirname)


class Installer:
    """Brings one engine on one node to ready, recording every step on its EngineInstall row."""

    def __init__(self, node, transport, releases, verify_interval=600, lock_retry=None,
                 on_node=False):
        self.node, self.t, self.releases = node, transport, releases
        self.on_node = on_node
        self.verify_interval = verify_interval
        self.lock_retry = packages.LOCK_RETRY_SECONDS if lock_retry is None else lock_retry

    def row(self, engine, version):
        row, _ = EngineInstall.get_or_create(node=self.node, engine=engine,
                                             defaults={"version": version})
        return row

    def _set(self, row, state, detail, **fields):
        was = row.state
        row.state, row.detail, row.updated = state, detail, utcnow()
        for k, v in fields.items():
            setattr(row, k, v)
        row.save()
        if state != was:  # the node's history gets each change of state, not every step
            NodeEvent.create(node=self.node, text=f"{row.engine} {row.version} {state}: {detail}")

    async def converge(self, engine, version):
        """Install or re-verify engine@version; return the row with its final state."""
        row = self.row(engine, version)
        if row.version != version:
            row.version, row.failures = version, 0
        try:
            build = choose(engine, version, self.node.facts or {})
        except Unsupported as e:
            self._set(row, "unsupported", str(e), variant="", binary="",
                      next_check=_later(self.verify_interval))
            return row
        row.variant = build.variant
        try:
            binary, version_line = await self._install_or_verify(row, build)
        except (LlmgwError, OSError) as e:
            row.failures += 1
            delay = min(RETRY_FIRST * 2 ** (row.failures - 1), RETRY_MAX)
            self._set(row, "failed", str(e), binary="", next_check=_later(delay))
            return row
        detail = " ".join(x for x in (posixpath.basename(binary), version_line) if x)
        warning = slow_cpu_warning(build, self.node.facts or {})
        if warning:
            detail += "; " + warning
        self._set(row, "ready", detail, binary=binary, failures=0,
                  next_check=_later(self.verify_interval))
        return row

    async def _install_or_verify(self, row, build):
        final = engine_dir(self.node.base_dir, build)
        await self._packages(row, build)
        marker = await self.t.run(["cat", posixpath.join(final, MARKER)])
        if marker.ok:
            try:
                binary = posixpath.join(final, json.loads(marker.stdout)["binary"])
                return binary, await self._verify(build, binary)
            except (InstallError, ValueError, KeyError):
                self._set(row, "installing", "the installed build no longer runs; installing it again")
        return await self._install(row, build, final)

    async def _install(self, row, build, final):
        scratch = final + ".partial"
        await self.t.check(["rm", "-rf", scratch])
        await self.t.check(["mkdir", "-p", scratch])
        try:
            binary_rel, sums = await self._unpack_and_check(row, build, scratch)
        except BaseException:
            # Nothing of a failed install stays behind to be mistaken for part of one.
            await self.t.run(["rm", "-rf", scratch])
            raise
        marker = json.dumps({"engine": build.engine, "version": build.version,
                             "variant": build.variant, "binary": binary_rel, "sha256": sums,
                             "installed": utcnow().isoformat()}, indent=1)
        await self.t.check(["sh", "-c", 'cat > "$0"', posixpath.join(scratch, MARKER)], input=marker)
        # Renamed into place only now: a half-finished install never looks installed.
        await self.t.check(["rm", "-rf", final])
        await self.t.check(["mv", scratch, final])
        binary = posixpath.join(final, binary_rel)
        return binary, await self._verify(build, binary)

    async def _unpack_and_check(self, row, build, scratch):
        """Fill scratch with the build and prove it runs; return (binary path inside, sha256s)."""
        sums = {}
        if build.engine == "sim":
            script = resources.files("llmgw").joinpath("scripts/sim_engine.py")
            with resources.as_file(script) as path:
                await self.t.put(str(path), posixpath.join(scratch, build.binary))
        for asset in build.assets:
            sums[asset] = await self._push_asset(row, build, asset, scratch)
        self._set(row, "installing", f"checking that {build.binary} runs")
        found = await self.t.check(["find", scratch, "-name", build.binary, "-type", "f"])
        paths = sorted(found.stdout.splitlines(), key=len)  # a base dir may hold a space
        if not paths:
            raise InstallError(f"the build has no {build.binary} in it")
        await self._verify(build, paths[0])
        return posixpath.relpath(paths[0], scratch), sums

    async def _push_asset(self, row, build, asset, scratch):
        self._set(row, "installing", f"asking for the checksums of {build.engine} {build.version}")
        want = await asyncio.to_thread(self.releases.digest, build.repo, build.version, asset)
        remote = posixpath.join(scratch, asset)
        if self.on_node:
            await self._download_on_node(row, build, asset, remote)
        else:
            members = await self._copy_from_cache(row, build, asset, remote)
        got = (await self.t.check(["sha256sum", remote], timeout=LONG_FILE_SECONDS)).stdout.split()[:1]
        if got != [want]:
            if self.on_node:  # the published checksum may be what is wrong: read it again next time
                await asyncio.to_thread(self.releases.forget, build.repo, build.version)
            where = "downloaded on the node" if self.on_node else "arrived on the node damaged"
            raise InstallError(f"{asset} {where} does not match the sha256 checksum its publisher "
                               f"gave ({(got or ['?'])[0][:12]}…, expected {want[:12]}…)")
        if self.on_node:
            listing = (await self.t.check(tarlist.listing_argv(remote, archive.MAX_MEMBERS),
                                          timeout=LONG_FILE_SECONDS)).stdout
            members = tarlist.parse_listing(listing)
            why = archive.too_big(len(members), tarlist.unpacked_bytes(listing))
            if why:
                raise InstallError(f"{asset} was refused: {why}")
        bad = archive.refusals(members)
        if bad:
            raise InstallError(f"{asset} was refused: " + "; ".join(bad[:3]))
        self._set(row, "installing", f"unpacking {asset}")
        await self.t.check(["tar", "-xzf", remote, "-C", scratch, "--no-same-owner"],
                           what=f"unpacking {asset}")
        await self.t.check(["rm", "-f", remote])
        return want

    async def _copy_from_cache(self, row, build, asset, remote):
        """Download once into the control plane's cache, check the archive, copy it over."""
        def progress(text):
            self._set(row, "installing", text)
        local = await asyncio.to_thread(self.releases.asset, build.repo, build.version, asset, progress)
        members = await asyncio.to_thread(archive_read.tar_members, local)
        self._set(row, "installing", f"copying {asset} to the node")
        await self.t.put(str(local), remote)
        return members

    async def _download_on_node(self, row, build, asset, remote):
        """Let the node fetch the asset itself (engines.download_on_node)."""
        url = self.releases.url(build.repo, build.version, asset)
        tools = (self.node.facts or {}).get("tools", [])
        if "curl" in tools:
            argv = ["curl", "-fsSL", "--retry", "2", "-o", remote, url]
        elif "wget" in tools:
            argv = ["wget", "-q", "-O", remote, url]
        else:
            raise InstallError("the node has neither curl nor wget to download with; install one, "
                               "or set engines.download_on_node = false to push from the control plane")
        self._set(row, "installing", f"downloading {asset} on the node")
        await self.t.check(argv, timeout=3600, what=f"downloading {asset} on the node")

    async def _verify(self, build, binary):
        """Prove the build runs: ldd names what is missing, --version proves the rest."""
        if build.engine == "sim":
            result = await self.t.run(["python3", binary, "--version"], timeout=60)
        else:
            ldd = await self.t.run(["ldd", binary], timeout=60)
            missing = missing_libraries(ldd.stdout + ldd.stderr)
            if missing:
                raise InstallError(f"{build.binary} cannot run on this system: " + "; ".join(missing))
            result = await self.t.run([binary, "--version"], timeout=60)
        if not result.ok:
            raise InstallError(f"{build.binary} --version failed (exit {result.exit_status}): "
                               f"{result.tail()}")
        text = result.stdout + "\n" + result.stderr
        return next((line.strip() for line in text.splitlines() if "version" in line.lower()), "")

    async def _packages(self, row, build):
        """Install only the OS packages the build needs and the node lacks."""
        facts = self.node.facts or {}
        family = packaging_family(facts.get("os", {}))
        wanted = build.packages.get(family, ())
        if not wanted:
            return
        missing = [p for p in wanted
                   if not (await self.t.run(packages.query_argv(family, p))).ok]
        if not missing:
            return
        tool, commands = packages.install_plan(family, missing, facts.get("tools", []))
        if not tool:
            raise InstallError(f"{', '.join(missing)} is missing and the node has no package "
                               f"manager llmgw can use to install it")
        self._set(row, "installing", f"installing {', '.join(missing)} with {tool}")
        for argv in commands:
            await self._run_waiting_for_lock(row, tool, argv)

    async def _run_waiting_for_lock(self, row, tool, argv):
        deadline = time.monotonic() + packages.LOCK_WAIT_SECONDS
        while True:
            result = await self.t.run(argv, timeout=packages.LOCK_WAIT_SECONDS + 60)
            if result.ok:
                return
            output = result.stdout + result.stderr
            if not packages.lock_held(output) or time.monotonic() > deadline:
                raise InstallError(f"{' '.join(argv)} failed (exit {result.exit_status}): {result.tail()}")
            self._set(row, "installing", f"waiting for another {tool} to finish "
                                         f"(a new machine runs its own updates first)")
            await asyncio.sleep(self.lock_retry)


def _later(seconds):
    return utcnow() + datetime.timedelta(seconds=seconds)




async def probe(transport, engine, path):
    """Run an engine's probe on the node; return (ok, sentence)."""
    result = await transport.run(probe_argv(engine, path), timeout=120)
    if not result.ok:
        what = "is not there" if result.exit_status in (126, 127) else f"failed (exit {result.exit_status})"
        return False, f"{engine} at {path} {what}: {result.tail()}"
    version = parse_version(result.stdout + " " + result.stderr)
    if not version:
        return False, f"{engine} at {path} ran but said no version: {result.tail()}"
    return True, f"{engine} {version} at {path}"


async def converge_probed(node, transport, engine, path, verify_interval):
    """Record whether a configured engine runs: ready with its version, or failed with why."""
    row, _ = EngineInstall.get_or_create(node=node, engine=engine, defaults={"version": ""})
    ok, sentence = await probe(transport, engine, path)
    row.state, row.detail, row.updated = ("ready" if ok else "failed"), sentence, utcnow()
    row.version = sentence.split()[1] if ok else row.version
    row.binary, row.variant = path, "configured"
    row.next_check = _later(verify_interval if ok else RETRY_FIRST)
    row.save()
    return row
