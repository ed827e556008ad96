"""vLLM and SGLang are named per node and proven by a real probe run on the node."""
import asyncio

import pytest

from llmgw import config
from llmgw.cli import llmgw
from llmgw.errors import ConfigError
from llmgw.models import EngineInstall
from llmgw.services import nodes
from tests.conftest import reconcile

FAKE_VLLM = "#!/bin/sh\n[ \"$1\" = --version ] && echo 0.11.2 && exit 0\nexit 2\n"


@pytest.fixture
def vllm(tmp_path):
    path = tmp_path / "venv" / "bin" / "vllm"
    path.parent.mkdir(parents=True)
    path.write_text(FAKE_VLLM)
    path.chmod(0o755)
    return path


def test_a_named_engine_is_ready_with_its_version_and_a_wrong_path_says_so(app, tmp_path, vllm):
    conf = app.config["LLMGW"]
    conf["engines"]["llamacpp"] = ""
    asyncio.run(nodes.add_local_node("here", str(tmp_path / "node")))
    conf["node_engines"] = {"here": {"vllm": str(vllm), "sglang": str(tmp_path / "nope/python")}}

    reconcile(conf)
    rows = {r.engine: r for r in EngineInstall.select()}
    assert (rows["vllm"].state, rows["vllm"].version) == ("ready", "0.11.2")
    assert rows["vllm"].detail == f"vllm 0.11.2 at {vllm}"
    assert rows["sglang"].state == "failed"
    assert rows["sglang"].detail.startswith(f"sglang at {tmp_path}/nope/python is not there")


def test_engine_check_probes_a_path_before_it_is_relied_on(runner, root, tmp_path, vllm, app):
    asyncio.run(nodes.add_local_node("here", str(tmp_path / "node")))
    ok = runner.invoke(llmgw, ["engine-check", "here", "vllm", str(vllm), "--root", str(root)])
    assert ok.exit_code == 0 and "vllm 0.11.2 at" in ok.output
    silent = tmp_path / "silent"
    silent.write_text("#!/bin/sh\necho usage: silent\n")
    silent.chmod(0o755)
    bad = runner.invoke(llmgw, ["engine-check", "here", "vllm", str(silent), "--root", str(root)])
    assert bad.exit_code != 0 and "ran but said no version" in bad.output


def test_node_engines_are_checked_when_the_config_is_read(root):
    (root / "server.toml").write_text('[node_engines.gpu-07]\nvllm = "relative/vllm"\n')
    with pytest.raises(ConfigError, match="give an absolute path on the node"):
        config.load(str(root))
    (root / "server.toml").write_text('[node_engines.gpu-07]\ntgi = "/opt/tgi"\n')
    with pytest.raises(ConfigError, match="name one of vllm, sglang"):
        config.load(str(root))


def test_discover_writes_what_changed_to_the_node_s_log(runner, root, tmp_path, app):
    from llmgw.models import Node, NodeEvent
    node = asyncio.run(nodes.add_local_node("here", str(tmp_path / "node")))
    facts = dict(node.facts, cpu_flags=node.facts["cpu_flags"] + ["amx_tile"],
                 memory={"total_mb": 1000})
    Node.update(facts=facts).where(Node.id == node.id).execute()
    out = runner.invoke(llmgw, ["discover", "here", "--root", str(root)])
    assert out.exit_code == 0, out.output
    said = [e.text for e in NodeEvent.select().order_by(NodeEvent.id)]
    assert "CPU no longer reports amx_tile (was the VM's CPU type changed?)" in said
    assert any(s.startswith("memory changed from 1000 MB to ") for s in said)
    assert "CPU no longer reports amx_tile" in out.output
