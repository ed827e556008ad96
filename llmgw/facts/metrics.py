"""An engine's own view of its load, from its Prometheus /metrics text."""

# Requests being worked on plus those queued, per engine's naming.
LOAD_SERIES = {
    "llamacpp:requests_processing", "llamacpp:requests_deferred",
    "vllm:num_requests_running", "vllm:num_requests_waiting",
    "sglang:num_running_reqs", "sglang:num_queue_reqs",
}


def parse_load(text):
    """Return running + waiting requests from /metrics text, or None when no known series is there."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0].strip()
        if name in LOAD_SERIES:
            try:
                total += float(value)
                seen = True
            except ValueError:
                continue
    return total if seen else None
