"""`flask llmgw limits set|show`, `prices set`, `usage`: what each scope may use, and did."""
import click
import peewee

from ..errors import LlmgwError
from ..models import LimitRule, Price, Project, Usage, utcnow
from ..plans import money
from ..plans.quota import PERIODS
from ..services import limits as limits_service
from ..services import quota
from . import conf, echo_json, llmgw, root_option, table


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
SCOPE_MODELS = limits_service.SCOPES


def _scope(options):
    given = [(kind, value) for kind, value in options.items() if value]
    if len(given) != 1:
        raise LlmgwError("name exactly one scope: --key PREFIX, --project NAME, --team NAME or --org NAME.")
    return given[0]


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
    kind, name = _scope({"key": key, "project": project, "team": team, "org": org})
    rule = limits_service.set_limits(kind, name, rpm=rpm, tpm=tpm, budget=budget, period=period)
    click.echo(f"{kind} {name}: {limits_service.describe(rule)}")


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
    table(rows, [("SCOPE", lambda r: r["scope"]), ("NAME", lambda r: r["name"]), ("RPM", lambda r: r["rpm"]),
                 ("TPM", lambda r: r["tpm"]), ("BUDGET", lambda r: r["budget"]),
                 ("PERIOD", lambda r: r["period"])],
          "no limits set: requests are limited only by limits.default_* in the config "
          "(`llmgw limits set --project P --rpm N` sets one)")
    if prices:
        click.echo("")
        _prices_table(prices)
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


@prices.command("list")
@click.option("--json", "as_json", is_flag=True)
@root_option
def list_prices(as_json):
    """List each model's price, and the default for models without one."""
    c = conf()["prices"]
    rows = [{"model": p.model, "prompt_per_1k": money.as_number(p.prompt_per_1k),
             "completion_per_1k": money.as_number(p.completion_per_1k)}
            for p in Price.select().order_by(Price.model)]
    default = {"prompt_per_1k": money.as_number(c["default_prompt_per_1k_micros"]),
               "completion_per_1k": money.as_number(c["default_completion_per_1k_micros"])}
    if as_json:
        return echo_json({"prices": rows, "default": default})
    _prices_table(rows)
    click.echo(f"other models: {default['prompt_per_1k']:.6f} / {default['completion_per_1k']:.6f} per 1k "
               f"tokens (prices.default_prompt_per_1k / default_completion_per_1k)")


def _prices_table(rows):
    table(rows, [("MODEL", lambda r: r["model"]), ("PROMPT PER 1K", lambda r: f"{r['prompt_per_1k']:.6f}"),
                 ("COMPLETION PER 1K", lambda r: f"{r['completion_per_1k']:.6f}")],
          "no model has a price of its own (`llmgw prices set MODEL --prompt X --completion Y`)")


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
    table(rows, [("MODEL", lambda r: r["model"]), ("REQUESTS", lambda r: r["requests"]),
                 ("PROMPT TOKENS", lambda r: r["prompt"]), ("COMPLETION TOKENS", lambda r: r["completion"]),
                 ("SPEND", lambda r: f"{r['cost']:.6f}")],
          f"no requests from {project} in the last {days} days")
    if refused:
        click.echo("")
        table(refused, [("REFUSED ON", lambda r: r["day"]), ("KEY", lambda r: r["key"]),
                        ("429s", lambda r: r["requests"]), ("WHAT RAN OUT", lambda r: r["type"])], "")

