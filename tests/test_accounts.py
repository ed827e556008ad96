"""Accounts: sign-up waits for approval, passwords change, admins are made and unmade; every
form and HTMX POST needs its CSRF token."""
import re

from llmgw.cli import llmgw
from llmgw.models import Membership, User
from tests.conftest import Auth


def token_of(client, path="/login"):
    return re.search(r'name="csrf_token" value="([^"]+)"', client.get(path).get_data(as_text=True)).group(1)


def test_sign_up_is_closed_unless_the_config_opens_it(client, app):
    assert client.get("/signup").status_code == 404
    app.config["LLMGW"]["accounts"]["signup"] = "open"
    assert client.get("/signup").status_code == 200


def test_a_signed_up_account_waits_for_an_administrator(client, app, auth):
    app.config["LLMGW"]["accounts"]["signup"] = "open"
    data = {"email": "new@example.com", "password": "long-enough-pw", "csrf_token": token_of(client, "/signup")}
    assert client.post("/signup", data=data).status_code == 302
    assert Auth(client).login("new@example.com", "long-enough-pw").status_code == 401
    auth.login(password=auth.password)
    new = User.get(User.email == "new@example.com")
    resp = client.post(f"/admin/users/{new.id}/approve",
                       data={"project": "default", "csrf_token": token_of(client, "/admin/users")})
    assert resp.status_code == 302
    assert Membership.select().where(Membership.user == new).count() == 1
    client.post("/logout", data={"csrf_token": token_of(client, "/profile")})
    assert Auth(client).login("new@example.com", "long-enough-pw").status_code == 302


def test_a_short_password_is_refused_at_sign_up(client, app):
    app.config["LLMGW"]["accounts"]["signup"] = "open"
    resp = client.post("/signup", data={"email": "x@example.com", "password": "short",
                                        "csrf_token": token_of(client, "/signup")})
    assert resp.status_code == 400 and b"at least 10 characters" in resp.data
    assert User.get_or_none(User.email == "x@example.com") is None


def test_the_password_changes_only_with_the_current_one(client, auth):
    auth.login(password=auth.password)
    form = {"current": "wrong-password", "new": "a-new-password", "again": "a-new-password",
            "csrf_token": token_of(client, "/profile")}
    assert client.post("/profile", data=form).status_code == 400
    form["current"] = auth.password
    assert client.post("/profile", data=form).status_code == 302
    client.post("/logout", data={"csrf_token": token_of(client, "/profile")})
    assert Auth(client).login("admin@example.com", "a-new-password").status_code == 302


def test_the_last_administrator_cannot_be_demoted(runner, root, app):
    runner.invoke(llmgw, ["init", "--root", str(root), "--admin", "boss@example.com"])
    refused = runner.invoke(llmgw, ["users", "demote", "boss@example.com", "--root", str(root)])
    assert refused.exit_code != 0 and "last administrator" in refused.output
    made = runner.invoke(llmgw, ["users", "create", "two@example.com", "--admin", "--root", str(root)])
    assert "password:" in made.output
    assert runner.invoke(llmgw, ["users", "demote", "boss@example.com", "--root", str(root)]).exit_code == 0


def test_every_post_route_refuses_a_missing_csrf_token(client, app, auth):
    auth.login(password=auth.password)
    posts = [r for r in app.url_map.iter_rules() if "POST" in r.methods and not r.rule.startswith("/v1")]
    assert len(posts) >= 5
    for rule in posts:
        path = re.sub(r"<(?:int:)?(\w+)>", lambda m: "1" if "int:" in m.group(0) else "x", rule.rule)
        for headers in ({}, {"HX-Request": "true"}):
            resp = client.post(path, data={"email": "a@b.c", "password": "x"}, headers=headers)
            assert resp.status_code == 400, (rule.rule, resp.status_code)
