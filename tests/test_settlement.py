"""Settling off the request path: reservations held until a batch is written, one transaction
for many requests, nothing lost when the database refuses a batch."""
from llmgw.models import Counter, LimitRule, Price, Project, Usage, database, utcnow
from llmgw.plans import quota as plans
from llmgw.services import quota, tenancy
from llmgw.services.settlement import Settlement


def _limited(app, budget=1.0, tpm=0):
    Price.create(model="demo", prompt_per_1k=0, completion_per_1k=10_000_000)  # 0.01 a token
    project = Project.get(Project.name == "default")
    LimitRule.create(scope_kind="project", scope_id=project.id, budget=int(budget * 1_000_000),
                     tpm=tpm, period="day")
    key, _ = tenancy.create_key("default")
    return key


def _reserve(app, key, s, max_tokens=10):
    body = {"model": "demo", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]}
    return quota.reserve(key, "demo", body, app.config["LLMGW"], s.ledger)


def _budget():
    """Return (spent, held) today by the project, in the currency: exact micro-units scaled."""
    c = Counter.get(Counter.kind == "budget", Counter.scope_kind == "project",
                    Counter.slot == plans.budget_slot("day", utcnow()))
    assert isinstance(c.used, int) and isinstance(c.reserved, int)
    return c.used / 1_000_000, c.reserved / 1_000_000


def test_a_reservation_is_held_until_its_batch_is_written(app):
    key = _limited(app, budget=1.0, tpm=10_000)
    s = Settlement(flush_seconds=3600)  # no background flush within the test
    held = [_reserve(app, key, s) for _ in range(5)]
    assert _budget() == (0, 0.5)
    for res in held:
        s.add(res, 7, 3, 200, "http://e")  # 3 of the 10 tokens it might have used
    assert _budget() == (0, 0.5) and Usage.select().count() == 0  # nothing written yet: strict
    assert s.flush() == 5
    # Near its end a budget is leased a request at a time: what one did not use goes back.
    assert _budget() == (0.15, 0)
    # tpm has room for many: the worker keeps a slice of it until its bucket ends (or it exits).
    s.ledger.give_back_all()
    s.flush()
    # Summed over the buckets: a test run that crosses a bucket's boundary has two tpm rows.
    tpm = list(Counter.select().where(Counter.kind == "tpm", Counter.scope_kind == "project"))
    assert (sum(c.used for c in tpm), sum(c.reserved for c in tpm)) == (50, 0)
    rows = list(Usage.select().order_by(Usage.id))
    assert [(u.prompt_tokens, u.completion_tokens, u.status) for u in rows] == [(7, 3, 200)] * 5
    assert all(u.cost == 30_000 for u in rows)  # micro-units, exactly


def test_a_batch_the_database_refuses_is_kept_and_written_later(app):
    key = _limited(app)
    s = Settlement(flush_seconds=3600)
    s.add(_reserve(app, key, s), 0, 4, 200)
    database.execute_sql("ALTER TABLE usage RENAME TO usage_away")
    try:
        assert s.flush() == 0
        assert _budget() == (0, 0.1)  # the transaction rolled back whole: still held
    finally:
        database.execute_sql("ALTER TABLE usage_away RENAME TO usage")
    assert s.flush() == 1
    assert _budget() == (0.04, 0) and Usage.get().completion_tokens == 4


def test_the_background_thread_settles_within_a_flush_interval(app):
    key = _limited(app)
    s = Settlement(flush_seconds=0.05)
    try:
        s.add(_reserve(app, key, s), 0, 2, 200)
        import time
        deadline = time.monotonic() + 5
        while Usage.select().count() == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert Usage.select().count() == 1 and _budget() == (0.02, 0)
    finally:
        s.close()  # its thread must not outlive this test's database


def test_usage_rows_read_back_as_peewee_writes_them(app):
    import datetime
    key = _limited(app)
    s = Settlement(flush_seconds=3600)
    before = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    s.add(_reserve(app, key, s), 3, 2, 200, "http://e/v1")
    s.flush()
    u = Usage.get()
    assert isinstance(u.created, datetime.datetime) and abs((u.created - before).total_seconds()) < 5
    assert (u.key_id, u.model, u.endpoint, u.latency_ms >= 0) == (key.id, "demo", "http://e/v1", True)


def test_one_request_the_database_refuses_does_not_hold_up_the_others(app):
    import dataclasses
    key = _limited(app)
    s = Settlement(flush_seconds=3600)
    good = [_reserve(app, key, s) for _ in range(2)]
    bad = dataclasses.replace(_reserve(app, key, s), model=None)  # usage.model is NOT NULL
    s.add(good[0], 0, 1, 200)
    s.add(bad, 0, 1, 200)
    s.add(good[1], 0, 1, 200)
    assert s.flush() == 3 and not s.pending  # two settled, one let go
    assert Usage.select().count() == 2
    # Its usage row is lost, but what it used was spent from the worker's slice: still counted.
    assert _budget() == (0.03, 0)


def test_absurd_token_counts_are_clamped_to_what_the_columns_hold(app):
    key = _limited(app, budget=0)
    s = Settlement(flush_seconds=3600)
    s.add(_reserve(app, key, s), 10**12, -5, 200)
    assert s.flush() == 1
    u = Usage.get()
    assert (u.prompt_tokens, u.completion_tokens) == (2**31 - 1, 0)


def test_a_batch_retried_after_its_commit_was_applied_after_all_is_not_settled_twice(app):
    """The connection broke as the database committed: the batch failed here, took effect there.
    Played with a batch that really was written and is then tried again as failed ones are."""
    key = _limited(app)
    s = Settlement(flush_seconds=3600)
    first, second = _reserve(app, key, s), _reserve(app, key, s)
    s.add(first, 0, 3, 200)
    queued = s.pending[0]
    assert s.flush() == 1
    s.uncertain.add(first.request_id)          # what a failed write leaves behind
    s.pending.append(queued)                   # ... and the same request back in the queue
    assert s.add(first, 0, 3, 200) == 0        # (ending it once more is no second request)
    s.add(second, 0, 5, 200)
    assert s.flush() == 2
    assert sorted(u.completion_tokens for u in Usage.select()) == [3, 5]
    assert _budget() == (0.08, 0) and not s.uncertain
    assert first.request_id.startswith("req_") and Usage.get(Usage.completion_tokens == 3).request_id \
        == first.request_id
