"""Re-discovery says what changed, in sentences."""
import copy
import json
from pathlib import Path

from llmgw.facts.changes import describe

ROCKY = json.loads((Path(__file__).parent / "cases/discovery/rocky9-x64-nvidia-systemd.json").read_text())["expected"]


def test_the_first_discovery_logs_nothing():
    assert describe({}, ROCKY) == []


def test_nothing_changed_says_nothing():
    assert describe(ROCKY, copy.deepcopy(ROCKY)) == []


def test_a_gpu_turning_unhealthy_a_lost_flag_and_a_port_going_down_are_each_said():
    new = copy.deepcopy(ROCKY)
    new["gpus"][1].update(healthy=False, reason="nvidia-smi reports [GPU requires reset]")
    new["cpu_flags"].remove("avx2")
    new["infiniband"][0]["state"] = "DOWN"
    said = describe(ROCKY, new)
    assert "GPU 1 (GPU-2c2d3e4f-5a6b-7c8d-9e0f-a1b2c3d4e5f7) became unhealthy: nvidia-smi reports [GPU requires reset]" in said
    assert "CPU no longer reports avx2 (was the VM's CPU type changed?)" in said
    assert "InfiniBand mlx5_0 port 1 went from ACTIVE to DOWN" in said
    assert len(said) == 3
