"""Failed logins, counted per account and per address in the database, so every gateway worker
and control plane holds the same count and a guesser cannot spread its tries across them.

Every attempt is counted before its password is checked. An account or address whose count
within `login_lockout` seconds goes past `login_failures_per_*` is refused logins for
`login_lockout` seconds (0 turns either count off). An email with no account is counted like
one that has an account: the answers do not tell them apart. A successful login clears its
account's count and takes itself back from its address's.
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


def attempt(counted, lockout, now=None):
    """Count this attempt against each subject before its password is checked; return the
    seconds to wait when one of them is over its limit (0: check the password).

    Counting first is what makes the limit hold for a burst: guesses sent at once each take
    their number in the database before any hash is computed, so no more than the limit of
    them reach one, whatever the concurrency. A block that has run out starts a new count.
    """
    now = now or utcnow()
    window_start = now - datetime.timedelta(seconds=lockout)
    until = now + datetime.timedelta(seconds=lockout)
    wait = 0
    with database.atomic():
        for subject, limit in sorted(counted.items()):  # one order: two workers never deadlock
            # One statement counts it: concurrent attempts queue on the row (PostgreSQL) or the
            # database (SQLite), and each reads back the count its own increment made. A block
            # still running is left as it is; one that has run out starts a new count.
            expired = LoginFailure.blocked_until <= now
            fresh = (LoginFailure.first_at < window_start) | expired
            (LoginFailure.insert(subject=subject, failures=1, first_at=now)
             .on_conflict(conflict_target=[LoginFailure.subject], update={
                 LoginFailure.failures: pw.Case(None, [(fresh, 1)], LoginFailure.failures + 1),
                 LoginFailure.first_at: pw.Case(None, [(fresh, now)], LoginFailure.first_at),
                 LoginFailure.blocked_until: pw.Case(None, [(expired, None)], LoginFailure.blocked_until)})
             .execute())
            count, blocked = (LoginFailure.select(LoginFailure.failures, LoginFailure.blocked_until)
                              .where(LoginFailure.subject == subject).tuples().get())
            if blocked is not None and blocked > now:
                wait = max(wait, int((blocked - now).total_seconds()) + 1)
            elif count > limit:
                LoginFailure.update(blocked_until=until).where(LoginFailure.subject == subject).execute()
                wait = max(wait, lockout)
        prune(now)
    return wait


def succeeded(counted):
    """The password was right: forget the account's count, and take this attempt back from the
    address's (it was no failure)."""
    with database.atomic():
        for subject in counted:
            if subject.startswith("account:"):
                LoginFailure.delete().where(LoginFailure.subject == subject).execute()
            else:
                LoginFailure.update(failures=LoginFailure.failures - 1).where(
                    (LoginFailure.subject == subject) & (LoginFailure.failures > 0)).execute()


def unblock(email):
    """Forget an account's failed logins (and a block they set); an administrator's reset."""
    return LoginFailure.delete().where(LoginFailure.subject == f"account:{email.strip().lower()}").execute()


def prune(now=None):
    """Forget counts whose window and block are both over; return how many."""
    now = now or utcnow()
    return LoginFailure.delete().where(
        (LoginFailure.first_at < now - datetime.timedelta(days=1))
        & ((LoginFailure.blocked_until.is_null()) | (LoginFailure.blocked_until < now))).execute()
