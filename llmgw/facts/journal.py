"""Log lines of an engine: journald's JSON export and the fallback's plain log file."""
import datetime
import json

MAX_LINE = 4000


def journal_argv(unit, lines, cursor=""):
    """Return the journalctl argv for a unit's newest lines (after cursor when given)."""
    argv = ["journalctl", "--no-pager", "-o", "json", "-u", unit]
    if cursor:
        argv += ["--after-cursor", cursor]
    else:
        argv += ["-n", str(int(lines))]
    return argv


def parse_journal_json(text):
    """Return ([{'ts', 'text', 'unit'}], last cursor) from `journalctl -o json` output."""
    lines, cursor = [], ""
    for raw in text.splitlines():
        raw = raw.strip()
        if not raw.startswith("{"):
            continue
        try:
            entry = json.loads(raw)
        except json.JSONDecodeError:
            continue
        message = entry.get("MESSAGE", "")
        if isinstance(message, list):  # journald exports non-UTF-8 messages as byte arrays
            message = bytes(b for b in message if isinstance(b, int)).decode("utf-8", "replace")
        stamp = entry.get("__REALTIME_TIMESTAMP", "")
        ts = ""
        if str(stamp).isdigit():
            ts = datetime.datetime.fromtimestamp(
                int(stamp) / 1e6, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        lines.append({"ts": ts, "text": str(message)[:MAX_LINE],
                      "unit": entry.get("_SYSTEMD_UNIT", entry.get("UNIT", ""))})
        cursor = entry.get("__CURSOR", cursor)
    return lines, cursor


def file_argv(path, lines, offset=""):
    """Return the argv reading a log file: its tail, or everything after a byte offset.

    The output starts with the file's size so the next read knows where to begin.
    """
    if offset:
        script = 'wc -c < "$0" 2>/dev/null || echo 0; tail -c +$(($1 + 1)) "$0" 2>/dev/null | head -c 1048576'
        return ["sh", "-c", script, path, str(int(offset))]
    script = 'wc -c < "$0" 2>/dev/null || echo 0; tail -n "$1" "$0" 2>/dev/null'
    return ["sh", "-c", script, path, str(int(lines))]


def parse_file_output(text, offset=""):
    """Return ([{'ts', 'text', 'unit'}], next offset) from file_argv's output."""
    size, _, body = text.partition("\n")
    size = size.strip()
    lines = [{"ts": "", "text": line[:MAX_LINE], "unit": ""} for line in body.splitlines()]
    if offset:
        # Resume exactly where this read stopped, which is the size only when nothing was cut off.
        return lines, str(int(offset) + len(body.encode()))
    return lines, size if size.isdigit() else ""
