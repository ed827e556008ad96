"""Load the one TOML configuration file, apply LLMGW_* overrides, and resolve paths.

Everything llmgw keeps lives under one root: a system install uses
/etc/llmgw/server.toml with data in /var/lib/llmgw; `--root DIR` or LLMGW_ROOT
puts config, database, keys and caches under DIR so no root access is needed.
"""
import copy
import os
import tomllib
from pathlib import Path

from .errors import ConfigError

SYSTEM_CONFIG = Path("/etc/llmgw/server.toml")
SYSTEM_DATA = Path("/var/lib/llmgw")

# The llama.cpp build this release was tested with; `engines.llamacpp = ""` disables it.
DEFAULT_LLAMACPP = "b10991"

DEFAULTS = {
    "server": {
        "listen": "127.0.0.1:8080",
        "workers": 2,
        "secret_key": "",
        "public_url": "",
        "access_log": "",
    },
    "database": {"url": ""},
    "ssh": {
        "key": "",
        "connect_timeout": 10,
        "command_timeout": 120,
        "max_sessions": 8,
    },
    "engines": {
        "llamacpp": DEFAULT_LLAMACPP,
        "github_api": "https://api.github.com",
        "github_download": "https://github.com",
        "download_on_node": False,
        "cache": "",
    },
    "reconciler": {
        "interval": 5,
        "verify_interval": 600,
        "package_lock_retry": 10,
        "health_timeout": 180,
        "port_range": "18000-18999",
        "gpu_check_interval": 30,
        "stop_grace": 30,
        "node_lost_after": 120,
    },
    "weights": {
        "reserve": "5G",
        "max_rate": "0",
        "keep_unused": "24h",
        "download_on_node": False,
    },
    "accounts": {
        "signup": "closed",
        "login_failures_per_account": 10,
        "login_failures_per_address": 50,
        "login_lockout": 900,
    },
    "limits": {
        "default_rpm": 0,
        "default_tpm": 0,
        "default_budget": 0.0,
        "default_period": "month",
        "default_max_tokens": 512,
    },
    "prices": {
        "default_prompt_per_1k": 0.0,
        "default_completion_per_1k": 0.0,
    },
    "gateway": {
        "worker_dead_after": 30,
        "shutdown_grace": 25,
        "connect_timeout": 5,
        "first_byte_timeout": 300,
        "read_timeout": 600,
        "generation_timeout": 1800,
        "route_cache_seconds": 2,
        "engine_liveness": 10,
    },
    "metrics": {
        "token": "",
        "dir": "",
    },
}


def resolve_root(root=None):
    """Return the root directory given by argument or LLMGW_ROOT, or None for a system install."""
    root = root or os.environ.get("LLMGW_ROOT")
    return Path(root).expanduser().resolve() if root else None


def config_path(root=None):
    """Return the config file path for this root (or LLMGW_CONFIG when set)."""
    if os.environ.get("LLMGW_CONFIG"):
        return Path(os.environ["LLMGW_CONFIG"])
    root = resolve_root(root)
    return root / "server.toml" if root else SYSTEM_CONFIG


def data_dir(root=None):
    """Return where the database, SSH identity and caches live."""
    root = resolve_root(root)
    return root if root else SYSTEM_DATA


def load(root=None):
    """Read the configuration (defaults when the file does not exist yet) and fill derived paths."""
    path = config_path(root)
    conf = copy.deepcopy(DEFAULTS)
    conf["node_engines"] = {}
    conf["models"] = {}
    if path.exists():
        try:
            found = tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path} is not valid TOML: {e}. Fix the file or move it away and run "
                              f"`flask llmgw init` to write a new one.") from e
        _merge(conf, found, path)
    from .config_schema import check
    check(conf, DEFAULTS, path, _apply_env(conf))
    _check_sizes(conf, path)
    _fill_paths(conf, data_dir(root))
    conf["_path"] = str(path)
    conf["_root"] = str(data_dir(root))
    return conf


# Engines llmgw does not install (Python environments of several GB) but uses where named:
# [node_engines.NODE] vllm = "/path/to/vllm", sglang = "/path/to/python".
PROBED_ENGINES = ("vllm", "sglang")


def _node_engines(found, path):
    table = found.pop("node_engines", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [node_engines] must be a table of [node_engines.NODE] tables.")
    for node, engines in table.items():
        if not isinstance(engines, dict):
            raise ConfigError(f"{path}: node_engines.{node} must be a table like "
                              f'[node_engines.{node}] vllm = "/opt/vllm/bin/vllm".')
        for engine, where in engines.items():
            if engine not in PROBED_ENGINES or not isinstance(where, str) or not where.startswith("/"):
                raise ConfigError(f"{path}: node_engines.{node}.{engine} = {where!r}: name one of "
                                  f"{', '.join(PROBED_ENGINES)} and give an absolute path on the node.")
    return table


def _declared_models(found, path):
    """Return {name: ModelSpec} from the [models.NAME] tables, each checked."""
    from .plans import modelspec
    table = found.pop("models", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [models] must hold [models.NAME] tables.")
    try:
        return {name: modelspec.from_table(name, spec, path) for name, spec in table.items()}
    except modelspec.SpecError as e:
        raise ConfigError(str(e)) from e


def _merge(conf, found, path):
    conf["node_engines"] = _node_engines(found, path)
    conf["models"] = _declared_models(found, path)
    for section, values in found.items():
        if section not in conf or not isinstance(values, dict):
            raise ConfigError(f"{path}: unknown section [{section}]. Known sections: "
                              f"{', '.join(sorted(conf))}.")
        for key, value in values.items():
            if key not in conf[section]:
                raise ConfigError(f"{path}: unknown key {section}.{key}. Known keys in "
                                  f"[{section}]: {', '.join(sorted(conf[section]))}.")
            conf[section][key] = value


def _apply_env(conf):
    """Apply LLMGW_<SECTION>_<KEY> overrides, converted to the default's type; return
    {(section, key): variable} of those applied."""
    applied = {}
    for section, values in conf.items():
        if section not in DEFAULTS:
            continue
        for key, default in values.items():
            name = f"LLMGW_{section}_{key}".upper()
            if name in os.environ:
                values[key] = _convert(name, os.environ[name], DEFAULTS[section][key])
                applied[(section, key)] = name
    return applied


def _convert(name, raw, default):
    if isinstance(default, bool):
        word = raw.strip().lower()
        if word not in ("1", "true", "yes", "on", "0", "false", "no", "off", ""):
            raise ConfigError(f"{name}={raw!r} is not true or false; set it to e.g. true.")
        return word in ("1", "true", "yes", "on")
    if isinstance(default, float):
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is not a number; set it to e.g. {default}.")
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is not a whole number; set it to e.g. {default}.")
    return raw


def _check_sizes(conf, path):
    """Turn size settings like weights.reserve = "5G" into MiB, or say what is wrong."""
    from .plans import modelspec, nodespec
    try:
        conf["weights"]["reserve_mb"] = modelspec.parse_size(str(conf["weights"]["reserve"]),
                                                             "weights.reserve")
        conf["weights"]["max_rate_bytes"] = modelspec.parse_bytes(
            str(conf["weights"]["max_rate"]), "weights.max_rate")
        keep = str(conf["weights"]["keep_unused"]).strip()
        conf["weights"]["keep_unused_seconds"] = 0 if keep == "0" else \
            nodespec.parse_duration(keep, "weights.keep_unused")
    except (modelspec.SpecError, ValueError) as e:
        raise ConfigError(f"{path}: {e}") from e
    _check_money(conf, path)


def _check_money(conf, path):
    """Keep money settings as micro-units too (limits.default_budget_micros, …), or say which
    one cannot be held exactly."""
    from .plans import money
    for section, key in (("limits", "default_budget"), ("prices", "default_prompt_per_1k"),
                         ("prices", "default_completion_per_1k")):
        try:
            conf[section][f"{key}_micros"] = money.to_micros(conf[section][key], f"{section}.{key} =")
        except money.MoneyError as e:
            raise ConfigError(f"{path}: {e}") from e


def _fill_paths(conf, data):
    if not conf["database"]["url"]:
        conf["database"]["url"] = f"sqlite:///{data / 'llmgw.db'}"
    if not conf["ssh"]["key"]:
        conf["ssh"]["key"] = str(data / "ssh" / "id_ed25519")
    if not conf["engines"]["cache"]:
        conf["engines"]["cache"] = str(data / "cache")
    if not conf["server"]["public_url"]:
        conf["server"]["public_url"] = f"http://{conf['server']['listen']}"


def render_initial(listen, secret_key, llamacpp=DEFAULT_LLAMACPP, metrics_token=""):
    """Return the text of a new server.toml, with every section present and commented."""
    return f"""# llmgw control plane configuration. Every key is described in docs/reference.md.
# Environment variables LLMGW_<SECTION>_<KEY> override what is written here.

[server]
listen = "{listen}"
secret_key = "{secret_key}"

[database]
# Empty: SQLite under the data directory. postgresql://user:pass@host/db for several control planes.
url = ""

[engines]
# The llama.cpp release every node should have; "" disables installing it.
llamacpp = "{llamacpp}"

[reconciler]
interval = 5

[metrics]
# The bearer token a Prometheus scraper sends to GET /metrics; "" turns /metrics off.
token = "{metrics_token}"
"""
