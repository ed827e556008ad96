"""CPU seconds (user + system) used by llmgw's workers and by every PostgreSQL process on the
machine (with what its exited children used: backends that came and went count too).

    python3 bench/cpu.py snap PID...                 -> "WORKERS_S DB_S"
    python3 bench/cpu.py since LABEL W0 D0 PID...    -> one JSON line of what was used since
"""
import json
import os
import sys


def seconds(pid, children=False):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0.0  # gone since it was listed
    # After the name: state is field 3, utime 14, stime 15, cutime 16, cstime 17 (1-based).
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def named(name):
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() == name:
                        yield pid
            except OSError:
                pass


def snap(pids):
    return (sum(seconds(p) for p in pids),
            sum(seconds(p, children=True) for p in named("postgres")))


def main(argv):
    if argv[0] == "snap":
        print("%.2f %.2f" % snap(argv[1:]))
    else:
        label, w0, d0, pids = argv[1], float(argv[2]), float(argv[3]), argv[4:]
        w, d = snap(pids)
        print(json.dumps({"label": label, "workers_s": round(w - w0, 2), "db_s": round(d - d0, 2)}))


if __name__ == "__main__":
    main(sys.argv[1:])
