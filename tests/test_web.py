"""Login, the cluster page, and the gateway's refusals, through the Flask test client."""
from html.parser import HTMLParser

from llmgw.models import Node
from llmgw.services import tenancy
from tests.conftest import Auth


class Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.hx = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "hx-get" in a:
            self.hx.append((a["hx-get"], a.get("hx-trigger")))


def test_pages_need_a_login(client):
    resp = client.get("/")
    assert resp.status_code == 302 and "/login" in resp.headers["Location"]


def test_a_wrong_password_is_refused(client, auth):
    resp = auth.login(password="wrong")
    assert resp.status_code == 401 and b"do not match" in resp.data


def test_login_without_the_csrf_token_is_refused(client, auth):
    resp = client.post("/login", data={"email": "admin@example.com", "password": auth.password})
    assert resp.status_code == 400


def test_the_cluster_page_polls_its_partial(client, auth):
    Node.create(name="gpu-01", addr="10.0.0.7", facts={"os": {"pretty": "Debian 12"}, "arch": "amd64"})
    assert auth.login(password=auth.password).status_code == 302
    page = client.get("/")
    parser = Links()
    parser.feed(page.get_data(as_text=True))
    assert ("/", "every 3s") in parser.hx
    partial = client.get("/", headers={"HX-Request": "true"})
    assert b"gpu-01" in partial.data and b"<html" not in partial.data


def test_missing_and_bad_keys_are_401_in_openai_shape(client):
    for headers in ({}, {"Authorization": "Bearer sk-llmgw-nope"}, {"Authorization": "Basic x"}):
        resp = client.get("/v1/models", headers=headers)
        assert resp.status_code == 401
        assert resp.get_json()["error"]["code"] == "invalid_api_key"


def test_an_unknown_model_is_404_in_openai_shape(client):
    _, key = tenancy.create_key("default")
    resp = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                       json={"model": "gpt-nope", "messages": []})
    assert resp.status_code == 404
    err = resp.get_json()["error"]
    assert err["code"] == "model_not_found" and err["param"] == "model"


def test_a_revoked_key_stops_working(client):
    row, key = tenancy.create_key("default")
    tenancy.revoke_key(row.prefix)
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 401


def test_malformed_bodies_are_400_not_500(client):
    _, key = tenancy.create_key("default")
    h = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    for body in (b"{", b"[]", b'{"model": 5}', b"\xff\xfe"):
        assert client.post("/v1/chat/completions", headers=h, data=body).status_code == 400


def test_health_answers(client):
    resp = client.get("/health")
    assert resp.status_code == 200 and resp.get_json()["status"] == "ok"


def test_login_never_redirects_off_site(client, auth):
    for target in ("//evil.example", "/\t/evil.example", "https://evil.example/", "/\\evil"):
        page = client.get("/login")
        token = page.get_data(as_text=True).split('name="csrf_token" value="')[1].split('"')[0]
        resp = client.post("/login", query_string={"next": target}, data={
            "email": "admin@example.com", "password": auth.password, "csrf_token": token})
        assert resp.status_code == 302 and resp.headers["Location"] == "/", target
        client.post("/logout", data={"csrf_token": token})


def test_a_non_admin_gets_403_on_admin_pages(client, app):
    from llmgw import security
    from llmgw.models import User
    User.create(email="user@example.com", password_hash=security.hash_password("pw-123456"))
    Auth(client).login("user@example.com", "pw-123456")
    home = client.get("/")
    assert home.status_code == 302 and home.headers["Location"] == "/home"  # their own page
    assert client.get("/home").status_code == 200
    for path in ("/nodes/x", "/admin/keys", "/admin/users", "/quotas"):
        page = client.get(path)
        assert page.status_code == 403, path
        text = page.get_data(as_text=True)
        # A page of the site: its navigation, why, and the way home.
        assert "This page is for administrators." in text and 'href="/home"' in text, path
    missing = client.get("/no/such/page")
    assert missing.status_code == 404 and 'href="/home"' in missing.get_data(as_text=True)


def test_wrong_methods_under_v1_answer_in_openai_shape(client):
    resp = client.get("/v1/chat/completions", headers={"Authorization": "Bearer x"})
    assert resp.status_code == 405 and resp.get_json()["error"]["type"] == "invalid_request_error"
