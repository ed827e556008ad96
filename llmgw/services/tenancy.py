"""Orgs, teams, projects, users and API keys."""
import datetime

from .. import security
from ..errors import LlmgwError
from ..models import ApiKey, Membership, Org, Project, Team, User, database, utcnow

DEFAULT = "default"


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


def lookup_key(key):
    """Return the live ApiKey row for a presented key, or None."""
    row = ApiKey.get_or_none(ApiKey.key_hash == security.hash_key(key))
    if row is None or row.revoked is not None:
        return None
    if row.expires is not None and row.expires <= utcnow():
        return None
    return row


def revoke_key(prefix):
    """Revoke the key whose display prefix is given; return the row."""
    row = ApiKey.get_or_none(ApiKey.prefix == prefix)
    if row is None:
        raise LlmgwError(f"no key starts with {prefix!r}; `flask llmgw keys list` shows them.")
    row.revoked = utcnow()
    row.save()
    return row
