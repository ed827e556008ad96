"""A weights copy's progress, written to its replica's row as it goes."""
import time

from ..models import NodeEvent, Replica
from ..plans.sizing import human_bytes


class Progress:
    """Writes a copy's progress to its replica's row, at most once a second, and its history
    line when it ends: bytes done of the total, rate, time left, and where it resumed."""

    EVERY = 1.0

    def __init__(self, replica, node, where):
        self.replica, self.node, self.where = replica, node, where
        self.started = time.monotonic()
        self.written = 0.0
        self.finished = False

    def tell(self, done, total, sent, found):
        now = time.monotonic()
        whole = total > 0 and done >= total
        if self.finished or now - self.written < self.EVERY and not whole:
            return
        self.written = now
        elapsed = max(now - self.started, 1e-3)
        rate = sent / elapsed
        eta = int((total - done) / rate) if rate > 0 and total > done else 0
        value = {"done": done, "total": total, "sent": sent, "resumed_from": found,
                 "rate": int(rate), "eta": eta}
        Replica.update(progress=value).where(self.where(self.replica)).execute()
        if whole:
            self.finished = True
            NodeEvent.create(node=self.node, text=(
                f"{self.replica.name}: {self.replica.model.name}'s weights copied, "
                f"{human_bytes(sent)} sent"
                + (f" after resuming at {human_bytes(found)}" if found else "")
                + f" in {elapsed:.0f} s"))

