"""Which build of an engine fits a node, decided from its facts alone."""
from dataclasses import dataclass, field

LLAMACPP_REPO = "ggml-org/llama.cpp"
# The CUDA build llama.cpp publishes for x64; its cudart archive comes alongside, so a
# node needs a driver and no toolkit.
LLAMACPP_CUDA = "12.8"


class Unsupported(Exception):
    """No build of this engine fits the host; the message says why."""


@dataclass(frozen=True)
class Build:
    engine: str
    version: str
    variant: str
    repo: str = ""
    assets: tuple = ()
    binary: str = ""
    # OS packages the build links against, by packaging family.
    packages: dict = field(default_factory=dict)
    # Extensions the build is slow without: reported, not refused.
    cpu_flags: tuple = ()

    @property
    def dirname(self):
        return f"{self.version}-{self.variant}"


def choose(engine, version, facts):
    """Return the Build of engine@version for a node with these facts, or raise Unsupported."""
    if engine == "llamacpp":
        return _llamacpp(version, facts)
    if engine == "sim":
        return _sim(facts)
    raise Unsupported(f"llmgw does not know how to install the engine {engine!r}; "
                      f"known engines: llamacpp, sim")


def _llamacpp(version, facts):
    # The published builds are made on Ubuntu but need only glibc 2.34 and GCC 12's
    # libstdc++: the distribution's name decides nothing, ldd does.
    arch = {"amd64": "x64", "arm64": "arm64"}.get(facts.get("arch", ""))
    if arch is None:
        shown = facts.get("machine") or facts.get("arch") or "an unrecognised machine"
        raise Unsupported(f"llama.cpp publishes no Linux build for {shown}")
    common = dict(engine="llamacpp", version=version, repo=LLAMACPP_REPO, binary="llama-server",
                  packages={"deb": ("libgomp1",), "rpm": ("libgomp",)})
    if facts.get("nvidia_driver") and arch == "x64":
        name = f"bin-ubuntu-cuda-{LLAMACPP_CUDA}-x64.tar.gz"
        return Build(variant=f"cuda-{LLAMACPP_CUDA}", cpu_flags=("avx2",),
                     assets=(f"llama-{version}-{name}", f"cudart-llama-{version}-{name}"),
                     **common)
    # The arm64 CUDA build needs a newer CUDA than most drivers offer: CPU build there.
    return Build(variant="cpu", assets=(f"llama-{version}-bin-ubuntu-{arch}.tar.gz",),
                 cpu_flags=("avx2",) if arch == "x64" else (), **common)


def _sim(facts):
    if "python3" not in facts.get("tools", []):
        raise Unsupported("the simulated engine needs python3 on the node, and it has none")
    return Build(engine="sim", version="builtin", variant="python3", binary="sim_engine.py")


def missing_cpu_flags(build, facts):
    """Return the extensions this build wants and the CPU lacks."""
    have = set(facts.get("cpu_flags", []))
    return [f for f in build.cpu_flags if f not in have]


def slow_cpu_warning(build, facts):
    """Return the standing warning for a CPU that will run this build slowly, or ''."""
    missing = missing_cpu_flags(build, facts)
    if not missing:
        return ""
    return (f"this CPU lacks {', '.join(missing).upper()}, so inference will run several times "
            f"slower (a VM needs its CPU type set to \"host\")")
