"""A model file is not copied to a node whose disk it would fill."""
import asyncio

import pytest

from llmgw.errors import InstallError
from llmgw.executors.transport import LocalTransport
from llmgw.models import Model
from llmgw.services import weights
from tests.harness.tiny_gguf import write_tiny_gguf


def test_a_copy_that_would_eat_the_reserve_is_refused_and_nothing_is_written(app, tmp_path):
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf")
    model = Model.create(name="tiny", source=str(tiny), sha256=weights.sha256_file(tiny))
    base = tmp_path / "node"
    huge = 1024 * 1024 * 1024  # a reserve of 1 PiB, more than any disk here has
    with pytest.raises(InstallError) as refused:
        asyncio.run(weights.ensure_on_node(LocalTransport(), str(base), model, str(tmp_path / "c"), huge))
    said = str(refused.value)
    assert said.startswith("tiny's weights (0.0 GiB still to copy) do not fit on ") and "GiB free, " in said
    assert "free space there or lower weights.reserve" in said
    assert list((base / "models").iterdir()) == []
    path = asyncio.run(weights.ensure_on_node(LocalTransport(), str(base), model, str(tmp_path / "c"), 0))
    assert (base / "models").joinpath(path.rsplit("/", 1)[1]).read_bytes() == tiny.read_bytes()


def test_a_reserve_without_a_unit_stops_the_config_from_loading(root):
    from llmgw import config
    from llmgw.errors import ConfigError
    (root / "server.toml").write_text('[weights]\nreserve = "5"\n')
    with pytest.raises(ConfigError) as e:
        config.load(str(root))
    assert "weights.reserve '5' is not a size with a unit; write e.g. 5G" in str(e.value)
