"""The pages people use without the command line: keys on the profile page (shown once, only
in one's projects, revoked by their owner or an administrator), a person's home."""
import re

from llmgw import security
from llmgw.models import ApiKey, Membership, Project, User
from llmgw.services import tenancy
from tests.conftest import Auth


def token_of(page):
    return page.get_data(as_text=True).split('name="csrf_token" value="')[1].split('"')[0]


def person(client, email="ana@example.com", project="default"):
    user = User.create(email=email, password_hash=security.hash_password("pw-123456789"))
    if project:
        Membership.create(user=user, project=Project.get(Project.name == project))
    Auth(client).login(email, "pw-123456789")
    return user


def test_a_person_makes_a_key_sees_it_once_uses_it_and_revokes_it(app, client):
    ana = person(client)
    profile = client.get("/profile")
    made = client.post("/profile/keys", data={"csrf_token": token_of(profile), "project": "default",
                                              "name": "laptop", "models": "demo", "expires_days": "7"})
    assert made.status_code == 200
    text = made.get_data(as_text=True)
    key = re.search(r"<code>(sk-llmgw-\S+?)</code>", text).group(1)
    row = ApiKey.get(ApiKey.user == ana)
    assert row.name == "laptop" and row.models == ["demo"] and row.expires is not None
    assert tenancy.lookup_key(key).id == row.id
    again = client.get("/profile").get_data(as_text=True)
    assert key not in again and f"{row.prefix}…" in again  # shown once, then only its start
    home = client.get("/home").get_data(as_text=True)
    assert f"{row.prefix}…" in home and "default" in home
    revoked = client.post(f"/keys/{row.id}/revoke", data={"csrf_token": token_of(client.get("/profile"))})
    assert revoked.status_code == 302 and tenancy.lookup_key(key) is None


def test_keys_only_in_ones_projects_and_only_ones_own_revoked(app, client):
    other, _ = tenancy.create_key("default", "someone else's")
    tenancy.create_org("acme")
    tenancy.create_team("t", "acme")
    tenancy.create_project("secret", "t")
    person(client)
    token = token_of(client.get("/profile"))
    refused = client.post("/profile/keys", data={"csrf_token": token, "project": "secret"})
    assert refused.status_code == 403 and "not a member of the project &#39;secret&#39;" in refused.get_data(as_text=True)
    bad = client.post("/profile/keys", data={"csrf_token": token, "project": "default", "expires_days": "soon"},
                      follow_redirects=True)
    assert "expiry &#39;soon&#39; is not a whole number of days" in bad.get_data(as_text=True)
    assert not ApiKey.select().where(ApiKey.name != "someone else's").exists()  # nothing made
    assert client.post(f"/keys/{other.id}/revoke", data={"csrf_token": token}).status_code == 404
    assert ApiKey.get_by_id(other.id).revoked is None


def test_a_person_in_no_project_is_told_so(app, client):
    person(client, project=None)
    assert "You are in no project yet" in client.get("/profile").get_data(as_text=True)
    assert "You are in no project yet" in client.get("/home").get_data(as_text=True)


def test_administrators_see_and_revoke_every_key(app, client, auth):
    row, _ = tenancy.create_key("default", "ci")
    auth.login(password=auth.password)
    page = client.get("/admin/keys")
    assert f"{row.prefix}…" in page.get_data(as_text=True)
    assert client.post(f"/keys/{row.id}/revoke", data={"csrf_token": token_of(page),
                                                      "back": "/admin/keys"}).headers["Location"] == "/admin/keys"
    assert ApiKey.get_by_id(row.id).revoked is not None
    assert client.get("/admin/keys?project=nope").status_code == 404


def test_the_models_page_adds_scales_changes_and_removes_as_the_cli_does(app, client, auth):
    from llmgw.models import Model
    auth.login(password=auth.password)
    page = client.get("/models")
    assert "No models yet" in page.get_data(as_text=True)
    token = token_of(page)
    added = client.post("/models", data={"csrf_token": token, "action": "add", "name": "chat", "engine": "sim",
                                         "replicas": "2", "args": "--token-delay\n0"}, follow_redirects=True)
    assert "Added model chat." in added.get_data(as_text=True)
    m = Model.get(Model.name == "chat")
    assert (m.engine, m.replicas, m.args) == ("sim", 2, ["--token-delay", "0"])
    bad = client.post("/models", data={"csrf_token": token, "action": "add", "name": "x", "engine": "sim",
                                       "memory": "12"}, follow_redirects=True)
    assert "Model x not changed:" in bad.get_data(as_text=True) and not Model.get_or_none(Model.name == "x")
    client.post("/models", data={"csrf_token": token, "action": "scale", "name": "chat", "replicas": "3"})
    assert Model.get(Model.name == "chat").replicas == 3
    changed = client.post("/models", data={"csrf_token": token, "action": "set", "name": "chat",
                                           "memory": "2G", "share_gpu": ""}, follow_redirects=True)
    assert "Changed memory_mb of chat." in changed.get_data(as_text=True)
    m = Model.get(Model.name == "chat")
    assert (m.memory_mb, m.replicas, m.args) == (2048, 3, ["--token-delay", "0"])  # the rest kept
    nothing = client.post("/models", data={"csrf_token": token, "action": "set", "name": "chat"},
                          follow_redirects=True)
    assert "nothing to change" in nothing.get_data(as_text=True)
    listed = client.get("/models").get_data(as_text=True)
    assert 'id="model-chat"' in listed and "0 of 3" in listed
    assert "Change, scale or remove" in client.get("/models/chat").get_data(as_text=True)
    gone = client.post("/models", data={"csrf_token": token, "action": "remove", "name": "chat"},
                       follow_redirects=True)
    assert "Removed model chat" in gone.get_data(as_text=True) and not Model.get_or_none(Model.name == "chat")


def test_the_endpoints_page_adds_shows_health_and_removes(app, client, auth):
    from llmgw.models import Endpoint
    auth.login(password=auth.password)
    token = token_of(client.get("/endpoints"))
    client.post("/endpoints", data={"csrf_token": token, "action": "add", "name": "hosted",
                                    "url": "http://192.0.2.9:8000/v1", "models": "big,small", "api_key": "sk-x"})
    row = Endpoint.get(Endpoint.name == "hosted")
    assert row.models == ["big", "small"] and row.api_key and "sk-x" not in row.api_key  # sealed
    page = client.get("/endpoints").get_data(as_text=True)
    assert 'id="endpoint-hosted"' in page and "pending" in page and "not checked yet" in page
    bad = client.post("/endpoints", data={"csrf_token": token, "action": "add", "name": "b", "url": "ftp://x",
                                          "models": "m"}, follow_redirects=True)
    assert "is not an http(s) URL" in bad.get_data(as_text=True)
    client.post("/endpoints", data={"csrf_token": token, "action": "remove", "name": "hosted"})
    assert not Endpoint.select().exists()


def test_the_projects_page_sets_limits_with_the_checks_of_limits_set(app, client, auth):
    from llmgw.models import LimitRule, Project
    auth.login(password=auth.password)
    page = client.get("/projects")
    text = page.get_data(as_text=True)
    assert 'id="org-default"' in text and 'id="project-default"' in text
    token = token_of(page)
    done = client.post("/projects/limits", data={"csrf_token": token, "kind": "project", "name": "default",
                                                 "rpm": "60", "budget": "12.5", "period": "week"},
                       follow_redirects=True)
    assert "rpm 60, tpm none, budget 12.500000 per week" in done.get_data(as_text=True)
    rule = LimitRule.get(LimitRule.scope_kind == "project")
    assert (rule.rpm, rule.tpm, rule.budget, rule.period) == (60, None, 12_500_000, "week")
    for field, value, said in (("rpm", "-1", "not a whole number of 0 or more"),
                               ("budget", "0.0000001", "budget"), ("period", "year", "is not one of")):
        refused = client.post("/projects/limits", data={"csrf_token": token, "kind": "project",
                                                        "name": "default", field: value}, follow_redirects=True)
        assert said in refused.get_data(as_text=True) and "not changed" in refused.get_data(as_text=True)
    assert LimitRule.get_by_id(rule.id).rpm == 60  # nothing lost
    from llmgw.models import Team
    team = Team.get(Team.name == "default")
    client.post("/projects/create", data={"csrf_token": token, "what": "project", "name": "lab", "parent": str(team.id)})
    assert Project.get_or_none(Project.name == "lab")
    client.post("/projects/lab/members", data={"csrf_token": token, "action": "add", "email": "admin@example.com"})
    page = client.get("/projects/lab").get_data(as_text=True)
    assert 'id="member-admin@example.com"' in page


def test_usage_history_charts_and_csv_over_a_chosen_range(app, client, auth):
    import csv
    import datetime
    import io
    from llmgw.models import Usage
    project = Project.get(Project.name == "default")
    day = datetime.datetime(2026, 11, 3, 10, 15)
    for i, (when, model, status) in enumerate([(day, "a", 200), (day, "a", 200), (day, "b", 500),
                                              (day + datetime.timedelta(hours=2), "a", 200),
                                              (day + datetime.timedelta(days=3), "a", 429)]):
        Usage.create(created=when, project_id=project.id, model=model, prompt_tokens=10, completion_tokens=5,
                     cost=1500, latency_ms=3, status=status, endpoint="", key_id=None)
    auth.login(password=auth.password)
    page = client.get("/usage/default?from=2026-11-03&to=2026-11-06&step=day")
    text = page.get_data(as_text=True)
    assert page.status_code == 200 and text.count("<svg") == 5
    assert "2026-11-03: 4" in text and "2026-11-06: 1" in text  # bars' tooltips: requests per day
    hourly = client.get("/usage/default?from=2026-11-03&to=2026-11-03&step=hour").get_data(as_text=True)
    assert "2026-11-03 10:00: 3" in hourly and "2026-11-03 12:00: 1" in hourly and "2026-11-03 11:00: 0" in hourly
    got = client.get("/usage/default.csv?from=2026-11-03&to=2026-11-06&step=day&model=a")
    assert got.mimetype == "text/csv" and "attachment" in got.headers["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(got.get_data(as_text=True))))
    assert [(r["period"], r["model"], r["requests"], r["cost"], r["errors"]) for r in rows] == [
        ("2026-11-03", "a", "3", "0.004500", "0"), ("2026-11-06", "a", "1", "0.001500", "1")]
    bad = client.get("/usage/default?from=2026-11-09&to=2026-11-01")
    assert bad.status_code == 400 and "starts (2026-11-09) after it ends" in bad.get_data(as_text=True)
    assert client.get("/usage/default?from=2025-01-01&to=2026-11-01&step=hour").status_code == 400


def test_removing_a_model_with_replicas_needs_a_running_reconciler_and_loses_nothing(app, client, auth):
    from llmgw.models import Model, Node, Replica
    node = Node.create(name="n1", addr="10.0.0.1", reachable=True)
    m = Model.create(name="busy", engine="sim", source="", replicas=1)
    Replica.create(model=m, node=node, name="busy-0", port=18001, state="ready")
    auth.login(password=auth.password)
    token = token_of(client.get("/models"))
    said = client.post("/models", data={"csrf_token": token, "action": "remove", "name": "busy"},
                       follow_redirects=True).get_data(as_text=True)
    assert "no reconciler is running to stop busy" in said and "--now" in said
    assert Model.get(Model.name == "busy").replicas == 1 and Replica.select().count() == 1


def test_the_quotas_page_edits_limits_and_never_redirects_off_site(app, client, auth):
    from llmgw.models import LimitRule
    auth.login(password=auth.password)
    token = token_of(client.get("/quotas"))
    made = client.post("/projects/limits", data={"csrf_token": token, "kind": "team", "name": "default",
                                                 "tpm": "5000", "back": "/quotas"})
    assert made.headers["Location"] == "/quotas"
    assert LimitRule.get(LimitRule.scope_kind == "team").tpm == 5000
    page = client.get("/quotas").get_data(as_text=True)
    from llmgw.models import Team
    team = Team.get(Team.name == "default")
    assert f'id="limits-team-{team.id}"' in page and 'placeholder="5000"' in page
    for back in ("https://evil.example/", "//evil.example/", "/projects/../../x"):
        r = client.post("/projects/limits", data={"csrf_token": token, "kind": "team", "name": "default",
                                                  "rpm": "7", "back": back})
        assert r.headers["Location"] == "/projects", back


def test_two_orgs_with_a_team_of_the_same_name_are_told_apart(app, client, auth):
    from llmgw.models import LimitRule, Team
    from llmgw.services import limits
    import pytest
    from llmgw.errors import LlmgwError
    tenancy.create_org("other")
    tenancy.create_team("default", "other")
    with pytest.raises(LlmgwError, match="2 orgs have a team named 'default'"):
        limits.set_limits("team", "default", rpm=5)
    theirs = Team.select().where(Team.name == "default").order_by(Team.id.desc()).get()
    auth.login(password=auth.password)
    token = token_of(client.get("/projects"))
    client.post("/projects/limits", data={"csrf_token": token, "kind": "team", "name": "default",
                                          "sid": str(theirs.id), "rpm": "5"})
    assert LimitRule.get().scope_id == theirs.id
    client.post("/projects/create", data={"csrf_token": token, "what": "project", "name": "p2",
                                          "parent": str(theirs.id)})
    assert Project.get(Project.name == "p2").team_id == theirs.id


def test_a_page_cannot_make_a_model_of_the_control_planes_own_files(app, client, auth, root):
    from llmgw.models import Model
    auth.login(password=auth.password)
    token = token_of(client.get("/models"))
    (root / "secrets").mkdir(exist_ok=True)
    (root / "secrets" / "fernet.key").write_text("x")
    for source, said in ((str(root / "secrets" / "fernet.key"), "inside the control plane&#39;s own directory"),
                         ("/etc/passwd", "must be a .gguf model"), ("relative.gguf", "is not an absolute path")):
        page = client.post("/models", data={"csrf_token": token, "action": "add", "name": "steal",
                                            "engine": "llamacpp", "source": source}, follow_redirects=True)
        assert said in page.get_data(as_text=True), source
    assert not Model.select().exists()
