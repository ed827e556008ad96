"""Which weights on a node may be deleted: pure, from a listing of <base>/models and what uses it.

A node's disk fills with models nobody runs any more. An entry of <base>/models (a .gguf file,
a model directory, a copy still in .partial) goes once no replica on the node has used it for
weights.keep_unused; nothing outside <base>/models is ever listed, so nothing there is touched,
and weights named with --node-path live wherever the operator put them and are never ours.
"""
from dataclasses import dataclass

# What a name in <base>/models must look like before llmgw would delete it: one path
# component, printable, not a dot entry.
UNSAFE = ("/", "\n", "\t", "\0")


@dataclass(frozen=True)
class Entry:
    name: str  # directly under <base>/models
    size: int  # bytes, the whole tree for a directory
    mtime: float  # seconds since the epoch


@dataclass(frozen=True)
class Verdict:
    entry: Entry
    users: tuple  # replica names using it now
    last_used: float  # seconds since the epoch: when a replica last used it, else its mtime
    collect: bool
    why: str


def stem(name):
    """Return the model entry a name belongs to: the .partial of a copy belongs to its target."""
    return name[:-len(".partial")] if name.endswith(".partial") else name


def plan(entries, users, seen, now, keep):
    """Return a Verdict for every entry.

    users: {entry name: [replica names]} of replicas placed on the node now (a copy under way
    counts: its .partial belongs to the same entry); seen: {entry name: epoch seconds} when a
    replica last used it; keep: weights.keep_unused in seconds (0: never collect).
    """
    out = []
    for e in sorted(entries, key=lambda e: e.name):
        key = stem(e.name)
        who = tuple(sorted(users.get(key, ())))
        last = max(seen.get(key, 0), e.mtime)
        if who:
            out.append(Verdict(e, who, now, False, "in use by " + ", ".join(who)))
        elif e.name in (".", "..") or any(c in e.name for c in UNSAFE) or e.name.startswith(".llmgw-upload"):
            out.append(Verdict(e, (), last, False, "not a name llmgw gives weights; left alone"))
        elif not keep:
            out.append(Verdict(e, (), last, False, "unused; weights.keep_unused is 0, so kept"))
        elif now - last >= keep:
            out.append(Verdict(e, (), last, True, f"unused for {int(now - last)} s "
                                                  f"(weights.keep_unused is {keep} s)"))
        else:
            out.append(Verdict(e, (), last, False, f"unused for {int(now - last)} s; collected "
                                                   f"after {keep} s"))
    return out


def parse_listing(text):
    """Return [Entry] from lines of 'SIZE<TAB>MTIME<TAB>NAME'; lines that do not parse are left
    out (and so never deleted)."""
    out = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        try:
            mtime = float(parts[1])
        except ValueError:
            continue
        out.append(Entry(parts[2], int(parts[0]), mtime))
    return out
