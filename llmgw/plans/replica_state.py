"""What to do next with one replica, from what was seen of it. Pure."""

RETRY_FIRST, RETRY_MAX = 30, 600
# Rows whose engine is on its way out: they fill no slot of their model.
LEAVING = ("draining", "stopping", "lost")
# Rows the gateway sends requests to: a draining one serves until its replacement does.
ROUTED = ("ready", "draining")


def retry_delay(failures):
    """Seconds to wait before starting a replica that has failed `failures` times in a row.

    The first failure is retried at once: an engine killed once (OOM, a stray kill -9) on a
    node without systemd was down for over 40 s waiting out a first delay of 30 s. A second
    failure in a row looks like a crash loop, and backs off from there.
    """
    if failures <= 1:
        return 0
    return min(RETRY_FIRST * 2 ** (failures - 2), RETRY_MAX)


def next_step(state, running, healthy, age, health_timeout, failures):
    """Return the action for a replica: ready, unhealthy, adopt, give_up, crashed, start or wait.

    state: what the row says; running: its unit runs on the node; healthy: /health answered;
    age: seconds since the row last changed; failures: failed starts in a row.
    """
    if running:
        if healthy:
            return "ready" if state != "ready" else "wait"
        if state == "ready":
            return "unhealthy"
        if state in ("starting", "unhealthy"):
            return "give_up" if age > health_timeout else "wait"
        return "adopt"  # running, but the row thought otherwise: watch it start
    if state in ("starting", "ready", "unhealthy"):
        return "crashed"
    if state == "failed" and age < retry_delay(failures):
        return "wait"
    return "start"
