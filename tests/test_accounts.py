"""Accounts: sign-up waits for approval, passwords change, admins are made and unmade; every
form and HTMX POST needs its CSRF token."""
import re

from llmgw.cli import llmgw
from llmgw.models import Membership, User
from llmgw.services import tenancy
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


def test_an_account_for_a_project_that_does_not_exist_is_not_created(runner, root, app):
    runner.invoke(llmgw, ["init", "--root", str(root)])
    refused = runner.invoke(llmgw, ["users", "create", "x@example.com", "--project", "nope", "--root", str(root)])
    assert refused.exit_code != 0 and "nope" in refused.output
    listed = runner.invoke(llmgw, ["users", "list", "--json", "--root", str(root)])
    assert "x@example.com" not in listed.output
    made = runner.invoke(llmgw, ["users", "create", "x@example.com", "--project", "default", "--root", str(root)])
    assert made.exit_code == 0, made.output  # the refusal left nothing behind in its way


def test_a_key_is_revoked_by_the_whole_key_or_any_unique_start_of_what_keys_list_shows(runner, root, app):
    from llmgw.services import tenancy
    runner.invoke(llmgw, ["init", "--root", str(root)])

    def revoke(given):
        return runner.invoke(llmgw, ["keys", "revoke", given, "--root", str(root)])
    rows = [tenancy.create_key("default") for _ in range(3)]
    (row1, key1), (row2, key2), (row3, key3) = rows
    done = revoke(key1)  # the whole key
    assert done.exit_code == 0 and f"revoked {row1.prefix}…" in done.output, done.output
    done = revoke(row2.prefix + "…")  # as `keys list` shows it
    assert done.exit_code == 0 and f"revoked {row2.prefix}…" in done.output, done.output
    again = revoke(key2)
    assert again.exit_code != 0 and "already revoked" in again.output
    # Every key starts with "sk-llmgw-": that alone names none of them.
    short = revoke("sk-llmgw-")
    assert short.exit_code != 0 and "too short" in short.output
    unique = next(n for n in range(11, len(row3.prefix) + 1)
                  if not any(r.prefix[:n] == row3.prefix[:n] for r, _ in rows[:2]))
    done = revoke(row3.prefix[:unique])
    assert done.exit_code == 0 and f"revoked {row3.prefix}…" in done.output, done.output
    # Longer than the shown start but not the whole key: the rest cannot be checked.
    wrong = revoke(row3.prefix + "x" * 10)
    assert wrong.exit_code != 0 and "give the whole key" in wrong.output
    missing = revoke("sk-llmgw-zzzzzz")
    assert missing.exit_code != 0 and "no key starts with" in missing.output
    assert not [k for k in (key1, key2, key3) if tenancy.lookup_key(k)]


def test_processes_creating_the_secrets_key_at_once_all_get_the_same_whole_key(tmp_path):
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    for attempt in range(20):  # the race is narrow: start 8 processes on the same moment, often
        root = tmp_path / str(attempt)
        start, out = ctx.Barrier(8), ctx.Queue()
        procs = [ctx.Process(target=_read_key, args=(str(root), start, out)) for _ in range(8)]
        for p in procs:
            p.start()
        keys = [out.get(timeout=30) for _ in procs]
        for p in procs:
            p.join(30)
        assert len(set(keys)) == 1 and len(keys[0]) == 44, (attempt, set(keys))
        assert [p.name for p in (root / "secrets").iterdir()] == ["fernet.key"]  # no temporary left


def _read_key(root, start, out):
    from llmgw import secrets_box
    start.wait()
    try:
        secrets_box.ensure(root)
        out.put(secrets_box.key_path(root).read_bytes())
    except Exception as e:
        out.put(repr(e).encode())


def test_a_session_cookie_kept_from_before_logout_gets_the_login_page(app, client, auth):
    auth.login(password=auth.password)
    assert client.get("/").status_code == 200
    kept = client.get_cookie("session").value  # what an attacker copied from the browser
    client.post("/logout", data={"csrf_token": token_of(client, "/profile")})
    replay = app.test_client()
    replay.set_cookie("session", kept)
    assert replay.get("/").status_code == 302 and "/login" in replay.get("/").headers["Location"]


def test_a_password_change_ends_the_other_sessions_and_keeps_this_one(app, client, auth):
    auth.login(password=auth.password)
    other = app.test_client()
    Auth(other).login(password=auth.password)
    assert other.get("/").status_code == 200
    form = {"current": auth.password, "new": "a-new-password", "again": "a-new-password",
            "csrf_token": token_of(client, "/profile")}
    assert client.post("/profile", data=form).status_code == 302
    assert client.get("/").status_code == 200  # the browser that changed it stays logged in
    assert other.get("/").status_code == 302  # the other one is sent to log in


def test_a_session_id_without_a_token_is_not_a_login(app, client, auth):
    auth.login(password=auth.password)
    with client.session_transaction() as s:
        s["_user_id"] = s["_user_id"].split(":")[0]  # as a cookie from before tokens has it
    assert client.get("/").status_code == 302


def test_csrf_tokens_change_at_login_and_are_refused_from_another_session_or_method(app, client, auth):
    before = token_of(client, "/login")
    auth.login(password=auth.password)
    after = token_of(client, "/profile")
    assert after != before
    form = {"current": "x", "new": "y", "again": "y"}
    # The token from before login is stale: the session's secret changed with it.
    assert client.post("/profile", data=dict(form, csrf_token=before)).status_code == 400
    stranger = app.test_client()
    assert client.post("/profile", data=dict(form, csrf_token=token_of(stranger, "/login"))).status_code == 400
    # Every unsafe method any page takes is checked (today only POST is taken: the others 405).
    for rule in app.url_map.iter_rules():
        for method in {"PUT", "PATCH", "DELETE"} & rule.methods:
            assert client.open(rule.rule, method=method).status_code == 400, (rule.rule, method)
    assert client.put("/profile").status_code == 405
    assert client.post("/profile", headers={"X-CSRF-Token": after}, data=form).status_code == 400  # wrong password


def _try(client, email, password, address="127.0.0.1"):
    token = token_of(client)
    return client.post("/login", data={"email": email, "password": password, "csrf_token": token},
                       environ_base={"REMOTE_ADDR": address})


def test_an_account_failing_ten_times_is_refused_until_its_lockout_ends(app, client, auth):
    from llmgw.models import LoginFailure
    for n in range(10):
        assert _try(client, "admin@example.com", f"guess-{n}").status_code == 401
    refused = _try(client, "admin@example.com", auth.password)  # even the right password, now
    assert refused.status_code == 429 and 0 < int(refused.headers["Retry-After"]) <= 900
    assert b"Too many failed logins for this account or from this address; try again in 15 minute(s)" \
        in refused.data
    assert client.get("/").status_code == 302  # not logged in
    # Another account from the same address is not held up by it (its limit is 50).
    tenancy.ensure_admin("other@example.com")
    assert _try(client, "other@example.com", "wrong").status_code == 401
    # Once the lockout is over (moved into the past here, instead of waiting 15 minutes):
    LoginFailure.update(blocked_until=LoginFailure.first_at).execute()
    assert _try(client, "admin@example.com", auth.password).status_code == 302
    assert not LoginFailure.select().where(LoginFailure.subject == "account:admin@example.com").exists()


def test_an_email_with_no_account_is_counted_and_refused_like_one_with_an_account(app, client):
    answers = [_try(client, "nobody@example.com", "x").status_code for _ in range(11)]
    assert answers == [401] * 10 + [429]
    assert _try(client, "NOBODY@example.com ", "x").status_code == 429  # the same account


def test_an_address_failing_on_many_accounts_is_refused_and_others_are_not(app, client, auth):
    app.config["LLMGW"]["accounts"]["login_failures_per_address"] = 3
    for n in range(3):
        assert _try(client, f"user{n}@example.com", "x", address="203.0.113.7").status_code == 401
    assert _try(client, "admin@example.com", auth.password, address="203.0.113.7").status_code == 429
    assert _try(client, "admin@example.com", auth.password, address="198.51.100.2").status_code == 302


def test_counts_older_than_the_window_start_again(app, client, auth):
    import datetime
    from llmgw.models import LoginFailure
    for _ in range(9):
        _try(client, "admin@example.com", "wrong")
    row = LoginFailure.get(LoginFailure.subject == "account:admin@example.com")
    LoginFailure.update(first_at=row.first_at - datetime.timedelta(seconds=901)).where(
        LoginFailure.subject == row.subject).execute()
    assert _try(client, "admin@example.com", "wrong").status_code == 401  # the 10th, but a new window
    row = LoginFailure.get(LoginFailure.subject == "account:admin@example.com")
    assert (row.failures, row.blocked_until) == (1, None)


def test_a_burst_of_guesses_sent_at_once_gets_no_more_hashes_than_the_limit(app, auth):
    import threading
    start, answers, lock = threading.Barrier(30), [], threading.Lock()

    def guess(n):
        client = app.test_client()
        token = token_of(client)
        start.wait()
        status = client.post("/login", data={"email": "admin@example.com", "password": f"guess-{n}",
                                             "csrf_token": token}).status_code
        with lock:
            answers.append(status)
    threads = [threading.Thread(target=guess, args=(n,)) for n in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # Each attempt takes its number before its password is checked: ten are, twenty are refused.
    assert sorted(answers) == [401] * 10 + [429] * 20
