"""Leased slices: admission without a transaction per request, never more than the limit across
workers, exact at a limit's end, and a dead worker's leases released and its requests billed."""
import datetime
import time



from llmgw.models import Counter, GatewayWorker, Lease, LimitRule, Price, Project, Usage, utcnow
from llmgw.plans import quota as plans
from llmgw.services import quota, recovery, tenancy
from llmgw.services.leases import SHARE, Ledger
from llmgw.services.settlement import Settlement

BODY = {"model": "demo", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}


def _limited(**limits):
    Price.create(model="demo", prompt_per_1k=0, completion_per_1k=1_000_000)  # 1,000 micro a token
    project = Project.get(Project.name == "default")
    LimitRule.create(scope_kind="project", scope_id=project.id, **limits)
    key, _ = tenancy.create_key("default")
    return key


def _budget_row():
    return Counter.get(Counter.kind == "budget", Counter.scope_kind == "project",
                       Counter.slot == plans.budget_slot("month", utcnow()))


def test_a_roomy_limit_is_leased_once_and_admits_from_memory(app):
    key = _limited(budget=10_000_000_000, period="month")  # 10,000: room for a million requests
    s = Settlement(flush_seconds=3600)
    conf = app.config["LLMGW"]
    first = quota.reserve(key, "demo", BODY, conf, s.ledger)
    leased = _budget_row().reserved
    assert leased == 10_000_000_000 // SHARE  # an eighth of the room, in one transaction
    for _ in range(200):
        s.add(quota.reserve(key, "demo", BODY, conf, s.ledger), 3, 10, 200)
    assert _budget_row().reserved == leased  # 200 admitted, not one more transaction
    s.add(first, 3, 10, 200)
    assert s.flush() == 201
    row = _budget_row()
    assert (row.used, row.reserved) == (201 * 10_000, leased - 201 * 10_000)
    assert Lease.get().amount == row.reserved
    s.close()  # at exit the worker gives back what it did not use, and leaves
    row = _budget_row()
    assert (row.used, row.reserved) == (201 * 10_000, 0)
    assert Lease.select().count() == 0 and GatewayWorker.select().count() == 0


def test_workers_never_admit_more_than_the_limit_and_the_last_requests_are_exact(app):
    """Three workers (ledgers) take turns against a budget for exactly 150 requests."""
    key = _limited(budget=150 * (10_000 + 54), period="month")  # 54 prompt tokens bound, priced 0
    conf = app.config["LLMGW"]
    workers = [Settlement(flush_seconds=3600) for _ in range(3)]
    admitted = refused = 0
    for i in range(400):
        s = workers[i % 3]
        try:
            res = quota.reserve(key, "demo", BODY, conf, s.ledger)
        except quota.LimitExceeded as e:
            refused += 1
            assert e.kind == "insufficient_quota"
            continue
        admitted += 1
        s.add(res, 54, 10, 200)  # used all it could: nothing comes back
        if i % 7 == 0:
            s.flush()
        row = _budget_row()
        assert row.used + row.reserved <= row_limit(key)
    assert admitted == 150 and refused == 250
    for s in workers:
        s.close()
    row = _budget_row()
    assert row.used == 150 * 10_000 and row.reserved == 0  # the prompt price is 0


def row_limit(key):
    return LimitRule.get(LimitRule.scope_kind == "project").budget


def test_what_a_request_did_not_use_is_free_again_at_once_for_the_next(app):
    key = _limited(tpm=10_000)
    s = Settlement(flush_seconds=3600)
    conf = app.config["LLMGW"]
    res = quota.reserve(key, "demo", dict(BODY, max_tokens=500), conf, s.ledger)
    slice_ = res.holds[0][0]
    before = slice_.free
    s.add(res, 54, 20, 200)  # reserved 554, used 74
    assert slice_.free == before + 554 - 74
    s.close()


def test_a_dead_worker_s_leases_are_released_and_its_streams_billed_for_what_they_relayed(app):
    key = _limited(budget=10_000_000_000, period="month", tpm=1_000_000)
    conf = app.config["LLMGW"]
    dead = Settlement(flush_seconds=3600, ledger=Ledger(dead_after=0.3))
    res = quota.reserve(key, "demo", dict(BODY, max_tokens=100), conf, dead.ledger)
    relayed = [7]
    dead.ledger.inflight[res.request_id] = (res, lambda: relayed[0])
    dead.ledger.beat()  # its last beat: 7 completion tokens relayed so far
    relayed[0] = 40     # ... then it is killed outright: nothing of this reaches the database
    assert _budget_row().reserved > 0 and Lease.select().count() == 2
    alive = Settlement(flush_seconds=3600, ledger=Ledger(dead_after=0.3))
    alive.ledger.ensure_registered()
    deadline = time.monotonic() + 10
    while GatewayWorker.select().where(GatewayWorker.id == dead.ledger.worker).exists():
        assert time.monotonic() < deadline, "the dead worker was not recovered"
        if alive.ledger.beat():  # judges others once its own beats ran 0.3 s without a gap
            recovery.recover_dead(0.3)
        time.sleep(0.05)
    row = _budget_row()
    assert row.reserved == 0 and Lease.select().where(Lease.worker == dead.ledger.worker).count() == 0
    usage = Usage.get(Usage.request_id == res.request_id)
    assert (usage.completion_tokens, usage.status) == (7, 502)
    assert usage.prompt_tokens == res.prompt_estimate and usage.cost == 7 * 1_000
    assert row.used == 7 * 1_000  # counted in the budget, once
    tpm = Counter.select().where(Counter.kind == "tpm", Counter.scope_kind == "project",
                                 Counter.slot != "window")
    assert sum(c.reserved for c in tpm) == 0 and sum(c.used for c in tpm) == res.prompt_estimate + 7
    alive.close()


def test_a_worker_taken_for_dead_while_alive_registers_again_and_bills_nothing_twice(app):
    key = _limited(budget=10_000_000_000, period="month")
    conf = app.config["LLMGW"]
    s = Settlement(flush_seconds=3600, ledger=Ledger(dead_after=0.3))
    res = quota.reserve(key, "demo", BODY, conf, s.ledger)
    s.ledger.inflight[res.request_id] = (res, lambda: 4)
    s.ledger.beat()
    old = s.ledger.worker
    # Its beats stop reaching the database (as when it is cut off from it) for long enough:
    time.sleep(0.35)
    assert recovery.recover_dead(0.3) == 1
    s.add(res, 54, 10, 200)  # the request ends after all
    s.flush()
    rows = list(Usage.select())
    assert len(rows) == 1 and rows[0].completion_tokens == 4  # billed once, by the recovery
    assert s.ledger.worker != old and s.ledger.slices == {}
    res2 = quota.reserve(key, "demo", BODY, conf, s.ledger)  # it leases again as a new worker
    s.add(res2, 54, 10, 200)
    s.close()
    row = _budget_row()
    assert row.reserved == 0 and row.used == 4 * 1_000 + 10 * 1_000


def test_window_slices_are_given_back_when_their_bucket_ends(app):
    key = _limited(rpm=1_000_000)
    s = Settlement(flush_seconds=3600)
    conf = app.config["LLMGW"]
    res = quota.reserve(key, "demo", BODY, conf, s.ledger)
    s.add(res, 1, 1, 200)
    s.flush()
    rows = list(Counter.select().where(Counter.kind == "rpm", Counter.slot != "window",
                                       Counter.scope_kind == "project"))
    assert sum(r.used for r in rows) == 1
    bucket_over = plans.bucket_slot(utcnow() + datetime.timedelta(seconds=plans.BUCKET_SECONDS))
    deadline = time.monotonic() + 3 * plans.BUCKET_SECONDS
    while plans.bucket_slot(utcnow()) < bucket_over:  # wait for the next bucket
        assert time.monotonic() < deadline
        time.sleep(0.05)
    s.flush()
    rows = list(Counter.select().where(Counter.kind == "rpm", Counter.slot != "window",
                                       Counter.scope_kind == "project"))
    assert sum(r.reserved for r in rows) == 0 and Lease.select().count() == 0
    s.close()




def test_the_next_bucket_is_leased_ahead_so_requests_do_not_wait_for_it(app):
    key = _limited(rpm=1_000_000)
    s = Settlement(flush_seconds=3600)
    conf = app.config["LLMGW"]
    deadline = time.monotonic() + 3 * plans.BUCKET_SECONDS
    while plans.epoch(utcnow()) % plans.BUCKET_SECONDS < plans.BUCKET_SECONDS - 0.9:
        assert time.monotonic() < deadline  # into the last 0.9 s of a bucket
        time.sleep(0.02)
    res = quota.reserve(key, "demo", BODY, conf, s.ledger)
    bucket = plans.bucket_slot(utcnow())
    s.ledger.lease_ahead()
    upcoming = str(int(bucket) + plans.BUCKET_SECONDS)
    ahead = [k for k in s.ledger.slices if k[3] == "rpm" and k[4] == upcoming]
    row = Counter.get(Counter.kind == "rpm", Counter.scope_kind == "project", Counter.slot == upcoming)
    if plans.bucket_slot(utcnow()) == bucket:  # (the bucket did not turn while it leased)
        assert ahead and row.reserved == s.ledger.slices[ahead[0]].granted
    first, last = plans.window_slots_of(upcoming)
    window = Counter.select().where(Counter.kind == "rpm", Counter.scope_kind == "project",
                                    Counter.slot >= first, Counter.slot <= last)
    assert sum(c.used + c.reserved for c in window) <= 1_000_000
    s.add(res, 1, 1, 200)
    s.close()  # both slices, this bucket's and the next one's, go back
    assert Lease.select().count() == 0


def test_concurrent_requests_of_one_worker_near_a_limit_admit_exactly_the_limit(app):
    """30 requests at once in one worker against rpm 10: each near-the-end slice is taken by
    the request it was leased for, so none is left stranded and exactly ten are admitted."""
    import threading
    key = _limited(rpm=10)
    s = Settlement(flush_seconds=3600)
    conf = app.config["LLMGW"]
    start, results = threading.Barrier(30), []

    def one():
        start.wait()
        try:
            results.append(quota.reserve(key, "demo", BODY, conf, s.ledger))
        except quota.LimitExceeded as e:
            results.append(e)
    threads = [threading.Thread(target=one) for _ in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    admitted = [r for r in results if not isinstance(r, Exception)]
    assert len(admitted) == 10, [str(r) for r in results if isinstance(r, Exception)][:3]
    assert all("10 requests per minute" in str(r) for r in results if isinstance(r, Exception))
    for res in admitted:
        s.add(res, 1, 1, 200)
    s.close()
