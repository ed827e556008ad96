"""The argv that starts, finds and stops an engine under systemd or the setsid fallback."""
import posixpath
from dataclasses import dataclass

# Every unit llmgw starts carries this description; listings trust nothing else.
DESCRIPTION = "llmgw engine"


@dataclass(frozen=True)
class Serve:
    """What one replica's engine is started with, beyond its binary."""

    engine: str
    binary: str
    model_path: str
    model_name: str
    port: int
    args: tuple = ()
    host: str = "0.0.0.0"
    cards: tuple = ()  # the claimed GPU UUIDs
    card_indexes: tuple = ()  # the same cards' indexes as nvidia-smi numbers them now
    card_fraction: float = 0.0  # of each card's memory the engine may take; 0: the engine's own
    context: int = 0
    cuda: bool = False  # the engine build offloads to NVIDIA GPUs
    key_file: str = ""  # the file on the node holding the engine's own API key; "": none


def engine_argv(s):
    """Return the argv one replica's engine is started with: its own flags, then its API key.

    The key is read on the node from s.key_file (mode 0600), never written into an argv the
    control plane sends or the unit's properties, which any local user can read with ps or
    systemctl show. llama-server and the simulated engine read the file themselves; vLLM reads
    VLLM_API_KEY, set from the file by a shell that then execs it. SGLang takes its key only as
    --api-key, so the shell puts it there: its command line on the node shows the key to local
    users of that node (docs/security.md says so).
    """
    argv = _engine_flags(s)
    if not s.key_file:
        return argv
    if s.engine in ("sim", "llamacpp"):
        return [*argv, "--api-key-file", s.key_file]
    # Without its key the engine must not start at all: an empty key is no key to either.
    read = 'k=$(cat "$0") && [ -n "$k" ] || { echo "llmgw: no API key in $0" >&2; exit 1; }; '
    if s.engine == "vllm":
        return ["sh", "-c", read + 'VLLM_API_KEY=$k; export VLLM_API_KEY; exec "$@"', s.key_file, *argv]
    return ["sh", "-c", read + 'exec "$@" --api-key "$k"', s.key_file, *argv]


def _engine_flags(s):
    """Return the engine's own argv for one replica, listening on host:port."""
    if s.engine == "sim":
        return ["python3", s.binary, "--model", s.model_name, "--host", s.host,
                "--port", str(s.port), *s.args]
    if s.engine == "vllm":
        return [s.binary, "serve", s.model_path, "--served-model-name", s.model_name,
                "--host", s.host, "--port", str(s.port), *_python_engine_sizes(s), *s.args]
    if s.engine == "sglang":
        return [s.binary, "-m", "sglang.launch_server", "--model-path", s.model_path,
                "--served-model-name", s.model_name, "--host", s.host, "--port", str(s.port),
                *_python_engine_sizes(s), *s.args]
    return [s.binary, "-m", s.model_path, "--alias", s.model_name, "--host", s.host,
            "--port", str(s.port), "--metrics", *_llamacpp_sizes(s), *s.args]


def _llamacpp_sizes(s):
    out = []
    if s.cards and s.cuda:
        # Every layer on the cards; several cards split the layers evenly between them.
        out += ["-ngl", "999"]
        if len(s.cards) > 1:
            out += ["--split-mode", "layer", "--tensor-split", ",".join("1" for _ in s.cards)]
    if s.context:
        out += ["--ctx-size", str(s.context)]
    return out


# Each Python engine's own names for: tensor parallel size, memory fraction, context length.
SIZE_FLAGS = {"vllm": ("--tensor-parallel-size", "--gpu-memory-utilization", "--max-model-len"),
              "sglang": ("--tp", "--mem-fraction-static", "--context-length")}


def _python_engine_sizes(s):
    parallel, fraction, context = SIZE_FLAGS[s.engine]
    out = [parallel, str(max(len(s.cards), 1))]
    if s.card_fraction:
        out += [fraction, f"{s.card_fraction:.2f}"]
    if s.context:
        out += [context, str(s.context)]
    return out


# Engines that read CUDA_VISIBLE_DEVICES themselves and take each entry for a number: vLLM
# fails to start on a GPU UUID there ("invalid literal for int()" in its device mapping).
NUMBERS_ONLY = ("vllm", "sglang")


def gpu_env(s):
    """Return the environment that pins an engine to its claimed cards (none: no GPU at all).

    UUIDs where the engine takes them: a UUID names the same card whatever the numbering.
    Engines that want numbers get the cards' indexes as nvidia-smi gives them now, which is PCI
    bus order, and CUDA_DEVICE_ORDER=PCI_BUS_ID makes CUDA count the same way (left alone it
    puts what it thinks the fastest card first). LLMGW_GPU_UUIDS names the claim either way.
    """
    shown = [str(i) for i in s.card_indexes] if s.engine in NUMBERS_ONLY else list(s.cards)
    env = {"CUDA_VISIBLE_DEVICES": ",".join(shown), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if s.cards:
        env["LLMGW_GPU_UUIDS"] = ",".join(s.cards)
    return env


def supervisor_for(facts):
    """Return 'systemd' when systemd is PID 1 and we are root there, else 'setsid'."""
    return "systemd" if facts.get("systemd") and facts.get("uid") == 0 else "setsid"


def run_dir(base_dir):
    return posixpath.join(base_dir, "run")


def key_path(base_dir, unit):
    return posixpath.join(run_dir(base_dir), f"{unit}.key")


def key_write_argv(base_dir, unit):
    """Return the argv that writes the API key given on stdin to the unit's key file, mode 0600.

    Written whole and renamed into place: an engine restarted by its supervisor meanwhile reads
    the old key or the new one, never half of one."""
    return ["sh", "-c", 'umask 077 && mkdir -p "$(dirname "$0")" && cat > "$0.new" && mv -f "$0.new" "$0"',
            key_path(base_dir, unit)]


def log_path(base_dir, unit):
    return posixpath.join(base_dir, "logs", f"{unit}.log")


def start_argv(supervisor, unit, argv, base_dir, env=None):
    """Return the argv that starts argv as unit under the supervisor and returns at once."""
    env = env or {}
    if supervisor == "systemd":
        # systemd expands $VAR and ${VAR} in a service's command line when it starts it
        # (`$$` is a dollar): a model named a${HOME} would run as a/root. The other way runs
        # the argv through exec, which expands nothing.
        return ["systemd-run", f"--unit={unit}", "--property=Restart=on-failure",
                "--property=RestartSec=2", f"--description={DESCRIPTION} {unit}",
                *(f"--setenv={k}={v}" for k, v in sorted(env.items())), "--collect",
                *(arg.replace("$", "$$") for arg in argv)]
    pidfile = posixpath.join(run_dir(base_dir), f"{unit}.pid")
    log = log_path(base_dir, unit)
    # $0 is the unit name and "$@" the engine: the pidfile holds the engine's own pid
    # because exec keeps it.
    script = ('mkdir -p "$(dirname "$PIDFILE")" "$(dirname "$LOG")"; '
              'echo $$ > "$PIDFILE"; exec "$@" >>"$LOG" 2>&1 </dev/null')
    return ["env", f"PIDFILE={pidfile}", f"LOG={log}", "LLMGW_UNIT=" + unit,
            *(f"{k}={v}" for k, v in sorted(env.items())), "setsid", "-f", "sh", "-c", script, unit, *argv]


def list_argv(supervisor, base_dir):
    """Return the argv listing llmgw-* engines in any state, one 'UNIT STATE' line each.

    Every state, not only active ones: a crash-looping unit spends most of its time
    'activating' (auto-restart) and must still be found to be stopped.
    """
    if supervisor == "systemd":
        # Only units we started: the description says so. A node may run other llmgw-*
        # units (the control plane's own llmgw-web when it is also a node) that are not ours.
        return ["sh", "-c", "systemctl list-units --all --plain --no-legend 'llmgw-*' "
                f"| awk '$5 == \"{DESCRIPTION.split()[0]}\" && $6 == \"{DESCRIPTION.split()[1]}\" "
                "{print $1, $3}' | sed 's/\\.service / /'"]
    # A pidfile outlives a reboot and pids are reused: a process is ours only while its
    # environment still carries the unit name it was started with.
    script = ('for f in "$0"/llmgw-*.pid; do [ -e "$f" ] || continue; u=$(basename "$f" .pid); '
              'p=$(cat "$f"); if [ -n "$p" ] && tr "\\0" "\\n" < /proc/"$p"/environ 2>/dev/null '
              '| grep -qx "LLMGW_UNIT=$u"; then echo "$u active"; else rm -f "$f"; fi; done')
    return ["sh", "-c", script, run_dir(base_dir)]


def stop_argv(supervisor, unit, base_dir):
    """Return the argv that stops a unit and forgets it, its API key file included."""
    key = key_path(base_dir, unit)
    if supervisor == "systemd":
        return ["sh", "-c", 'systemctl stop "$0" 2>/dev/null; systemctl reset-failed "$0" 2>/dev/null; '
                            'rm -f "$1"; true', f"{unit}.service", key]
    pidfile = posixpath.join(run_dir(base_dir), f"{unit}.pid")
    script = ('p=$(cat "$0" 2>/dev/null); if [ -n "$p" ] && tr "\\0" "\\n" < /proc/"$p"/environ 2>/dev/null '
              '| grep -qx "LLMGW_UNIT=$1"; then kill "$p"; fi; rm -f "$0" "$2"; true')
    return ["sh", "-c", script, pidfile, unit, key]


def parse_units(text):
    """Return {replica name: state} from list_argv output ('llmgw-<name> STATE' lines)."""
    units = {}
    for line in text.splitlines():
        words = line.split()
        if words and words[0].startswith("llmgw-"):
            units[words[0][len("llmgw-"):]] = words[1] if len(words) > 1 else "active"
    return units
