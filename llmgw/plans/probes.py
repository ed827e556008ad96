"""How to prove an engine llmgw does not install is really usable where the config names it."""
import re

VERSION = re.compile(r"\b(\d+\.\d+(?:\.\d+)?(?:[.+-][0-9A-Za-z.+-]*)?)\b")


def probe_argv(engine, path):
    """Return the argv that makes the engine at path say its version."""
    if engine == "vllm":
        return [path, "--version"]
    if engine == "sglang":
        return [path, "-c", "import sglang, sys; sys.stdout.write(sglang.__version__)"]
    raise ValueError(f"no probe for {engine!r}")


def parse_version(output):
    """Return the first version-looking word of a probe's output, or ''."""
    m = VERSION.search(output)
    return m.group(1) if m else ""
