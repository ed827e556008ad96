"""`flask llmgw limits set|show`, `prices set`, `usage`: what each scope may use, and did."""
import click
import peewee

from ..errors import LlmgwError
from ..models import ApiKey, LimitRule, Org, Price, Project, Team, Usage, utcnow
from ..plans import money
from ..plans.quota import PERIODS
from ..services import quota
from . import echo_json, llmgw, root_option


class Money(click.ParamType):
    """An amount in the currency, kept as whole micro-units: at most six decimals."""

    name = "amount"

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return money.to_micros(value, "")
        except money.MoneyError as e:
            self.fail(str(e).strip(), param, ctx)


MONEY = Money()

SCOPE_MODELS = {"key": (ApiKey, ApiKey.prefix), "project": (Project, Project.name),
                "team": (Team, Team.name), "org": (Org, Org.name)}


def _scope(options):
    given = [(kind, value) for kind, value in options.items() if value]
    if len(given) != 1:
        raise LlmgwError("name exactly one scope: --key PREFIX, --project NAME, --team NAME or --org NAME.")
    kind, value = given[0]
    model, column = SCOPE_MODELS[kind]
    row = model.get_or_none(column == value.rstrip("…"))
    if row is None:
        raise LlmgwError(f"no {kind} {value!r}; `flask llmgw keys list` shows keys, and "
                         f"projects, teams and orgs are named as created.")
    return kind, row


def scope_options(f):
    for kind in ("org", "team", "project", "key"):
        f = click.option(f"--{kind}", default="", help=f"The {kind} to set limits on.")(f)
    return f


@llmgw.group("limits")
def limits():
    """rpm, tpm and budgets on keys, projects, teams and orgs."""


@limits.command("set")
@scope_options
@click.option("--rpm", type=click.IntRange(0), help="Requests per minute (0 removes the limit).")
@click.option("--tpm", type=click.IntRange(0), help="Tokens per minute (0 removes the limit).")
@click.option("--budget", type=MONEY, help="Spend per period, up to 6 decimals (0 removes the budget).")
@click.option("--period", type=click.Choice(PERIODS), help="When the budget starts again.")
@root_option
def set_limits(key, project, team, org, rpm, tpm, budget, period):
    """Set limits on one scope; options not given keep their value."""
    kind, row = _scope({"key": key, "project": project, "team": team, "org": org})
    rule, _ = LimitRule.get_or_create(scope_kind=kind, scope_id=row.id)
    for name, value in (("rpm", rpm), ("tpm", tpm), ("budget", budget), ("period", period)):
        if value is not None:
            setattr(rule, name, value if name == "period" else (value or None))
    rule.save()
    click.echo(f"{kind} {key or project or team or org}: rpm {rule.rpm or 'none'}, "
               f"tpm {rule.tpm or 'none'}, budget "
               f"{money.show(rule.budget) if rule.budget else 'none'} per {rule.period}")


@limits.command("show")
@click.option("--json", "as_json", is_flag=True)
@root_option
def show_limits(as_json):
    """List every limit that is set, and the prices."""
    rows = []
    for rule in LimitRule.select():
        model, column = SCOPE_MODELS[rule.scope_kind]
        scope = model.get_or_none(model.id == rule.scope_id)
        rows.append({"scope": rule.scope_kind, "name": getattr(scope, column.name, "?"),
                     "rpm": rule.rpm, "tpm": rule.tpm,
                     "budget": money.as_number(rule.budget) if rule.budget else None,
                     "period": rule.period})
    prices = [{"model": p.model, "prompt_per_1k": money.as_number(p.prompt_per_1k),
               "completion_per_1k": money.as_number(p.completion_per_1k)} for p in Price.select()]
    if as_json:
        return echo_json({"limits": rows, "prices": prices})
    for r in rows:
        click.echo(f"{r['scope']:<8} {r['name']:<20} rpm {r['rpm'] or '-':<6} tpm {r['tpm'] or '-':<8} "
                   f"budget {r['budget'] or '-'} per {r['period']}")
    for p in prices:
        click.echo(f"price    {p['model']:<20} {p['prompt_per_1k']:.6f} / {p['completion_per_1k']:.6f} "
                   f"per 1k tokens")
    if not prices:
        click.echo("no model has a price: budgets bind only if prices.default_* are set in the config")


@llmgw.group("prices")
def prices():
    """What 1,000 tokens of each model cost."""


@prices.command("set")
@click.argument("model")
@click.option("--prompt", type=MONEY, required=True, help="Per 1,000 prompt tokens, up to 6 decimals.")
@click.option("--completion", type=MONEY, required=True, help="Per 1,000 completion tokens, up to 6 decimals.")
@root_option
def set_price(model, prompt, completion):
    """Set a model's price."""
    Price.insert(model=model, prompt_per_1k=prompt, completion_per_1k=completion).on_conflict(
        conflict_target=[Price.model],
        update={Price.prompt_per_1k: prompt, Price.completion_per_1k: completion}).execute()
    click.echo(f"{model}: {money.show(prompt)} per 1k prompt tokens, {money.show(completion)} per 1k "
               f"completion tokens")


@llmgw.command("usage")
@click.option("--project", default="default", show_default=True)
@click.option("--days", default=30, show_default=True, type=click.IntRange(1))
@click.option("--json", "as_json", is_flag=True)
@root_option
def usage(project, days, as_json):
    """Requests, tokens and spend of a project per model over the last days."""
    import datetime
    row = Project.get_or_none(Project.name == project)
    if row is None:
        raise LlmgwError(f"no project named {project!r}.")
    since = utcnow() - datetime.timedelta(days=days)
    query = (Usage.select(Usage.model, peewee.fn.COUNT(Usage.id).alias("requests"),
                          peewee.fn.SUM(Usage.prompt_tokens).alias("prompt"),
                          peewee.fn.SUM(Usage.completion_tokens).alias("completion"),
                          peewee.fn.SUM(Usage.cost).alias("cost"))
             .where(Usage.project_id == row.id, Usage.created >= since).group_by(Usage.model).dicts())
    rows = [dict(r, prompt=r["prompt"] or 0, completion=r["completion"] or 0,
                 cost=money.as_number(r["cost"])) for r in query]
    refused = quota.refusals(row, since)
    if as_json:
        return echo_json({"models": rows, "refused": refused})
    for r in rows:
        click.echo(f"{r['model']:<24} {r['requests']:>7} requests {r['prompt']:>10} prompt "
                   f"{r['completion']:>10} completion tokens  {r['cost']:.6f}")
    if not rows:
        click.echo(f"no requests from {project} in the last {days} days")
    for r in refused:
        click.echo(f"refused  {r['day']} key {r['key']:<16} {r['requests']:>6} x 429 ({r['type']})")

