"""What the control plane ran on each node, for the node page's second pane: every command a
transport runs in the reconciler is noted in memory as it ends, and written once per pass."""
import collections
import datetime
import shlex
import time

from ..models import Node, NodeCommand, database, utcnow

KEEP_SECONDS = 86400  # rows older than a day are deleted
MAX_TEXT = 400  # a command's text is cut to this many characters (a long script stays readable)
PENDING_MAX = 20000  # noted but not yet written: the oldest go first if the database is away
PRUNE_SECONDS = 60

pending = collections.deque(maxlen=PENDING_MAX)
recording = False  # set by the reconciler; a command run by the CLI is not noted
pruned_at = 0.0


def note(node_name, argv, exit_status, seconds, error=""):
    if not recording:
        return
    text = shlex.join(str(a) for a in argv)
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT] + "…"
    pending.append((node_name, utcnow(), text, exit_status, round(seconds, 3), error[:MAX_TEXT]))


def flush(now=None):
    """Write what was noted (one INSERT) and, once a minute, delete rows past KEEP_SECONDS;
    return rows written."""
    global pruned_at
    taken = []
    while pending:
        taken.append(pending.popleft())
    if not taken:
        return 0
    ids = dict(Node.select(Node.name, Node.id).where(Node.name.in_({t[0] for t in taken})).tuples())
    rows = [{"node": ids[name], "created": at, "command": text, "exit_status": status, "seconds": seconds,
             "error": error} for name, at, text, status, seconds, error in taken if name in ids]
    with database.atomic():
        if rows:
            NodeCommand.insert_many(rows).execute()
        if time.monotonic() - pruned_at > PRUNE_SECONDS:
            pruned_at = time.monotonic()
            NodeCommand.delete().where(
                NodeCommand.created < (now or utcnow()) - datetime.timedelta(seconds=KEEP_SECONDS)).execute()
    return len(rows)
