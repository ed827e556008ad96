"""OS packages: how each packaging family asks and installs, and what a held lock looks like."""

# Waiting this long for another package manager (cloud-init, unattended-upgrades) to finish.
LOCK_WAIT_SECONDS = 600
LOCK_RETRY_SECONDS = 10

LOCK_MESSAGES = ("Unable to lock", "Could not get lock", "is locked by another process",
                 "waiting for process with pid", "System management is locked")


def query_argv(family, package):
    """Return an argv that exits 0 only when the package is installed."""
    if family == "deb":
        # dpkg -s succeeds for a package merely known; the status must be "ii".
        return ["sh", "-c", 'test "$(dpkg-query -W -f=\'${db:Status-Abbrev}\' "$0" 2>/dev/null)" = "ii "',
                package]
    if family == "rpm":
        return ["rpm", "-q", package]
    raise ValueError(f"unknown packaging family {family!r}")


def install_plan(family, packages, tools):
    """Return (tool, [argv, ...]) installing packages with what the node has, or ('', [])."""
    pkgs = list(packages)
    if family == "deb" and "apt-get" in tools:
        lock = "-o=DPkg::Lock::Timeout=600"
        return "apt-get", [["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", lock, "update"],
                           ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", lock, "install",
                            "-y", "--no-install-recommends", *pkgs]]
    if family == "rpm":
        for tool in ("dnf", "yum"):
            if tool in tools:
                return tool, [[tool, "install", "-y", *pkgs]]
        if "zypper" in tools:
            return "zypper", [["zypper", "--non-interactive", "install", *pkgs]]
    return "", []


def lock_held(output):
    """Return whether a failed package command failed only on another's lock."""
    return any(m in output for m in LOCK_MESSAGES)
