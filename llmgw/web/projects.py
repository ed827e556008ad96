"""Orgs, teams and projects in the browser: the tree with each scope's limits (editable, with
the checks of `limits set`), what each has spent this period, a project's members and keys."""
from flask import Blueprint, abort, flash, redirect, render_template, request, url_for

from ..errors import LlmgwError
from ..models import Counter, LimitRule, Membership, Org, Project, Team, User, utcnow
from ..plans import quota
from ..services import limits, tenancy
from . import admin_required

bp = Blueprint("projects", __name__)


def _project(name):
    project = Project.get_or_none(Project.name == name)
    if project is None:
        abort(404, f"There is no project called {name!r}.")
    return project


def _rules():
    return {(r.scope_kind, r.scope_id): r for r in LimitRule.select()}


def _spent(rules, now):
    """{(kind, id): micro-units spent in the period each budget counts}."""
    out = {}
    for (kind, sid), r in rules.items():
        if r.budget:
            c = Counter.get_or_none(Counter.scope_kind == kind, Counter.scope_id == sid, Counter.kind == "budget",
                                    Counter.slot == quota.budget_slot(r.period, now))
            out[(kind, sid)] = (c.used + c.reserved) if c else 0
    return out


@bp.get("/projects")
@admin_required
def projects_page():
    rules = _rules()
    orgs = []
    for org in Org.select().order_by(Org.name):
        teams = []
        for team in Team.select().where(Team.org == org).order_by(Team.name):
            projects = [{"p": p, "members": Membership.select().where(Membership.project == p).count(),
                         "keys": p.keys.count()}
                        for p in Project.select().where(Project.team == team).order_by(Project.name)]
            teams.append({"t": team, "projects": projects})
        orgs.append({"o": org, "teams": teams})
    return render_template("projects.html", orgs=orgs, rules=rules, spent=_spent(rules, utcnow()),
                           periods=quota.PERIODS)


@bp.get("/projects/<name>")
@admin_required
def project_page(name):
    project = _project(name)
    rules = _rules()
    members = list(User.select().join(Membership).where(Membership.project == project).order_by(User.email))
    return render_template("project.html", project=project, members=members, rules=rules,
                           spent=_spent(rules, utcnow()), keys=tenancy.key_views(project.name),
                           periods=quota.PERIODS)


@bp.post("/projects/limits")
@admin_required
def set_limits():
    kind, name = request.form.get("kind", ""), request.form.get("name", "")
    sid = request.form.get("sid", "")
    try:
        rule = limits.set_limits(kind, name, int(sid) if sid.isdigit() else None,
                                 rpm=request.form.get("rpm"), tpm=request.form.get("tpm"),
                                 budget=request.form.get("budget"), period=request.form.get("period"))
        flash(f"Limits of {kind} {name}: {limits.describe(rule)}. Workers apply them within a second.")
    except LlmgwError as e:
        flash(f"Limits of {kind} {name} not changed: {e}")
    # Back to the page the form was on: one of ours, never an address the form names.
    pages = {url_for("quotas.quotas"), url_for("projects.projects_page")}
    if kind == "project":
        pages.add(url_for("projects.project_page", name=name))
    back = request.form.get("back", "")
    return redirect(back if back in pages else url_for("projects.projects_page"))


@bp.post("/projects/create")
@admin_required
def create():
    what, name, parent = request.form.get("what", ""), request.form.get("name", "").strip(), request.form.get("parent", "")
    try:
        if what == "org":
            tenancy.create_org(name)
        elif what == "team":
            tenancy.create_team(name, parent)
        elif what == "project":
            if not parent.isdigit():
                raise LlmgwError("choose the team it belongs to.")
            tenancy.create_project(name, team_id=int(parent))
        else:
            raise LlmgwError(f"unknown kind {what!r}: org, team or project.")
        flash(f"Created {what} {name}.")
    except LlmgwError as e:
        flash(f"{what.capitalize() or 'Nothing'} not created: {e}")
    return redirect(url_for("projects.projects_page"))


@bp.post("/projects/<name>/members")
@admin_required
def members(name):
    project = _project(name)
    email, action = request.form.get("email", "").strip(), request.form.get("action", "")
    try:
        user = tenancy.find_user(email)
        if action == "add":
            Membership.get_or_create(user=user, project=project)
            flash(f"{email} is a member of {name}.")
        elif action == "remove":
            revoked = tenancy.remove_member(user, project)
            flash(f"{email} is no longer a member of {name}" + (f"; revoked the {revoked} key(s) it made there."
                                                                 if revoked else "."))
        else:
            raise LlmgwError(f"unknown action {action!r}.")
    except LlmgwError as e:
        flash(f"Members of {name} not changed: {e}")
    return redirect(url_for("projects.project_page", name=name))
