"""The argv that starts, finds and stops an engine under systemd or the setsid fallback."""
import posixpath

# Every unit llmgw starts carries this description; listings trust nothing else.
DESCRIPTION = "llmgw engine"


def engine_argv(engine, binary, model_path, model_name, port, extra_args, host="0.0.0.0"):
    """Return the engine's own argv for one replica, listening on host:port."""
    if engine == "sim":
        return ["python3", binary, "--model", model_name, "--host", host,
                "--port", str(port), *extra_args]
    return [binary, "-m", model_path, "--alias", model_name, "--host", host,
            "--port", str(port), "--metrics", *extra_args]


def supervisor_for(facts):
    """Return 'systemd' when systemd is PID 1 and we are root there, else 'setsid'."""
    return "systemd" if facts.get("systemd") and facts.get("uid") == 0 else "setsid"


def run_dir(base_dir):
    return posixpath.join(base_dir, "run")


def log_path(base_dir, unit):
    return posixpath.join(base_dir, "logs", f"{unit}.log")


def start_argv(supervisor, unit, argv, base_dir):
    """Return the argv that starts argv as unit under the supervisor and returns at once."""
    if supervisor == "systemd":
        return ["systemd-run", f"--unit={unit}", "--property=Restart=on-failure",
                "--property=RestartSec=2", f"--description={DESCRIPTION} {unit}",
                "--collect", *argv]
    pidfile = posixpath.join(run_dir(base_dir), f"{unit}.pid")
    log = log_path(base_dir, unit)
    # $0 is the unit name and "$@" the engine: the pidfile holds the engine's own pid
    # because exec keeps it.
    script = ('mkdir -p "$(dirname "$PIDFILE")" "$(dirname "$LOG")"; '
              'echo $$ > "$PIDFILE"; exec "$@" >>"$LOG" 2>&1 </dev/null')
    return ["env", f"PIDFILE={pidfile}", f"LOG={log}", "LLMGW_UNIT=" + unit,
            "setsid", "-f", "sh", "-c", script, unit, *argv]


def list_argv(supervisor, base_dir):
    """Return the argv listing running llmgw-* engines, one unit name per line."""
    if supervisor == "systemd":
        # Only units we started: the description says so. A node may run other llmgw-*
        # units (the control plane's own llmgw-web when it is also a node) that are not ours.
        return ["sh", "-c", "systemctl list-units --plain --no-legend --state=active 'llmgw-*' "
                f"| awk '$5 == \"{DESCRIPTION.split()[0]}\" && $6 == \"{DESCRIPTION.split()[1]}\" "
                "{print $1}' | sed 's/\\.service$//'"]
    # A pidfile outlives a reboot and pids are reused: a process is ours only while its
    # environment still carries the unit name it was started with.
    script = ('for f in "$0"/llmgw-*.pid; do [ -e "$f" ] || continue; u=$(basename "$f" .pid); '
              'p=$(cat "$f"); if [ -n "$p" ] && tr "\\0" "\\n" < /proc/"$p"/environ 2>/dev/null '
              '| grep -qx "LLMGW_UNIT=$u"; then echo "$u"; else rm -f "$f"; fi; done')
    return ["sh", "-c", script, run_dir(base_dir)]


def stop_argv(supervisor, unit, base_dir):
    """Return the argv that stops a unit and forgets it."""
    if supervisor == "systemd":
        return ["sh", "-c", 'systemctl stop "$0" 2>/dev/null; systemctl reset-failed "$0" 2>/dev/null; true',
                f"{unit}.service"]
    pidfile = posixpath.join(run_dir(base_dir), f"{unit}.pid")
    script = ('p=$(cat "$0" 2>/dev/null); if [ -n "$p" ] && tr "\\0" "\\n" < /proc/"$p"/environ 2>/dev/null '
              '| grep -qx "LLMGW_UNIT=$1"; then kill "$p"; fi; rm -f "$0"; true')
    return ["sh", "-c", script, pidfile, unit]


def parse_units(text):
    """Return the set of replica names from list_argv output (llmgw-<name> lines)."""
    names = set()
    for line in text.split():
        line = line.strip()
        if line.startswith("llmgw-"):
            names.add(line[len("llmgw-"):])
    return names
