"""Setting limits on a scope (a key, project, team or org): one set of checks for `limits set`
and the projects page."""
from ..errors import LlmgwError
from ..models import ApiKey, LimitRule, Org, Project, Team
from ..plans import money
from ..plans.quota import PERIODS

SCOPES = {"key": (ApiKey, ApiKey.prefix), "project": (Project, Project.name),
          "team": (Team, Team.name), "org": (Org, Org.name)}


def find_scope(kind, name, scope_id=None):
    """Return the row of a scope by kind and name (a key by the start `keys list` shows), or by
    id (the pages, where two orgs' teams may share a name)."""
    if kind not in SCOPES:
        raise LlmgwError(f"{kind!r} is not a scope: key, project, team or org.")
    model, column = SCOPES[kind]
    if scope_id is not None:
        row = model.get_or_none(model.id == scope_id)
        if row is None:
            raise LlmgwError(f"no {kind} with id {scope_id}; reload the page.")
        return row
    if kind == "team":
        from .tenancy import find_team
        return find_team(name)
    row = model.get_or_none(column == name.rstrip("…"))
    if row is None:
        raise LlmgwError(f"no {kind} {name!r}; `llmgw keys list` shows keys, and `llmgw projects` "
                         f"projects, teams and orgs.")
    return row


def parse(rpm=None, tpm=None, budget=None, period=None):
    """Check values given as text (a form) or numbers (the CLI); None or "" leaves one as it is.
    Return a dict of the values to set: 0 removes a limit."""
    out = {}
    for name, value in (("rpm", rpm), ("tpm", tpm)):
        if value is None or value == "":
            continue
        try:
            number = int(str(value).strip())
            if number < 0:
                raise ValueError
        except ValueError:
            raise LlmgwError(f"{name} {value!r} is not a whole number of 0 or more (0 removes the limit).") from None
        out[name] = number
    if budget is not None and budget != "":
        try:
            out["budget"] = budget if isinstance(budget, int) else money.to_micros(str(budget).strip(), "budget")
        except money.MoneyError as e:
            raise LlmgwError(str(e).strip()) from None
    if period:
        if period not in PERIODS:
            raise LlmgwError(f"period {period!r} is not one of {', '.join(PERIODS)}.")
        out["period"] = period
    return out


def set_limits(kind, name, scope_id=None, **values):
    """Set the given limits on one scope; the others keep their value. Return the rule."""
    row = find_scope(kind, name, scope_id)
    changes = parse(**values)
    if not changes:
        raise LlmgwError("nothing to change: give rpm, tpm, a budget or its period.")
    rule, _ = LimitRule.get_or_create(scope_kind=kind, scope_id=row.id)
    for field, value in changes.items():
        setattr(rule, field, value if field == "period" else (value or None))
    rule.save()
    return rule


def describe(rule):
    return (f"rpm {rule.rpm or 'none'}, tpm {rule.tpm or 'none'}, budget "
            f"{money.show(rule.budget) if rule.budget else 'none'} per {rule.period}")
