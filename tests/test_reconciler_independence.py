"""One node that does not answer holds up only itself: every other node keeps its pace."""
import asyncio
import socket
from pathlib import Path

import asyncssh

from llmgw.models import Node, utcnow
from llmgw.reconciler import Reconciler
from llmgw.services import nodes


def test_a_silent_node_does_not_hold_up_the_other_nodes_passes(app, tmp_path):
    conf = app.config["LLMGW"]
    conf["engines"]["llamacpp"] = ""
    conf["reconciler"]["interval"] = 0.1
    conf["ssh"]["connect_timeout"] = 30
    # A node whose sshd accepts connections and never says a word, as one behind a link that
    # drops packets looks to SSH: the handshake waits out the whole connect timeout.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    identity = Path(conf["ssh"]["key"])  # the control plane's own key, as init makes it
    identity.parent.mkdir(parents=True, exist_ok=True)
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(identity))
    key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()
    Node.create(name="silent", transport="ssh", addr="127.0.0.1", port=silent.getsockname()[1],
                host_key=key, reachable=True, facts={}, discovered=utcnow())
    local = asyncio.run(nodes.add_local_node("local", str(tmp_path / "node")))

    async def go():
        rec, stop = Reconciler(conf), asyncio.Event()
        running = asyncio.create_task(rec.run(stop))
        seen = set()

        def silent_gave_up():
            return Node.get(Node.name == "silent").last_error != ""
        try:
            # The silent node's look lasts 30 s, until SSH gives up on it; the local node must
            # be looked at again and again meanwhile. (Every pass once waited for every look.)
            while len(seen) < 4 and not silent_gave_up():
                assert not running.done()
                seen.add(Node.get_by_id(local.id).last_seen)
                await asyncio.sleep(0.05)
            assert len(seen) >= 4 and not silent_gave_up(), \
                f"local was seen {len(seen)} time(s) while the silent node was still being reached"
        finally:
            stop.set()
            await running
    try:
        asyncio.run(go())
    finally:
        silent.close()
