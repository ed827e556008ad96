"""Limits count the whole period and every 60 s: money in exact micro-units, rpm/tpm in a
sliding window, spend counted for every scope before any limit is set, and refusals counted."""
import datetime
import json
import shutil

import peewee
import pytest

from llmgw import migrate
from llmgw.models import Counter, LimitRule, Price, Project, database, utcnow
from llmgw.plans import money
from llmgw.plans import quota as plans
from llmgw.services import quota, settlement, tenancy
from llmgw.services.leases import Ledger
from tests.conftest import settle_now


def test_money_is_whole_micro_units_and_a_finer_amount_is_refused_by_name():
    assert money.to_micros("0.1") == 100_000 and money.to_micros(2.5) == 2_500_000
    assert money.to_micros("0.000001") == 1 and money.to_micros(0) == 0
    assert sum(money.to_micros("0.1") for _ in range(10)) == money.to_micros(1)  # no drift
    for bad, says in (("0.0000001", "finer than a millionth"), ("-1", "0 or more"),
                      ("ten", "not a number"), ("nan", "finite")):
        with pytest.raises(money.MoneyError, match=says) as e:
            money.to_micros(bad, "--budget")
        assert repr(bad) in str(e.value)
    assert money.show(1_500) == "0.001500" and money.show(12_000_000) == "12.000000"
    # Rounded up: the worst case reserved never costs less than what is then used.
    price = (150, 600)  # 0.00015 and 0.0006 per 1k tokens
    assert money.cost(1, 0, price) == 1 and money.cost(0, 0, price) == 0
    assert all(money.cost(p, c, price) <= money.cost(p + 1, c + 3, price)
               for p in range(0, 50, 7) for c in range(0, 50, 5))


def test_a_money_option_or_setting_finer_than_a_micro_unit_is_refused(runner, root):
    got = runner.invoke(args=["llmgw", "limits", "set", "--project", "default", "--budget", "0.0000001"])
    assert got.exit_code == 2 and "finer than a millionth" in got.output and "--budget" in got.output
    assert LimitRule.select().count() == 0  # nothing written
    from llmgw import config
    from llmgw.errors import ConfigError
    (root / "server.toml").write_text("[limits]\ndefault_budget = 0.00000015\n")
    with pytest.raises(ConfigError, match="limits.default_budget"):
        config.load(str(root))


def _key_and_rule(**limits):
    project = Project.get(Project.name == "default")
    LimitRule.create(scope_kind="project", scope_id=project.id, **limits)
    key, _ = tenancy.create_key("default")
    return key


BODY = {"model": "demo", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
T0 = datetime.datetime(2026, 11, 30, 12, 0, 57)


def test_rpm_admits_no_more_than_the_limit_in_any_60_seconds_across_a_minute_boundary(app):
    key = _key_and_rule(rpm=3)
    conf, ledger = app.config["LLMGW"], Ledger()
    for second in (0, 1, 2):  # 12:00:57-59, the end of one minute
        quota.reserve(key, "demo", BODY, conf, ledger, now=T0 + datetime.timedelta(seconds=second))
    # A counter per minute would start again at 12:01:00: six in four seconds.
    for later in (3, 10, 50, 59):
        with pytest.raises(quota.LimitExceeded) as e:
            quota.reserve(key, "demo", BODY, conf, ledger, now=T0 + datetime.timedelta(seconds=later))
        assert e.value.kind == "requests" and "3 requests per minute" in str(e.value)
        assert 1 <= e.value.retry_after <= plans.BUCKET_SECONDS
    # The first bucket (12:00:55-59) leaves the window 65 s after it began: room again.
    quota.reserve(key, "demo", BODY, conf, ledger, now=T0 + datetime.timedelta(seconds=63))


def test_any_60_second_window_holds_at_most_the_limit_under_a_steady_stream(app):
    """A request every 1.5 s for 5 minutes against rpm 20: count the admitted in every window."""
    key = _key_and_rule(rpm=20)
    conf, ledger = app.config["LLMGW"], Ledger()
    admitted = []
    for i in range(200):
        when = T0 + datetime.timedelta(seconds=1.5 * i)
        try:
            quota.reserve(key, "demo", BODY, conf, ledger, now=when)
            admitted.append(when)
        except quota.LimitExceeded:
            pass
    worst = max(sum(1 for a in admitted if start <= a < start + datetime.timedelta(seconds=60))
                for start in admitted)
    assert worst <= 20 and len(admitted) >= 80  # held, and not starved either


def test_tpm_counts_what_is_held_and_used_in_the_window_and_says_tokens(app):
    key = _key_and_rule(tpm=200)  # each may use 94: its prompt bound and 40
    conf = app.config["LLMGW"]
    s = settlement.Settlement(flush_seconds=3600)
    first = quota.reserve(key, "demo", dict(BODY, max_tokens=40), conf, s.ledger, now=T0)
    s.add(first, 5, 40, 200)
    s.flush()
    quota.reserve(key, "demo", dict(BODY, max_tokens=40), conf, s.ledger, now=T0 + datetime.timedelta(seconds=5))
    with pytest.raises(quota.LimitExceeded) as e:
        quota.reserve(key, "demo", dict(BODY, max_tokens=40), conf, s.ledger, now=T0 + datetime.timedelta(seconds=30))
    assert e.value.kind == "tokens" and "200 tokens per minute (139 used or held" in str(e.value)


def _limits_changed(app):
    """What a worker sees within a second of a limit being set (its lookups live that long)."""
    app.extensions.pop("llmgw.gateway", None)


def _spend(client, headers, n):
    for _ in range(n):
        assert client.post("/v1/chat/completions", headers=headers, json=dict(BODY, max_tokens=5)).status_code == 200
    settle_now(client.application)


@pytest.mark.parametrize("scope", ["key", "project", "team", "org"])
def test_a_budget_set_mid_period_counts_what_was_spent_before_it(served_sim, client, scope):
    """Four requests with no limit anywhere, then a budget for five: one more is admitted."""
    Price.create(model="demo", prompt_per_1k=0, completion_per_1k=200_000_000)  # 0.2 a token: 1 per request
    headers, key = served_sim["headers"], served_sim["row"]
    _spend(client, headers, 4)
    assert Counter.select().where(Counter.kind == "budget").count() >= 16  # 4 scopes x 4 periods
    project = Project.get(Project.name == "default")
    sid = {"key": key.id, "project": project.id, "team": project.team.id, "org": project.team.org.id}[scope]
    LimitRule.create(scope_kind=scope, scope_id=sid, budget=5_000_000, period="month")
    _limits_changed(client.application)
    ok = client.post("/v1/chat/completions", headers=headers, json=dict(BODY, max_tokens=5))
    assert ok.status_code == 200
    settle_now(client.application)
    refused = client.post("/v1/chat/completions", headers=headers, json=dict(BODY, max_tokens=5))
    assert refused.status_code == 429
    err = refused.get_json()["error"]
    assert err["type"] == "insufficient_quota" and f"{scope} " in err["message"]
    assert "5.000000 of 5.000000" in err["message"]


def test_rpm_set_mid_minute_counts_the_requests_already_made(served_sim, client):
    _spend(client, served_sim["headers"], 3)
    project = Project.get(Project.name == "default")
    LimitRule.create(scope_kind="project", scope_id=project.id, rpm=4)
    _limits_changed(client.application)
    assert client.post("/v1/chat/completions", headers=served_sim["headers"], json=BODY).status_code == 200
    refused = client.post("/v1/chat/completions", headers=served_sim["headers"], json=BODY)
    assert refused.status_code == 429 and refused.get_json()["error"]["type"] == "requests"


def test_refusals_are_counted_per_key_and_day_where_an_operator_sees_them(served_sim, client, runner, auth):
    project = Project.get(Project.name == "default")
    LimitRule.create(scope_kind="project", scope_id=project.id, rpm=1)
    codes = [client.post("/v1/chat/completions", headers=served_sim["headers"], json=BODY).status_code
             for _ in range(4)]
    assert codes == [200, 429, 429, 429]
    settle_now(client.application)
    got = json.loads(runner.invoke(args=["llmgw", "usage", "--json"]).output)
    assert [(r["key"], r["type"], r["requests"]) for r in got["refused"]] == \
        [(served_sim["row"].prefix + "…", "requests", 3)]
    assert got["models"][0]["requests"] == 1
    auth.login(password=auth.password)
    page = client.get("/usage/default").get_data(as_text=True)
    assert "<td>requests</td><td>3</td>" in page


def test_counters_of_windows_that_are_over_are_pruned_unless_they_hold_a_reservation(app):
    now = datetime.datetime(2026, 11, 30, 12, 0, 0)
    old_bucket = plans.bucket_slot(now - datetime.timedelta(hours=1))
    rows = {("rpm", old_bucket, 0): False, ("rpm", plans.bucket_slot(now), 0): True,
            ("tpm", "window", 0): True, ("tpm", old_bucket, 7): True,
            ("budget", "2026-11-28", 0): False, ("budget", "2026-11-29", 0): True,
            ("budget", "2026-W47", 0): False, ("budget", "2026-W48", 0): True,
            ("budget", "2026-10", 0): True, ("budget", "2026-09", 0): False, ("budget", "all", 0): True,
            ("refused_requests", "2026-01-01", 0): False, ("refused_tokens", "2026-11-01", 0): True}
    for (kind, slot, reserved) in rows:
        Counter.create(scope_kind="project", scope_id=1, kind=kind, slot=slot, used=5, reserved=reserved)
    assert settlement.prune(now) == sum(not kept for kept in rows.values())
    left = {(c.kind, c.slot, c.reserved) for c in Counter.select()}
    assert left == {row for row, kept in rows.items() if kept}


def test_the_migration_turns_floats_into_exact_micro_units_and_counts_past_spend(tmp_path, app):
    """A database as it was before: money as floats, a budget counter only where a budget was."""
    database.close()
    db = peewee.SqliteDatabase(str(tmp_path / "old.db"))
    old = tmp_path / "migrations"
    old.mkdir()
    for version, _, path in migrate.available():
        if version < 15:
            shutil.copy(path, old / path.name)
    migrate.upgrade(db, old)
    db.execute_sql("INSERT INTO org (name, created) VALUES ('o', '2026-01-01')")
    db.execute_sql("INSERT INTO team (org_id, name, created) VALUES (1, 't', '2026-01-01')")
    db.execute_sql("INSERT INTO project (team_id, name, created) VALUES (1, 'p', '2026-01-01')")
    db.execute_sql("INSERT INTO limit_rule (scope_kind, scope_id, budget, period) VALUES ('project', 1, 2.5, 'month')")
    db.execute_sql("INSERT INTO price (model, prompt_per_1k, completion_per_1k) VALUES ('m', 0.00015, 0.0006)")
    now = utcnow()
    for cost in (0.1, 0.2, 0.000001):
        db.execute_sql("INSERT INTO usage (created, key_id, project_id, model, prompt_tokens, completion_tokens,"
                       " cost, latency_ms, status, endpoint) VALUES (?, 7, 1, 'm', 1, 1, ?, 1, 200, '')",
                       (str(now), cost))
    db.execute_sql("INSERT INTO counter (scope_kind, scope_id, kind, slot, used, reserved) VALUES "
                   "('project', 1, 'budget', ?, 0.3, 0.1)", (now.strftime("%Y-%m"),))
    db.execute_sql("INSERT INTO counter (scope_kind, scope_id, kind, slot, used, reserved) VALUES "
                   "('project', 1, 'rpm', '2026-11-30T12:00', 3, 0)")
    migrate.upgrade(db)
    assert db.execute_sql("SELECT budget FROM limit_rule").fetchone() == (2_500_000,)
    assert db.execute_sql("SELECT prompt_per_1k, completion_per_1k FROM price").fetchone() == (150, 600)
    assert sorted(r[0] for r in db.execute_sql("SELECT cost FROM usage")) == [1, 100_000, 200_000]
    counters = {(r[0], r[1], r[2]): (r[3], r[4]) for r in db.execute_sql(
        "SELECT scope_kind, scope_id, slot, used, reserved FROM counter WHERE kind = 'budget'")}
    assert counters[("project", 1, now.strftime("%Y-%m"))] == (300_000, 100_000)  # kept as it was
    for scope in (("key", 7), ("project", 1), ("team", 1), ("org", 1)):
        assert counters[(*scope, "all")] == (300_001, 0)
    assert db.execute_sql("SELECT COUNT(*) FROM counter WHERE kind = 'rpm'").fetchone() == (0,)
    assert all(isinstance(v, int) for v in counters[("org", 1, "all")])
    db.close()
    database.connect(reuse_if_open=True)


@pytest.fixture
def served_sim(local_sim):
    from tests.conftest import reconcile
    made = local_sim("0")
    node = made["node"]
    reconcile(made["conf"], lambda: bool(node.replicas.count()) and all(r.state == "ready" for r in node.replicas))
    return dict(made, row=tenancy.lookup_key(made["key"]))


def test_a_request_leased_late_for_an_older_bucket_counts_what_newer_buckets_admitted(app):
    """A request that waited past its bucket's end (for the lease lock, say) is checked against
    the newer buckets too: otherwise a window's end is not where the sum stops."""
    key = _key_and_rule(rpm=2)
    conf = app.config["LLMGW"]
    later = T0 + datetime.timedelta(seconds=plans.BUCKET_SECONDS)
    quota.reserve(key, "demo", BODY, conf, Ledger(), now=later)
    quota.reserve(key, "demo", BODY, conf, Ledger(), now=later)
    with pytest.raises(quota.LimitExceeded):  # admitted "at" the older bucket, leased after
        quota.reserve(key, "demo", BODY, conf, Ledger(), now=T0)
