"""Read an engine's log lines from a node: journald under systemd, the log file under setsid."""
import re

from ..facts import journal
from ..models import utcnow
from ..plans.launch import log_path

# An engine's answer to a health or metrics probe (llmgw's own, every few seconds): hidden in
# the log pane unless asked for.
PROBE = re.compile(r"\b(GET|HEAD)\s+/(health|metrics|v1/models)\b|\bpath=/(health|metrics)\b")


async def read(transport, supervisor, base_dir, unit, lines=100, cursor=""):
    """Return (lines, next cursor) of one unit's log, after cursor when one is given.

    journald stamps every line. A log file's lines (the setsid supervisor) carry no time of
    their own: a line read after the cursor is stamped with when it was read (within a second
    of being written, for a followed pane); the first read's lines with "≤" that time."""
    if supervisor == "systemd":
        result = await transport.run(journal.journal_argv(unit, lines, cursor), timeout=30)
        got, last = journal.parse_journal_json(result.stdout)
        return got, last or cursor
    result = await transport.run(journal.file_argv(log_path(base_dir, unit), lines, cursor), timeout=30)
    got, nxt = journal.parse_file_output(result.stdout, cursor)
    now = utcnow().strftime("%Y-%m-%d %H:%M:%S")
    for line in got:
        line["ts"] = line["ts"] or (now if cursor else f"≤{now}")
    return got, nxt


def is_probe(line):
    return bool(PROBE.search(line.get("text", "")))
