"""Failed logins, counted per account and per address in the database, so every gateway worker
and control plane holds the same count and a guesser cannot spread its tries across them.

An account or address that fails `login_failures_per_*` times within `login_lockout` seconds is
refused logins for `login_lockout` seconds from the last failure (0 turns either count off).
An email with no account is counted like one that has an account: the answers do not tell
them apart. A successful login clears its account's count, not its address's.
"""
import datetime

import peewee as pw

from ..models import LoginFailure, database, utcnow


def subjects(email, address, conf):
    """Return {subject: limit} for the counts this login attempt belongs to."""
    a = conf["accounts"]
    out = {}
    if a["login_failures_per_account"] and email:
        out[f"account:{email.strip().lower()}"] = a["login_failures_per_account"]
    if a["login_failures_per_address"] and address:
        out[f"address:{address}"] = a["login_failures_per_address"]
    return out


def blocked_for(counted, now=None):
    """Return the seconds until every count of this attempt lets it try again (0: it may)."""
    now = now or utcnow()
    rows = LoginFailure.select().where(LoginFailure.subject.in_(list(counted)),
                                       LoginFailure.blocked_until > now)
    return max((int((r.blocked_until - now).total_seconds()) + 1 for r in rows), default=0)


def failed(counted, lockout, now=None):
    """Count one failure against each subject; block those that reached their limit."""
    now = now or utcnow()
    window_start = now - datetime.timedelta(seconds=lockout)
    until = now + datetime.timedelta(seconds=lockout)
    with database.atomic():
        for subject, limit in sorted(counted.items()):  # one order: two workers never deadlock
            stale = LoginFailure.first_at < window_start
            (LoginFailure.insert(subject=subject, failures=1, first_at=now)
             .on_conflict(conflict_target=[LoginFailure.subject], update={
                 LoginFailure.failures: pw.Case(None, [(stale, 1)], LoginFailure.failures + 1),
                 LoginFailure.first_at: pw.Case(None, [(stale, now)], LoginFailure.first_at)})
             .execute())
            (LoginFailure.update(blocked_until=until)
             .where((LoginFailure.subject == subject) & (LoginFailure.failures >= limit)).execute())
        prune(now)


def succeeded(email):
    LoginFailure.delete().where(LoginFailure.subject == f"account:{email.strip().lower()}").execute()


def prune(now=None):
    """Forget counts whose window and block are both over; return how many."""
    now = now or utcnow()
    return LoginFailure.delete().where(
        (LoginFailure.first_at < now - datetime.timedelta(days=1))
        & ((LoginFailure.blocked_until.is_null()) | (LoginFailure.blocked_until < now))).execute()
