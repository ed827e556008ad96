"""Fixtures in the flaskr style: a fresh control plane root and database per test."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw import create_app, migrate
from llmgw.models import database
from llmgw.services import tenancy
from tests.harness.ports import free_port, free_port_range  # noqa: F401  (tests import them from here)

TOP = Path(__file__).resolve().parent.parent


@pytest.fixture
def root(tmp_path, monkeypatch):
    """An empty llmgw root; LLMGW_ROOT points at it.

    With LLMGW_TEST_POSTGRES=postgresql://USER@HOST:PORT (tests/run.sh sets it for a second
    pass of the fast tier) each test gets a fresh database on that server instead of SQLite.
    """
    r = tmp_path / "root"
    r.mkdir()
    monkeypatch.setenv("LLMGW_ROOT", str(r))
    server = os.environ.get("LLMGW_TEST_POSTGRES")
    if server:
        monkeypatch.setenv("LLMGW_DATABASE_URL", _fresh_postgres_database(server))
    return r


def _fresh_postgres_database(server):
    import uuid
    import psycopg2
    name = "t_" + uuid.uuid4().hex[:16]
    conn = psycopg2.connect(server.rstrip("/") + "/postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    conn.close()
    return server.rstrip("/") + "/" + name


@pytest.fixture
def app(root):
    app = create_app({"TESTING": True, "ROOT": str(root)})
    database.connect(reuse_if_open=True)
    migrate.upgrade(database.obj)
    tenancy.ensure_default_project()
    yield app
    settlement = app.extensions.get("llmgw.settlement")
    if settlement:
        settlement.close()  # before the next test binds another database
    database.close()


def settle_now(app):
    """Settle what the gateway has finished so far (it does so in batches every 100 ms)."""
    from llmgw.web.relay import settlement
    with app.app_context():
        settlement().flush()


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def runner(app):
    return app.test_cli_runner()


class Auth:
    def __init__(self, client):
        self.client = client

    def login(self, email="admin@example.com", password=None):
        page = self.client.get("/login")
        token = page.get_data(as_text=True).split('name="csrf_token" value="')[1].split('"')[0]
        return self.client.post("/login", data={"email": email, "password": password,
                                                "csrf_token": token})


@pytest.fixture
def auth(client, app):
    user, password = tenancy.ensure_admin("admin@example.com")
    a = Auth(client)
    a.password = password
    return a


def reconcile(conf, until=None, timeout=30):
    """Run reconcile passes (waiting for their background work) until `until()` holds.

    Without `until`, one pass. A new Reconciler each call: what a restarted process would do.
    """
    import asyncio
    import time
    from llmgw.models import Replica
    from llmgw.reconciler import Reconciler

    async def go():
        rec = Reconciler(conf)
        deadline = time.monotonic() + timeout
        try:
            while True:
                await rec.pass_once()
                await rec.drain()
                if until is None or until():
                    return
                if time.monotonic() > deadline:
                    raise AssertionError("did not converge: " + "; ".join(
                        f"{r.name} {r.state} {r.detail}" for r in Replica.select()))
                await asyncio.sleep(0.2)
        finally:
            await rec.close()
    asyncio.run(go())


@pytest.fixture
def local_sim(app, tmp_path):
    """Make this machine a node serving model 'demo' on the simulated engine; stop it afterwards.

    Call it with the engine's delay between tokens; it returns {conf, node, key, headers}. The
    node gets a port range of its own, so another llmgw on this machine is no neighbour.
    """
    import asyncio
    from llmgw.executors.transport import LocalTransport
    from llmgw.models import Model
    from llmgw.plans import launch
    from llmgw.services import nodes
    from llmgw.services.replicas import running_units
    made = []

    def make(token_delay="0.05"):
        conf = app.config["LLMGW"]
        conf["engines"]["llamacpp"] = ""
        base = free_port_range(50)
        conf["reconciler"]["port_range"] = f"{base}-{base + 50}"
        node = asyncio.run(nodes.add_local_node("local", str(tmp_path / "node")))
        made.append(node)
        Model.create(name="demo", engine="sim", source="", sha256="", replicas=1,
                     args=["--token-delay", token_delay])
        _, key = tenancy.create_key("default")
        return {"conf": conf, "node": node, "key": key, "headers": {"Authorization": f"Bearer {key}"}}
    yield make
    t = LocalTransport()
    for node in made:
        for unit in asyncio.run(running_units(t, "setsid", node.base_dir)):
            asyncio.run(t.run(launch.stop_argv("setsid", f"llmgw-{unit}", node.base_dir)))


@pytest.fixture
def sim_engine():
    """A real simulated engine process on a free loopback port; yields its base URL."""
    import time
    import requests
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(TOP / "llmgw" / "scripts" / "sim_engine.py"),
                             "--model", "sim", "--port", str(port), "--token-delay", "0.01"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            if requests.get(url + "/health", timeout=1).status_code == 200:
                break
        except requests.RequestException:
            time.sleep(0.05)
    yield url
    proc.terminate()
    proc.wait(timeout=10)
