"""Money as whole micro-units (millionths of the currency): exact sums, no float drift.

Prices are kept as micro-units per 1,000 tokens; a request's cost is rounded up to a whole
micro-unit, so what is reserved for a worst case always covers what the request then costs.
"""
import decimal

MICRO = 1_000_000


class MoneyError(ValueError):
    """A value that is not an amount of money this system can hold exactly."""


def to_micros(value, what="amount"):
    """Return a non-negative amount (a string, int, float or Decimal in the currency) as
    micro-units; refuse one finer than a millionth or not a number, naming it."""
    if isinstance(value, bool):
        raise MoneyError(f"{what} {value!r} is not a number; give an amount such as 2.50")
    try:
        amount = decimal.Decimal(str(value).strip())
    except decimal.InvalidOperation:
        raise MoneyError(f"{what} {value!r} is not a number; give an amount such as 2.50") from None
    if not amount.is_finite() or amount < 0:
        raise MoneyError(f"{what} {value!r} must be a finite amount of 0 or more, such as 2.50")
    micros = amount * MICRO
    if micros != micros.to_integral_value():
        raise MoneyError(f"{what} {value!r} is finer than a millionth of the currency; round it "
                         f"to at most 6 decimals, such as {amount.quantize(decimal.Decimal('0.000001'))}")
    return int(micros)


def show(micros):
    """Return micro-units as the currency with six decimals ('0.001500')."""
    micros = int(micros or 0)
    sign = "-" if micros < 0 else ""
    whole, part = divmod(abs(micros), MICRO)
    return f"{sign}{whole}.{part:06d}"


def as_number(micros):
    """Return micro-units as a JSON number in the currency (for --json output)."""
    return float(decimal.Decimal(int(micros or 0)) / MICRO)


def cost(prompt_tokens, completion_tokens, price):
    """Return micro-units a request costs; price = (prompt, completion) micro-units per 1k
    tokens. Rounded up: a larger count never costs less."""
    total = int(prompt_tokens) * int(price[0]) + int(completion_tokens) * int(price[1])
    return -(-total // 1000)
