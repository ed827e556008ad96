"""What each configuration value must be: checked with msgspec when the configuration loads,
after LLMGW_* overrides, so a file and the environment are held to the same rules.

A wrong value is refused at once with its key, the form expected and an example, instead of
loading and failing later (a reconciler crashing on `interval = "5s"` minutes after start).
"""
import json
import re
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from .errors import ConfigError

WHOLE = "a whole number"
Port_range = Annotated[str, Meta(pattern=r"^\d{1,5}-\d{1,5}$")]
Listen = Annotated[str, Meta(pattern=r"^(\[[0-9A-Fa-f:.]+\]|[^:\s]*):\d{1,5}$")]


def _whole(lo, hi=None):
    return Annotated[int, Meta(ge=lo, **({"le": hi} if hi is not None else {}))]


def _number(lo, above=False):
    return Annotated[float, Meta(gt=lo) if above else Meta(ge=lo)]


# (type, what the value must be, in words) for the keys that need more than their default's
# type; every other key must have its default's type (a whole number ≥ 0 for integers).
RULES = {
    ("server", "listen"): (Listen, "HOST:PORT, e.g. 127.0.0.1:8080"),
    ("server", "workers"): (_whole(1, 256), f"{WHOLE} from 1 to 256"),
    ("ssh", "connect_timeout"): (_whole(1), f"{WHOLE} of seconds ≥ 1"),
    ("ssh", "command_timeout"): (_whole(1), f"{WHOLE} of seconds ≥ 1"),
    ("ssh", "max_sessions"): (_whole(1, 1024), f"{WHOLE} from 1 to 1024"),
    ("reconciler", "interval"): (_whole(1), f"{WHOLE} of seconds ≥ 1"),
    ("reconciler", "verify_interval"): (_whole(1), f"{WHOLE} of seconds ≥ 1"),
    ("reconciler", "package_lock_retry"): (_whole(1), f"{WHOLE} of seconds ≥ 1"),
    ("reconciler", "health_timeout"): (_whole(1), f"{WHOLE} of seconds ≥ 1"),
    ("reconciler", "gpu_check_interval"): (_whole(1), f"{WHOLE} of seconds ≥ 1"),
    ("reconciler", "node_lost_after"): (_whole(1), f"{WHOLE} of seconds ≥ 1"),
    ("reconciler", "port_range"): (Port_range, 'two ports as "FIRST-LAST", e.g. "18000-18999"'),
    ("accounts", "signup"): (Literal["closed", "open"], '"closed" or "open"'),
    ("accounts", "login_lockout"): (_whole(1), f"{WHOLE} of seconds ≥ 1"),
    ("limits", "default_period"): (Literal["day", "week", "month", "never"],
                                   '"day", "week", "month" or "never"'),
    ("limits", "default_max_tokens"): (_whole(1), f"{WHOLE} ≥ 1"),
    ("gateway", "worker_dead_after"): (_number(0, above=True), "a number of seconds > 0"),
    ("gateway", "connect_timeout"): (_number(0, above=True), "a number of seconds > 0"),
    ("gateway", "first_byte_timeout"): (_number(0, above=True), "a number of seconds > 0"),
    ("gateway", "read_timeout"): (_number(0, above=True), "a number of seconds > 0"),
    ("gateway", "generation_timeout"): (_number(0, above=True), "a number of seconds > 0"),
}


def _rule(section, key, default):
    if (section, key) in RULES:
        return RULES[(section, key)]
    if isinstance(default, bool):
        return bool, "true or false"
    if isinstance(default, int):
        return _whole(0), f"{WHOLE} ≥ 0"
    if isinstance(default, float):
        return _number(0), "a number ≥ 0"
    return str, "a string in double quotes"


def _schema(defaults):
    sections = []
    for section, values in defaults.items():
        fields = [(key, _rule(section, key, default)[0]) for key, default in values.items()]
        sections.append((section, msgspec.defstruct(f"{section.title()}Settings", fields,
                                                    forbid_unknown_fields=True)))
    return msgspec.defstruct("Settings", sections)


_PATH = re.compile(r"at `\$\.(\w+)\.(\w+)`")


def check(conf, defaults, where, env_names):
    """Raise ConfigError naming the first value of conf (a section dict, as loaded) that is not
    what its key takes. where: the file; env_names: {(section, key): variable} for overrides."""
    plain = {section: {key: conf[section][key] for key in values} for section, values in defaults.items()}
    try:
        msgspec.convert(plain, _schema(defaults), strict=True)
    except msgspec.ValidationError as e:
        found = _PATH.search(str(e))
        if not found:
            raise ConfigError(f"{where}: {e}") from None
        section, key = found.groups()
        default = defaults[section][key]
        _, wanted = _rule(section, key, default)
        value = conf[section][key]
        source = env_names.get((section, key)) or where
        example = f"{key} = {_toml(default)}" if default not in ("", None) else f"{key} = ..."
        raise ConfigError(f"{source}: {section}.{key} = {_toml(value)} is not {wanted}; "
                          f"for example [{section}] {example}.") from None


def _toml(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a TOML basic string, escaped alike
    return repr(value)
