"""The GPU scheduler where people look: the model page, the node's GPU table, the cluster
totals and the gateway's 503, all checked by parsing the HTML or JSON they return."""
import json
from html.parser import HTMLParser

from llmgw.models import Model, Node, Replica
from llmgw.services import placing
from tests.conftest import reconcile  # noqa: F401
from tests.test_model_catalog import cli, fleet, sample, tiny  # noqa: F401  (fixtures)


class Rows(HTMLParser):
    """Collect {row id: [cell text, …]} of every <tr id=…>, and the text of any element by id."""

    def __init__(self, html):
        super().__init__()
        self.rows, self.ids, self._row, self._cell, self._open = {}, {}, None, None, []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tr" and attrs.get("id"):
            self._row = attrs["id"]
            self.rows[self._row] = []
        elif tag == "td" and self._row:
            self._cell = []
        if attrs.get("id") and tag != "tr":
            self._open.append([attrs["id"], tag, []])

    def handle_endtag(self, tag):
        if tag == "td" and self._row is not None and self._cell is not None:
            self.rows[self._row].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr":
            self._row = None
        if self._open and self._open[-1][1] == tag:
            ident, _, text = self._open.pop()
            self.ids[ident] = " ".join("".join(text).split())

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        for entry in self._open:
            entry[2].append(data)


def place_now(app):
    nodes, models, replicas, installs = placing.snapshot()
    placing.Applier(nodes, models, replicas, "18000-18100").apply(
        placing.plan(nodes, models, replicas, installs))


def test_the_model_page_shows_replicas_cards_and_every_node_s_verdict(fleet, cli, tiny, client, auth):
    cli("model", "add", "tp4", "--file", tiny, "--gpus", "4", "--gpu-class", "h100-80g", "--replicas", "2")
    place_now(fleet)
    auth.login(password=auth.password)
    page = client.get("/models/tp4")
    assert page.status_code == 200
    rows = Rows(page.get_data(as_text=True))
    assert rows.rows["verdict-gpu-b"][1:] == ["no", "has l4-24g, needs h100-80g"]
    assert rows.rows["verdict-cpu-c"][1:] == ["no", "no GPU, 4 × h100-80g needed"]
    assert "3 of 7 healthy h100-80g free, 4 needed" in rows.rows["verdict-gpu-a"][2]
    replica = rows.rows["replica-tp4-0"]
    assert replica[1] == "gpu-a" and replica[2] == "0, 1, 2, 4"
    assert rows.ids["placement"].startswith("1 of 2 replicas placed; no node can run the rest")
    assert client.get("/models/nope").status_code == 404


def test_the_node_page_says_who_holds_each_card_and_why_one_is_sick(fleet, cli, tiny, client, auth):
    cli("model", "add", "pair", "--file", tiny, "--gpus", "2", "--gpu-class", "h100-80g")
    place_now(fleet)
    auth.login(password=auth.password)
    rows = Rows(client.get("/nodes/gpu-a").get_data(as_text=True)).rows
    uuids = [g["uuid"] for g in sample("h100x8-one-ecc")]
    assert rows[f"gpu-{uuids[0]}"][-1] == "pair-0" and rows[f"gpu-{uuids[1]}"][-1] == "pair-0"
    assert rows[f"gpu-{uuids[2]}"][-1] == "free"
    assert rows[f"gpu-{uuids[3]}"][4].startswith("unhealthy: 12 uncorrected ECC errors")
    assert rows["replica-pair-0"][3] == "0, 1"


def test_the_cluster_page_counts_free_cards_per_node_and_in_all(fleet, cli, tiny, client, auth):
    cli("model", "add", "pair", "--file", tiny, "--gpus", "2", "--gpu-class", "h100-80g")
    place_now(fleet)
    auth.login(password=auth.password)
    parsed = Rows(client.get("/").get_data(as_text=True))
    assert parsed.ids["gpu-totals"].startswith("GPUs: 9 free of 12 (1 unhealthy)")
    assert parsed.rows["node-gpu-a"][4].startswith("5/8")
    assert parsed.rows["node-gpu-b"][4].startswith("4/4")
    assert parsed.rows["node-cpu-c"][4] == "none"


def test_nodes_json_lists_each_card_with_its_claim(fleet, cli, tiny):
    cli("model", "add", "pair", "--file", tiny, "--gpus", "2", "--gpu-class", "h100-80g")
    place_now(fleet)
    listed = {n["name"]: n for n in json.loads(cli("nodes", "--json").output)}
    cards = listed["gpu-a"]["gpus"]
    assert [c["claimed_by"] for c in cards[:3]] == [["pair-0"], ["pair-0"], []]
    assert cards[3]["healthy"] is False and cards[3]["uuid"].startswith("GPU-")


def test_the_gateway_503_says_placement_failed_and_the_model_page_says_why(fleet, cli, tiny, client,
                                                                            auth):
    from llmgw.services import tenancy
    cli("model", "add", "huge", "--file", tiny, "--gpus", "8", "--gpu-class", "h100-80g")
    place_now(fleet)
    assert Replica.select().count() == 0
    _, key = tenancy.create_key("default")
    resp = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                       json={"model": "huge", "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 503
    # An API client learns that placement failed, not the cluster's nodes and cards.
    message = resp.get_json()["error"]["message"]
    assert message == ("No ready replica of 'huge': placement found no node that can run it. "
                       "Administrators see why on the model's page.")
    auth.login(password=auth.password)
    page = client.get("/models/huge").get_data(as_text=True)
    assert "gpu-a: 7 of 7 healthy h100-80g free, 8 needed" in page
    assert Model.get(Model.name == "huge").verdict["placed"] == 0
    assert Node.select().count() == 3


def test_a_model_named_like_a_path_has_its_page(fleet, cli, tiny, client, auth):
    out = cli("model", "add", "org/llama", "--file", tiny)
    assert out.exit_code == 0, out.output
    auth.login(password=auth.password)
    assert client.get("/models/org/llama").status_code == 200


def test_cordon_keeps_what_runs_places_nothing_new_and_says_so(fleet, cli, tiny, client, auth):
    cli("model", "add", "pair", "--file", tiny, "--gpus", "2", "--gpu-class", "h100-80g")
    place_now(fleet)
    out = cli("cordon", "gpu-a")
    assert out.exit_code == 0 and "gpu-a cordoned by the CLI" in out.output
    cli("model", "set", "pair", "--replicas", "2")
    place_now(fleet)
    assert [r.node.name for r in Replica.select().order_by(Replica.name)] == ["gpu-a"]
    assert "gpu-a: cordoned: it takes no new replicas" in Model.get(Model.name == "pair").verdict["summary"]
    assert json.loads(cli("nodes", "--json").output)[1]["state"] == "cordoned"
    unknown = cli("cordon", "gpu-z")
    assert unknown.exit_code != 0 and "no node called 'gpu-z' (nodes: cpu-c, gpu-a, gpu-b)" in unknown.output
    auth.login(password=auth.password)
    page = client.get("/nodes/gpu-a").get_data(as_text=True)
    token = page.split('name="csrf_token" value="')[1].split('"')[0]
    assert Rows(page).ids["node-state"] == "cordoned"
    done = client.post("/nodes/gpu-a/uncordon", data={"csrf_token": token}, follow_redirects=True)
    assert "gpu-a uncordoned by admin@example.com" in done.get_data(as_text=True)
    assert Node.get(Node.name == "gpu-a").state == "ready"
    assert client.post("/nodes/gpu-a/cordon").status_code == 400  # no CSRF token, no change
    assert Node.get(Node.name == "gpu-a").state == "ready"
    place_now(fleet)
    assert Replica.select().count() == 2
