"""`flask llmgw users …`, `orgs|teams|projects create`, and listing the hierarchy."""
import click

from ..models import Membership, Org, Project, Team, User
from ..services import tenancy
from . import echo_json, llmgw, root_option, table


@llmgw.group("users")
def users():
    """Accounts: create, approve sign-ups, promote and demote administrators."""


@users.command("create")
@click.argument("email")
@click.option("--admin", is_flag=True)
@click.option("--project", default="default", show_default=True)
@root_option
def create(email, admin, project):
    """Create an account and print its generated password (shown once)."""
    user, password = tenancy.create_user(email, admin, project)
    click.echo(f"created {user.email}{' (administrator)' if admin else ''} in {project}; "
               f"password: {password}")


@users.command("approve")
@click.argument("email")
@click.option("--project", default="default", show_default=True)
@root_option
def approve(email, project):
    """Let a signed-up account in, as a member of a project."""
    tenancy.approve(email, project)
    click.echo(f"approved {email} into {project}")


@users.command("promote")
@click.argument("email")
@root_option
def promote(email):
    """Make an account an administrator."""
    tenancy.set_admin(email, True)
    click.echo(f"{email} is an administrator")


@users.command("demote")
@click.argument("email")
@root_option
def demote(email):
    """Take administration away from an account."""
    tenancy.set_admin(email, False)
    click.echo(f"{email} is no longer an administrator")


@users.command("reset-password")
@click.argument("email")
@root_option
def reset_password(email):
    """Give an account a new password (printed once), log it out everywhere and lift a login
    block on it."""
    password = tenancy.reset_password(email)
    click.echo(f"{email}: new password {password} (shown once); its sessions have ended and "
               f"failed logins are forgotten")


@users.command("delete")
@click.argument("email")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@root_option
def delete(email, yes):
    """Delete an account; the keys it made are revoked, its usage history stays."""
    tenancy.find_user(email)
    if not yes:
        click.confirm(f"Delete {email} and revoke the keys it made?", abort=True)
    revoked = tenancy.delete_user(email)
    click.echo(f"deleted {email}" + (f"; revoked {revoked} of its keys" if revoked else ""))


@users.command("list")
@click.option("--json", "as_json", is_flag=True)
@root_option
def list_users(as_json):
    """List accounts, their state and projects."""
    rows = [{"email": u.email, "admin": u.is_admin,
             "state": "active" if u.is_active else "waiting for approval",
             "projects": [m.project.name for m in u.memberships.join(Project)]}
            for u in User.select().order_by(User.email)]
    if as_json:
        return echo_json(rows)
    table(rows, [("EMAIL", lambda r: r["email"]), ("ROLE", lambda r: "admin" if r["admin"] else "user"),
                 ("STATE", lambda r: r["state"]), ("PROJECTS", lambda r: r["projects"])],
          "no accounts yet: `llmgw users create EMAIL`")


@llmgw.command("org-create")
@click.argument("name")
@root_option
def org_create(name):
    """Create an org."""
    tenancy.create_org(name)
    click.echo(f"created org {name}")


@llmgw.command("team-create")
@click.argument("name")
@click.option("--org", required=True)
@root_option
def team_create(name, org):
    """Create a team in an org."""
    tenancy.create_team(name, org)
    click.echo(f"created team {name} in {org}")


@llmgw.command("project-create")
@click.argument("name")
@click.option("--team", required=True)
@root_option
def project_create(name, team):
    """Create a project in a team."""
    tenancy.create_project(name, team)
    click.echo(f"created project {name} in {team}")


@llmgw.command("projects")
@click.option("--json", "as_json", is_flag=True)
@root_option
def projects(as_json):
    """List orgs, teams and projects, with member counts."""
    rows = [{"org": p.team.org.name, "team": p.team.name, "project": p.name,
             "members": Membership.select().where(Membership.project == p).count()}
            for p in Project.select(Project, Team, Org).join(Team).join(Org).order_by(Org.name, Team.name, Project.name)]
    if as_json:
        return echo_json(rows)
    table(rows, [("ORG", lambda r: r["org"]), ("TEAM", lambda r: r["team"]),
                 ("PROJECT", lambda r: r["project"]), ("MEMBERS", lambda r: r["members"])],
          "no projects yet: `llmgw init` makes default/default/default")
