"""Orgs, teams, projects, users and API keys."""
import datetime

from peewee import fn

from .. import security
from ..errors import LlmgwError
from ..models import ApiKey, Membership, Org, Project, Team, Usage, User, database, new_session_token, utcnow

DEFAULT = "default"
MAX_KEY_DAYS = 3650  # a key's expiry, at most ten years ahead


def ensure_default_project():
    """Create the default org/team/project; return (project, created)."""
    with database.atomic():
        org, _ = Org.get_or_create(name=DEFAULT)
        team, _ = Team.get_or_create(org=org, name=DEFAULT)
        project, created = Project.get_or_create(name=DEFAULT, defaults={"team": team})
    return project, created


def ensure_admin(email):
    """Create an administrator with a generated password; return (user, password or None if kept)."""
    if "@" not in email or email.startswith("@") or email.endswith("@"):
        raise LlmgwError(f"{email!r} is not an email address; pass --admin you@example.com.")
    user = User.get_or_none(User.email == email)
    if user:
        return user, None
    password = security.generate_password()
    with database.atomic():
        user = User.create(email=email, password_hash=security.hash_password(password),
                           is_admin=True)
        project, _ = ensure_default_project()
        Membership.create(user=user, project=project)
    return user, password


def find_project(name):
    """Return the project called name or raise with the names that exist."""
    project = Project.get_or_none(Project.name == name)
    if project is None:
        names = ", ".join(p.name for p in Project.select().order_by(Project.name)) or "none"
        raise LlmgwError(f"no project named {name!r} (projects: {names}).")
    return project


def create_key(project_name, name="", user=None, models=None, expires_days=None):
    """Create an API key in a project; return (row, the key itself — shown once)."""
    project = find_project(project_name)
    key = security.generate_key()
    expires = utcnow() + datetime.timedelta(days=expires_days) if expires_days else None
    row = ApiKey.create(project=project, user=user, name=name, prefix=security.display_prefix(key),
                        key_hash=security.hash_key(key), models=models, expires=expires)
    return row, key


def key_views(project_name=None, user=None, now=None):
    """Return keys as dicts (their starts only), newest first: project, name, owner, models,
    expiry, last use (from the usage rows) and state (live, expired, revoked)."""
    now = now or utcnow()
    query = ApiKey.select(ApiKey, Project).join(Project)
    if project_name:
        query = query.where(ApiKey.project == find_project(project_name))
    if user is not None:
        query = query.where(ApiKey.user == user)
    keys = list(query.order_by(ApiKey.id.desc()))
    used = dict(Usage.select(Usage.key_id, fn.MAX(Usage.created)).where(
        Usage.key_id.in_([k.id for k in keys])).group_by(Usage.key_id).tuples()) if keys else {}
    owners = {u.id: u.email for u in User.select(User.id, User.email).where(
        User.id.in_([k.user_id for k in keys if k.user_id]))} if keys else {}
    return [{"id": k.id, "prefix": k.prefix, "project": k.project.name, "name": k.name,
             "user": owners.get(k.user_id), "models": k.models or [], "created": k.created,
             "expires": k.expires, "last_used": used.get(k.id), "revoked": k.revoked,
             "state": "revoked" if k.revoked else "expired" if k.expires and k.expires <= now else "live"}
            for k in keys]


def lookup_key(key):
    """Return the live ApiKey row for a presented key, or None."""
    row = ApiKey.get_or_none(ApiKey.key_hash == security.hash_key(key))
    if row is None or row.revoked is not None:
        return None
    if row.expires is not None and row.expires <= utcnow():
        return None
    return row


def find_key(given):
    """Return the key row for a whole key, or for the start of one as `keys list` shows it
    (any unique start of that, with or without the trailing "…")."""
    given = given.strip().rstrip("…")
    row = ApiKey.get_or_none(ApiKey.key_hash == security.hash_key(given))
    if row is not None:
        return row
    shown = security.display_prefix(given)
    if len(given) > len(shown):
        raise LlmgwError(f"{given[:len(shown)]}… is not a key this control plane made, and only its "
                         f"first {len(shown)} characters are kept apart from the key's hash; give the "
                         "whole key, or its start as `flask llmgw keys list` shows it.")
    if len(given) < len(security.KEY_PREFIX) + 2:
        raise LlmgwError(f"{given!r} is too short to name one key; give at least "
                         f"{len(security.KEY_PREFIX) + 2} characters as `flask llmgw keys list` shows them.")
    rows = list(ApiKey.select().where(fn.SUBSTR(ApiKey.prefix, 1, len(given)) == given).order_by(ApiKey.id))
    if not rows:
        raise LlmgwError(f"no key starts with {given!r}; `flask llmgw keys list` shows them.")
    if len(rows) > 1:
        raise LlmgwError(f"{len(rows)} keys start with {given!r} ({', '.join(r.prefix + '…' for r in rows[:5])}); "
                         "give more of the key.")
    return rows[0]


def revoke_key(given):
    """Revoke the key named by find_key; return the row."""
    row = find_key(given)
    if row.revoked is not None:
        raise LlmgwError(f"key {row.prefix}… was already revoked at {row.revoked:%Y-%m-%d %H:%M} UTC.")
    row.revoked = utcnow()
    row.save()
    return row


MIN_PASSWORD = 10


def check_password_rule(password):
    if len(password or "") < MIN_PASSWORD:
        raise LlmgwError(f"a password needs at least {MIN_PASSWORD} characters.")


def find_user(email):
    user = User.get_or_none(User.email == email)
    if user is None:
        raise LlmgwError(f"no account {email!r}; `flask llmgw users list` shows them.")
    return user


def sign_up(email, password):
    """Create an account waiting for an administrator's approval."""
    if "@" not in email or email.startswith("@") or email.endswith("@"):
        raise LlmgwError(f"{email!r} is not an email address.")
    check_password_rule(password)
    if User.get_or_none(User.email == email):
        raise LlmgwError(f"{email} already has an account; log in, or ask an administrator.")
    return User.create(email=email, password_hash=security.hash_password(password), is_active=False)


def create_user(email, admin=False, project=None):
    """Create an active account with a generated password; return (user, password). Nothing
    is created when the project does not exist."""
    found = find_project(project) if project else None
    password = security.generate_password()
    with database.atomic():
        user = sign_up(email, password)
        user.is_active, user.is_admin = True, admin
        user.save()
        if found:
            Membership.create(user=user, project=found)
    return user, password


def approve(email, project_name):
    """Let a pending account in, as a member of a project."""
    user, project = find_user(email), find_project(project_name)
    with database.atomic():
        user.is_active = True
        user.save()
        Membership.get_or_create(user=user, project=project)
    return user


def set_admin(email, admin):
    user = find_user(email)
    if not admin and user.is_admin and User.select().where(User.is_admin, User.is_active).count() == 1:
        raise LlmgwError(f"{email} is the last administrator; promote another one first.")
    user.is_admin = admin
    user.save()
    return user


def reset_password(email):
    """Give an account a new generated password, end its sessions and lift a login block on it;
    return the password (shown once)."""
    from .logins import unblock
    user = find_user(email)
    password = security.generate_password()
    with database.atomic():
        user.password_hash = security.hash_password(password)
        user.session_token = new_session_token()
        user.save()
        unblock(email)
    return password


def remove_member(user, project):
    """Take an account out of a project and revoke the keys it made there (they would go on
    spending the project's budget); return how many were revoked."""
    with database.atomic():
        Membership.delete().where(Membership.user == user, Membership.project == project).execute()
        return _revoke_keys_of(user, ApiKey.project == project)


def _revoke_keys_of(user, *where):
    """Revoke the live keys an account made (where further narrowed); return how many."""
    return ApiKey.update(revoked=utcnow()).where(ApiKey.user == user, ApiKey.revoked.is_null(), *where).execute()


def _last_admin(user):
    return user.is_admin and user.is_active and User.select().where(User.is_admin, User.is_active).count() == 1


def delete_user(email):
    """Delete an account: its memberships go, the keys it made are revoked (their usage stays).
    Refused for the last active administrator. Return how many keys were revoked."""
    user = find_user(email)
    if _last_admin(user):
        raise LlmgwError(f"{email} is the last administrator; promote another one first "
                         f"(`flask llmgw users promote EMAIL`).")
    with database.atomic():
        revoked = _revoke_keys_of(user)
        ApiKey.update(user=None).where(ApiKey.user == user).execute()
        Membership.delete().where(Membership.user == user).execute()
        user.delete_instance()
    return revoked


def change_password(user, current, new):
    if not security.check_password(user.password_hash, current):
        raise LlmgwError("the current password is not right.")
    check_password_rule(new)
    user.password_hash = security.hash_password(new)
    user.save()


def create_org(name):
    return Org.create(name=_new_name(Org, name, "org"))


def create_team(name, org_name):
    org = Org.get_or_none(Org.name == org_name)
    if org is None:
        raise LlmgwError(f"no org named {org_name!r}.")
    if Team.get_or_none(Team.org == org, Team.name == name):
        raise LlmgwError(f"org {org_name} already has a team {name!r}.")
    return Team.create(org=org, name=name)


def create_project(name, team_name=None, team_id=None):
    """Create a project in a team, named (refused when two orgs have a team of that name) or
    given by id (the pages)."""
    team = Team.get_or_none(Team.id == team_id) if team_id is not None else find_team(team_name)
    if team is None:
        raise LlmgwError(f"no team with id {team_id}.")
    return Project.create(name=_new_name(Project, name, "project"), team=team)


def find_team(name):
    """Return the team of that name; team names are unique only within an org, so a name two
    orgs use is refused with both."""
    teams = list(Team.select(Team, Org).join(Org).where(Team.name == name))
    if not teams:
        raise LlmgwError(f"no team named {name!r}.")
    if len(teams) > 1:
        raise LlmgwError(f"{len(teams)} orgs have a team named {name!r} "
                         f"({', '.join(t.org.name for t in teams)}); use the projects page, which "
                         f"names each team with its org.")
    return teams[0]


def _new_name(model, name, what):
    if not name or len(name) > 64 or not name.replace("-", "").replace("_", "").isalnum():
        raise LlmgwError(f"{name!r} is not a usable {what} name: letters, digits, '-' and '_', "
                         f"at most 64.")
    if model.get_or_none(model.name == name):
        raise LlmgwError(f"there is already a {what} called {name!r}.")
    return name
