"""Every listing command: --json parses and gives back the objects made by commands; the text
form has a header, and an empty list says what would fill it."""
import json

import pytest

from llmgw.cli import llmgw


@pytest.fixture
def cmd(runner, root):
    def run(*args, ok=True, input=None):
        result = runner.invoke(llmgw, [*args, "--root", str(root)], input=input)
        if ok:
            assert result.exit_code == 0, f"{args}: {result.output}"
        return result
    run("init", "--admin", "ops@example.com")
    return run


def listing(cmd, *args):
    return json.loads(cmd(*args, "--json").output)


def test_every_listing_gives_back_what_was_made_as_json(cmd, root):
    cmd("org-create", "acme")
    cmd("team-create", "research", "--org", "acme")
    cmd("project-create", "chatbot", "--team", "research")
    made = cmd("users", "create", "ana@example.com", "--project", "chatbot").output
    assert "password:" in made
    key = cmd("keys", "create", "--project", "chatbot", "--name", "ci", "--models", "qwen,llama",
              "--expires-days", "30").output.splitlines()[0]
    cmd("prices", "set", "qwen", "--prompt", "0.5", "--completion", "1.25")
    cmd("limits", "set", "--project", "chatbot", "--rpm", "60", "--budget", "12.5", "--period", "week")
    cmd("model", "add", "qwen", "--engine", "sim", "--replicas", "2")
    cmd("endpoint", "add", "hosted", "--url", "http://192.0.2.7:8000/v1", "--model", "gpt-x")

    projects = listing(cmd, "projects")
    assert {"org": "acme", "team": "research", "project": "chatbot", "members": 1} in projects
    users = {u["email"]: u for u in listing(cmd, "users", "list")}
    assert users["ana@example.com"]["projects"] == ["chatbot"] and not users["ana@example.com"]["admin"]
    assert users["ops@example.com"]["admin"]
    keys = listing(cmd, "keys", "list")
    (k,) = [k for k in keys if k["project"] == "chatbot"]
    assert key.startswith(k["prefix"]) and key not in json.dumps(keys)
    assert k["name"] == "ci" and k["models"] == ["qwen", "llama"] and k["state"] == "live"
    assert k["expires"] and k["last_used"] is None
    assert listing(cmd, "keys", "list", "--project", "default") == []
    prices = listing(cmd, "prices", "list")
    assert prices["prices"] == [{"model": "qwen", "prompt_per_1k": 0.5, "completion_per_1k": 1.25}]
    limits = listing(cmd, "limits", "show")
    assert {"scope": "project", "name": "chatbot", "rpm": 60, "tpm": None, "budget": 12.5,
            "period": "week"} in limits["limits"]
    models = {m["name"]: m for m in listing(cmd, "models")}
    assert models["qwen"]["engine"] == "sim" and models["qwen"]["replicas"] == 2
    assert listing(cmd, "model", "show", "qwen")["name"] == "qwen"
    (e,) = listing(cmd, "endpoint", "list")
    assert e["name"] == "hosted" and e["url"] == "http://192.0.2.7:8000/v1" and e["models"] == ["gpt-x"]
    assert listing(cmd, "replicas") == [] and listing(cmd, "nodes") == []
    assert listing(cmd, "usage", "--project", "chatbot") == {"models": [], "refused": []}
    assert listing(cmd, "mirror", "list") is not None
    status = listing(cmd, "status")
    assert status["nodes"]["total"] == 0 and [m["name"] for m in status["models"]] == ["qwen"]
    assert any("qwen: 0 of 2 replicas ready" in w for w in status["warnings"])
    assert any("endpoint hosted" in w for w in status["warnings"]) is False  # pending: not a warning yet

    # The text forms: a header row, the object on a row of its own.
    text = cmd("keys", "list").output.splitlines()
    assert text[0].split()[:3] == ["KEY", "PROJECT", "NAME"]
    assert any(line.startswith(k["prefix"]) and "qwen, llama" in line for line in text)
    assert cmd("prices", "list").output.splitlines()[0].split()[0] == "MODEL"
    assert cmd("users", "list").output.splitlines()[0].split() == ["EMAIL", "ROLE", "STATE", "PROJECTS"]


def test_an_empty_listing_says_what_would_fill_it(cmd):
    assert "no nodes yet" in cmd("nodes").output
    assert "no replicas yet" in cmd("replicas").output
    assert "no endpoints" in cmd("endpoint", "list").output
    assert "no model has a price of its own" in cmd("prices", "list").output
    assert "no limits set" in cmd("limits", "show").output
    assert "no keys in project default" in cmd("keys", "list", "--project", "default").output
    assert "no models yet" in cmd("models").output
    out = cmd("status").output
    assert "add one with `llmgw add-node" in out and "no warnings" in out


def test_users_reset_password_and_delete(cmd, root):
    from llmgw import security
    from llmgw.models import ApiKey, LoginFailure, User
    cmd("users", "create", "bo@example.com")
    old_token = User.get(User.email == "bo@example.com").session_token
    LoginFailure.create(subject="account:bo@example.com", failures=10)
    out = cmd("users", "reset-password", "bo@example.com").output
    password = out.split("new password ")[1].split()[0]
    bo = User.get(User.email == "bo@example.com")
    assert security.check_password(bo.password_hash, password) and bo.session_token != old_token
    assert not LoginFailure.select().where(LoginFailure.subject == "account:bo@example.com").exists()
    from llmgw.services import tenancy
    row, _ = tenancy.create_key("default", "bo's", user=bo)
    refused = cmd("users", "delete", "bo@example.com", ok=False, input="n\n")
    assert refused.exit_code != 0 and User.get_or_none(User.email == "bo@example.com")
    assert "revoked 1 of its keys" in cmd("users", "delete", "bo@example.com", "--yes").output
    assert User.get_or_none(User.email == "bo@example.com") is None
    key = ApiKey.get_by_id(row.id)
    assert key.revoked is not None and key.user is None
    last = cmd("users", "delete", "ops@example.com", "--yes", ok=False)
    assert last.exit_code != 0 and "last administrator" in last.output
    missing = cmd("users", "reset-password", "nobody@example.com", ok=False)
    assert "no account 'nobody@example.com'" in missing.output


def test_endpoint_remove_names_what_exists(cmd):
    cmd("endpoint", "add", "hosted", "--url", "http://192.0.2.7:8000/v1", "--model", "gpt-x")
    wrong = cmd("endpoint", "remove", "hostd", ok=False)
    assert wrong.exit_code != 0 and "no endpoint called 'hostd' (endpoints: hosted)" in wrong.output
    assert "removed endpoint hosted" in cmd("endpoint", "remove", "hosted").output
    assert listing(cmd, "endpoint", "list") == []


def test_the_llmgw_console_script_runs_the_same_commands_from_any_directory(root, tmp_path):
    import shutil
    import subprocess
    import sys
    from pathlib import Path
    script = Path(sys.executable).parent / "llmgw"
    assert script.exists() or shutil.which("llmgw"), "pip install -e . makes the llmgw script"
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([str(script), "init", "--root", str(root)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    listed = subprocess.run([str(script), "projects", "--json", "--root", str(root)], cwd="/",
                            env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == [{"org": "default", "team": "default", "project": "default", "members": 1}]


def test_a_demo_rerun_keeps_its_key_and_password_or_says_it_reset_the_password(runner, root):
    import re
    from llmgw import security
    from llmgw.models import User

    def demo():
        out = runner.invoke(llmgw, ["demo", "--no-serve", "--root", str(root)])
        assert out.exit_code == 0, out.output
        return (re.search(r"OPENAI_API_KEY=(\S+)", out.output).group(1),
                re.search(r"with password (\S+)", out.output), out.output)
    key, password, _ = demo()
    key2, password2, said = demo()
    assert key2 == key and password2.group(1) == password.group(1) and "kept from the last run" in said
    admin = User.get(User.email == "admin@localhost")
    admin.password_hash = security.hash_password("mine-own-password")  # changed on the profile page
    admin.save()
    for _ in range(2):  # left alone, run after run
        _, shown, said = demo()
        assert shown is None and "changed since the demo set it" in said
        assert security.check_password(User.get_by_id(admin.id).password_hash, "mine-own-password")
    (root / "demo.sealed").unlink()  # as a demo folder from before the demo kept them
    key3, password3, said = demo()
    assert key3 != key and "reset: no password from an earlier run could be read" in said
    assert security.check_password(User.get(User.email == "admin@localhost").password_hash, password3.group(1))
