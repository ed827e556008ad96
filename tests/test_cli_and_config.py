"""init is idempotent, configuration errors name the fix, migrations go both ways."""
from llmgw import config, migrate
from llmgw.cli import llmgw
from llmgw.errors import ConfigError
from llmgw.models import User, database

import pytest


def test_init_twice_changes_nothing_the_second_time(runner, root):
    first = runner.invoke(llmgw, ["init", "--root", str(root), "--admin", "ops@example.com"])
    assert first.exit_code == 0, first.output
    assert "password:" in first.output and "wrote" in first.output
    config_text = (root / "server.toml").read_text()
    key = (root / "ssh" / "id_ed25519").read_bytes()
    second = runner.invoke(llmgw, ["init", "--root", str(root), "--admin", "ops@example.com"])
    assert second.exit_code == 0, second.output
    assert "password:" not in second.output
    for step in ("config", "ssh identity", "default project", "administrator"):
        line = next(x for x in second.output.splitlines() if x.strip().startswith(step))
        assert "kept" in line, line
    assert (root / "server.toml").read_text() == config_text
    assert (root / "ssh" / "id_ed25519").read_bytes() == key
    assert oct((root / "ssh" / "id_ed25519").stat().st_mode & 0o777) == "0o600"
    assert User.select().count() == 1


def test_a_bad_admin_email_is_refused_by_name(runner, root):
    result = runner.invoke(llmgw, ["init", "--root", str(root), "--admin", "nobody"])
    assert result.exit_code != 0 and "'nobody' is not an email address" in result.output


def test_keys_are_shown_once_and_listed_by_prefix(runner, root):
    runner.invoke(llmgw, ["init", "--root", str(root)])
    made = runner.invoke(llmgw, ["keys", "create", "--root", str(root), "--project", "default"])
    key = made.output.splitlines()[0]
    assert key.startswith("sk-llmgw-")
    listed = runner.invoke(llmgw, ["keys", "list", "--root", str(root)])
    assert key[:15] in listed.output and key not in listed.output
    missing = runner.invoke(llmgw, ["keys", "create", "--root", str(root), "--project", "nope"])
    assert "no project named 'nope' (projects: default)" in missing.output


def test_add_node_refuses_a_name_with_shell_characters(runner, root):
    runner.invoke(llmgw, ["init", "--root", str(root)])
    result = runner.invoke(llmgw, ["add-node", "a;touch /tmp/pwned", "--addr", "127.0.0.1",
                                   "--root", str(root)])
    assert result.exit_code != 0 and "is not a usable node name" in result.output


def test_an_unknown_config_key_is_named(root):
    (root / "server.toml").write_text("[server]\nlisten = '1.2.3.4:1'\nlisen = 1\n")
    with pytest.raises(ConfigError, match="unknown key server.lisen"):
        config.load(str(root))


def test_environment_overrides_the_file(root, monkeypatch):
    monkeypatch.setenv("LLMGW_RECONCILER_INTERVAL", "9")
    assert config.load(str(root))["reconciler"]["interval"] == 9
    monkeypatch.setenv("LLMGW_RECONCILER_INTERVAL", "soon")
    with pytest.raises(ConfigError, match="LLMGW_RECONCILER_INTERVAL='soon' is not a whole number"):
        config.load(str(root))


def test_migrations_apply_revert_and_apply_again(app):
    db = database.obj
    assert migrate.upgrade(db) == []
    migrate.downgrade(db, 0)
    assert "node" not in db.get_tables()
    every = [f"{v:04d}_{n}" for v, n, _ in migrate.available()]
    assert every[:2] == ["0001_initial", "0002_node_onboarding"]
    assert migrate.upgrade(db) == every
    assert "node" in db.get_tables()
    migrate.downgrade(db, 1)
    assert "node_event" not in db.get_tables() and "node" in db.get_tables()
    assert migrate.upgrade(db) == every[1:]


def test_serve_starts_a_dying_reconciler_again_with_backoff():
    from llmgw.cli.setup import restart_delay
    assert [restart_delay(n) for n in (1, 2, 3, 6, 7, 20)] == [1, 2, 4, 32, 60, 60]


def test_a_web_worker_does_not_import_ssh_or_the_commands(tmp_path):
    """gunicorn's workers import wsgi: the CLI's modules and the SSH executor (asyncssh) stay
    out of them; a command imports them when it runs."""
    import subprocess
    import sys
    from tests.conftest import TOP
    probe = ("import sys, wsgi; print(sorted(m for m in ('asyncssh', 'llmgw.executors.ssh', "
             "'llmgw.services.nodes', 'llmgw.services.replicas', 'llmgw.cli.cluster', 'llmgw.cli.models') "
             "if m in sys.modules))")
    env = {"PATH": "/usr/bin:/bin", "LLMGW_ROOT": str(tmp_path), "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", probe], cwd=TOP, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    listed = subprocess.run([sys.executable, "-m", "flask", "--app", "llmgw:create_app", "llmgw", "--help"],
                            cwd=TOP, env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "add-node" in listed.stdout and "drain" in listed.stdout, listed.stderr


def _wrong(default):
    """A TOML value of another type than the default's."""
    if isinstance(default, bool):
        return '"yes"'
    if isinstance(default, (int, float)):
        return '"5s"'
    return "5"


def test_every_config_key_with_a_wrong_type_is_refused_by_name_with_an_example(tmp_path):
    import pytest
    from llmgw import config
    from llmgw.errors import ConfigError
    for section, values in config.DEFAULTS.items():
        for key, default in values.items():
            (tmp_path / "server.toml").write_text(f"[{section}]\n{key} = {_wrong(default)}\n")
            with pytest.raises(ConfigError) as refused:
                config.load(str(tmp_path))
            said = str(refused.value)
            assert f"{section}.{key} = " in said and "for example" in said and "\n" not in said, said


def test_out_of_range_and_malformed_settings_stop_every_entry_point_with_one_line(tmp_path):
    import subprocess
    import sys
    from tests.conftest import TOP
    env = {"PATH": "/usr/bin:/bin", "LLMGW_ROOT": str(tmp_path), "HOME": str(tmp_path)}
    cases = {"[server]\nworkers = 0\n": "server.workers = 0 is not a whole number from 1 to 256",
             "[reconciler]\nport_range = \"18000\"\n": 'reconciler.port_range = "18000" is not two ports',
             "[server\nworkers = 2\n": "is not valid TOML"}
    for text, expected in cases.items():
        (tmp_path / "server.toml").write_text(text)
        for argv in ([sys.executable, "-m", "flask", "--app", "llmgw:create_app", "llmgw", "nodes"],
                     [sys.executable, "-m", "gunicorn", "-c", "deploy/gunicorn.conf.py", "wsgi:app"]):
            out = subprocess.run(argv, cwd=TOP, env=env, capture_output=True, text=True, timeout=60)
            lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
            assert out.returncode != 0 and len(lines) == 1 and expected in lines[0], (argv, lines)
    (tmp_path / "server.toml").write_text("")
    bad_env = dict(env, LLMGW_ENGINES_DOWNLOAD_ON_NODE="maybe")
    out = subprocess.run([sys.executable, "-m", "flask", "--app", "llmgw:create_app", "llmgw", "nodes"],
                         cwd=TOP, env=bad_env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "LLMGW_ENGINES_DOWNLOAD_ON_NODE='maybe' is not true or false" in out.stderr


def test_a_busy_port_stops_demo_and_serve_with_one_line_before_anything_starts(tmp_path):
    import socket
    import subprocess
    import sys
    from tests.conftest import TOP
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        addr = f"127.0.0.1:{taken.getsockname()[1]}"
        flask = [sys.executable, "-m", "flask", "--app", "llmgw:create_app", "llmgw"]
        demo = subprocess.run([*flask, "demo", "--listen", addr, "--root", str(tmp_path / "d")], cwd=TOP,
                              env=env, capture_output=True, text=True, timeout=120)
        assert demo.returncode != 0 and demo.stdout == "", demo.stdout
        lines = demo.stderr.strip().splitlines()
        assert len(lines) == 1 and addr in lines[0] and "--listen" in lines[0], lines
        assert not (tmp_path / "d" / "node").exists()  # nothing was set up, no engine started
        subprocess.run([*flask, "init", "--listen", addr, "--root", str(tmp_path / "s")], cwd=TOP,
                       env=env, capture_output=True, check=True, timeout=120)
        serve = subprocess.run([*flask, "serve", "--root", str(tmp_path / "s")], cwd=TOP, env=env,
                               capture_output=True, text=True, timeout=120)
        lines = serve.stderr.strip().splitlines()
        assert serve.returncode != 0 and len(lines) == 1 and "server.listen in " in lines[0], lines
