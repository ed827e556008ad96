# Sent to a node on stdin by the control plane; prints one section per fact.
# $1 is the node's llmgw directory, whose disk is reported too.
base="${1:-/opt/llmgw}"
echo "== os-release"; cat /etc/os-release 2>/dev/null
echo "== arch"; uname -m
echo "== cpu"; grep -m1 -E '^(flags|Features)[[:space:]]*:' /proc/cpuinfo 2>/dev/null
echo "== nvidia"; cat /proc/driver/nvidia/version 2>/dev/null
echo "== meminfo"; grep -E '^(MemTotal|MemAvailable):' /proc/meminfo 2>/dev/null
echo "== disk"; mkdir -p "$base" 2>/dev/null; df -Pk "$base" 2>/dev/null | tail -n 1
echo "== init"; cat /proc/1/comm 2>/dev/null; test -d /run/systemd/system && echo systemd-running
echo "== uid"; id -u
echo "== tools"
for t in python3 systemd-run systemctl journalctl setsid tar sha256sum ldd apt-get dnf yum zypper; do
  command -v "$t" >/dev/null 2>&1 && echo "$t"
done
echo "== end"
