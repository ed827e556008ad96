"""What a node is: parsed from the output of scripts/discover.sh."""
import re
import shlex
from importlib import resources

from . import gpu

# The vector extensions that decide how fast an engine runs on this CPU.
INTERESTING_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512_bf16", "amx_tile",
                     "asimd", "sve")

DRIVER_VERSION = re.compile(r"\b\d{2,4}\.\d+(?:\.\d+)?\b")

DEBIAN_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "armhf", "i686": "i386",
               "riscv64": "riscv64", "ppc64le": "ppc64el", "s390x": "s390x"}


def discovery_script():
    """Return the shell script text that gathers every host fact."""
    return resources.files("llmgw").joinpath("scripts/discover.sh").read_text()


def discovery_argv(base_dir):
    """Return the argv that runs the discovery script (sent on stdin) for base_dir."""
    return ["sh", "-s", "--", base_dir, ",".join(gpu.QUERY_FIELDS)]


def split_sections(text):
    """Split '== name' sections into {name: [lines]}."""
    sections, current = {}, None
    for line in text.splitlines():
        if line.startswith("== "):
            current = line[3:].strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return sections


def parse_os_release(lines):
    """Return {id, version, codename, like: [...], pretty} from /etc/os-release lines."""
    values = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if not sep or key.startswith("#"):
            continue
        try:
            parts = shlex.split(value)
        except ValueError:
            parts = [value.strip("\"'")]
        values[key.strip()] = " ".join(parts)
    return {"id": values.get("ID", ""), "version": values.get("VERSION_ID", ""),
            "codename": values.get("VERSION_CODENAME", ""),
            "like": values.get("ID_LIKE", "").split(), "pretty": values.get("PRETTY_NAME", "")}


def parse_cpu_flags(lines):
    """Return the interesting vector flags from the cpuinfo flags/Features line."""
    have = set()
    for line in lines:
        _, _, flags = line.partition(":")
        have.update(flags.split())
    return [f for f in INTERESTING_FLAGS if f in have]


def parse_nvidia_driver(lines):
    """Return the loaded NVIDIA driver version from /proc/driver/nvidia/version, or ''.

    Both 'Kernel Module  550.54.15' and 'Open Kernel Module for x86_64  560.35.03'.
    """
    for line in lines:
        if "Kernel Module" in line:
            m = DRIVER_VERSION.search(line.split("Kernel Module", 1)[1])
            if m:
                return m.group(0)
    return ""


def parse_meminfo(lines):
    """Return {'total_mb', 'available_mb'} from /proc/meminfo lines."""
    out = {}
    for line in lines:
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            name = {"MemTotal": "total_mb", "MemAvailable": "available_mb"}.get(key)
            if name:
                out[name] = int(fields[0]) // 1024
    return out


def parse_df(lines):
    """Return {'mount', 'total_mb', 'free_mb'} from one `df -Pk` data line."""
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[1].isdigit():
            return {"mount": fields[5], "total_mb": int(fields[1]) // 1024,
                    "free_mb": int(fields[3]) // 1024}
    return {}


def parse_disks(lines):
    """Return every local filesystem from `df -Pkl` data lines."""
    out = []
    for line in lines:
        one = parse_df([line])
        if one:
            out.append(one)
    return out


def parse_infiniband(lines):
    """Return [{hca, port, state, rate, link_layer}] from 'hca|port|state|rate|layer' lines."""
    ports = []
    for line in lines:
        parts = line.split("|")
        if len(parts) != 5:
            continue
        hca, port, state, rate, layer = (p.strip() for p in parts)
        ports.append({"hca": hca, "port": port, "state": state.split(":", 1)[-1].strip(),
                      "rate": rate, "link_layer": layer})
    return ports


def parse_weights(lines):
    """Return [{path, bytes}] of the GGUF files present under the node's models directory."""
    out = []
    for line in lines:
        size, _, path = line.strip().partition(" ")
        if size.isdigit() and path:
            out.append({"path": path, "bytes": int(size)})
    return out


def parse_addresses(lines):
    """Return {interface: [address, …]} from `ip -o addr show` lines, IPv4 first.

    A line reads '2: eth0    inet 10.0.0.5/24 brd 10.0.0.255 scope global eth0\\ …'."""
    out = {}
    for line in lines:
        words = line.split()
        if len(words) < 4 or words[2] not in ("inet", "inet6") or "/" not in words[3]:
            continue
        iface = words[1].split("@")[0]  # a VLAN shows as eth0.10@eth0
        out.setdefault(iface, []).append((words[2] == "inet6", words[3].split("/")[0]))
    return {iface: [a for _, a in sorted(addrs, key=lambda x: x[0])] for iface, addrs in out.items()}


def parse_discovery(text):
    """Turn the discovery script's output into the node's facts dict."""
    s = split_sections(text)
    if "end" not in s:
        raise ValueError("the discovery output was cut short (no '== end' section)")
    machine = (s.get("arch") or [""])[0].strip()
    init = [line.strip() for line in s.get("init", [])]
    return {
        "os": parse_os_release(s.get("os-release", [])),
        "machine": machine,
        "arch": DEBIAN_ARCH.get(machine, machine),
        "cpu_flags": parse_cpu_flags(s.get("cpu", [])),
        "nvidia_driver": parse_nvidia_driver(s.get("nvidia", [])),
        "memory": parse_meminfo(s.get("meminfo", [])),
        "disk": parse_df(s.get("disk", [])),
        "disks": parse_disks(s.get("disks", [])),
        "gpus": gpu.parse_gpus("\n".join(s.get("gpus", []))),
        "infiniband": parse_infiniband(s.get("infiniband", [])),
        "weights": parse_weights(s.get("weights", [])),
        "addresses": parse_addresses(s.get("addresses", [])),
        "pid1": init[0] if init else "",
        "systemd": "systemd-running" in init and bool(init) and init[0] == "systemd",
        "uid": int((s.get("uid") or ["-1"])[0].strip() or -1),
        "tools": [t.strip() for t in s.get("tools", []) if t.strip()],
    }


def packaging_family(os_facts):
    """Return 'deb', 'rpm' or '' from ID and ID_LIKE — never from a list of distribution names."""
    for ident in [os_facts.get("id", "")] + list(os_facts.get("like", [])):
        if ident in ("debian", "ubuntu"):
            return "deb"
        if ident in ("rhel", "fedora", "centos", "rocky", "almalinux", "suse", "opensuse"):
            return "rpm"
    return ""
