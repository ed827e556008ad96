"""The exceptions llmgw raises; library errors are converted into these at the boundary."""


class LlmgwError(Exception):
    """Base of every error llmgw reports to a person."""


class ConfigError(LlmgwError):
    """The configuration file or an override cannot be used."""


class NodeError(LlmgwError):
    """A node could not be reached or a command on it failed."""

    def __init__(self, node, message, argv=None, exit_status=None, stderr=""):
        self.node = node
        self.argv = argv
        self.exit_status = exit_status
        self.stderr = stderr
        super().__init__(f"{node}: {message}")


class HostKeyMismatch(NodeError):
    """The node presented a host key other than the pinned one."""


class InstallError(LlmgwError):
    """An engine could not be installed or verified on a node."""


class ReleaseError(InstallError):
    """The release metadata or archive could not be fetched or trusted."""
