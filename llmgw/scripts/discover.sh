# Sent to a node on stdin by the control plane; prints one section per fact.
# $1 is the node's llmgw directory, whose disk is reported too; $2 the nvidia-smi query fields.
base="${1:-/opt/llmgw}"
gpu_fields="${2:-index,name,memory.total}"
echo "== os-release"; cat /etc/os-release 2>/dev/null
echo "== arch"; uname -m
echo "== cpu"; grep -m1 -E '^(flags|Features)[[:space:]]*:' /proc/cpuinfo 2>/dev/null
echo "== nvidia"; cat /proc/driver/nvidia/version 2>/dev/null
echo "== meminfo"; grep -E '^(MemTotal|MemAvailable):' /proc/meminfo 2>/dev/null
echo "== disk"; mkdir -p "$base" 2>/dev/null; df -Pk "$base" 2>/dev/null | tail -n 1
echo "== disks"; df -Pkl -x tmpfs -x devtmpfs -x squashfs -x overlay 2>/dev/null | tail -n +2
echo "== gpus"
if [ -e /proc/driver/nvidia/version ] && command -v nvidia-smi >/dev/null 2>&1; then
  timeout 20 nvidia-smi --query-gpu="$gpu_fields" --format=csv,noheader,nounits 2>&1
fi
echo "== infiniband"
for p in /sys/class/infiniband/*/ports/*; do
  [ -d "$p" ] || continue
  hca=$(basename "$(dirname "$(dirname "$p")")")
  echo "$hca|$(basename "$p")|$(cat "$p/state" 2>/dev/null)|$(cat "$p/rate" 2>/dev/null)|$(cat "$p/link_layer" 2>/dev/null)"
done
echo "== weights"; find "$base/models" -maxdepth 1 -type f -name '*.gguf' -printf '%s %p\n' 2>/dev/null
echo "== addresses"; ip -o addr show scope global 2>/dev/null
echo "== init"; cat /proc/1/comm 2>/dev/null; test -d /run/systemd/system && echo systemd-running
echo "== uid"; id -u
echo "== tools"
for t in python3 systemd-run systemctl journalctl setsid tar sha256sum ldd apt-get dnf yum zypper curl wget; do
  command -v "$t" >/dev/null 2>&1 && echo "$t"
done
echo "== end"
