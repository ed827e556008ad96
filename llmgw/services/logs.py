"""Read an engine's log lines from a node: journald under systemd, the log file under setsid."""
from ..facts import journal
from ..plans.launch import log_path


async def read(transport, supervisor, base_dir, unit, lines=100, cursor=""):
    """Return (lines, next cursor) of one unit's log, after cursor when one is given."""
    if supervisor == "systemd":
        result = await transport.run(journal.journal_argv(unit, lines, cursor), timeout=30)
        got, last = journal.parse_journal_json(result.stdout)
        return got, last or cursor
    result = await transport.run(journal.file_argv(log_path(base_dir, unit), lines, cursor), timeout=30)
    return journal.parse_file_output(result.stdout, cursor)
