"""The database away: what the workers know keeps serving, what needs the database fails closed
with a 503 saying so, and usage is settled once it is back."""
import peewee

from llmgw.models import LimitRule, Price, Usage, database
from llmgw.services import quota, tenancy
from llmgw.web.routes import Routes
from tests.conftest import reconcile, settle_now

BODY = {"model": "demo", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


def test_known_keys_are_served_and_what_needs_the_database_gets_a_503(local_sim, client, tmp_path):
    made = local_sim("0")
    node = made["node"]
    reconcile(made["conf"], lambda: bool(node.replicas.count()) and all(r.state == "ready" for r in node.replicas))
    app = client.application
    made["conf"]["gateway"]["route_cache_seconds"] = 0  # every request would read the routes
    # Caches that lapse at once, so that every request would ask the database again.
    app.extensions["llmgw.gateway"] = (Routes(), quota.Lookups(ttl=0.001), quota.Lookups(ttl=0.001))
    Price.create(model="demo", prompt_per_1k=0, completion_per_1k=1_000_000)

    limited_row, limited = tenancy.create_key("default")
    LimitRule.create(scope_kind="key", scope_id=limited_row.id, budget=40_000, period="month")  # room for 8
    unlimited = {"Authorization": f"Bearer {made['key']}"}
    tight = {"Authorization": f"Bearer {limited}"}
    _, unseen = tenancy.create_key("default")
    assert client.post("/v1/chat/completions", headers=unlimited, json=BODY).status_code == 200
    assert client.post("/v1/chat/completions", headers=tight, json=BODY).status_code == 200
    settle_now(app)

    there = database.obj
    database.close()
    database.initialize(peewee.SqliteDatabase(str(tmp_path / "no-such-dir" / "llmgw.db")))
    try:
        codes = [client.post("/v1/chat/completions", headers=unlimited, json=BODY).status_code
                 for _ in range(5)]
        assert codes == [200] * 5  # its key, the routes and its (absent) limits as last known
        refused = client.post("/v1/chat/completions", headers=tight, json=BODY)
        # Its budget is near its end: each request is leased by itself, which needs the database.
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "5"
        err = refused.get_json()["error"]
        assert err["code"] == "database_unavailable" and "cannot reach its database" in err["message"]
        assert "no-such-dir" not in err["message"]  # the driver's words stay in the log
        health = client.get("/health")
        assert health.status_code == 503 and health.get_json() == {"status": "error",
                                                                   "database": "not answering"}
        stranger = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {unseen}"},
                               json=BODY)
        assert stranger.status_code == 503  # a key no worker has seen cannot be checked
        settle_now(app)  # the batch is kept while the database is away
    finally:
        database.initialize(there)
    settle_now(app)
    rows = list(Usage.select().where(Usage.status == 200))
    assert len(rows) == 7  # 2 before, 5 while away: each once

