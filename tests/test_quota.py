"""Limits and money: admission reserves the worst case, settles to what was used, 429s name why."""
import datetime
import json

import pytest

from llmgw.models import Counter, LimitRule, Model, Price, Project, Usage, utcnow
from llmgw.plans import quota
from llmgw.services import tenancy
from tests.conftest import reconcile, settle_now

NOW = datetime.datetime(2026, 11, 29, 19, 30, 15)
DEFAULTS = {"default_rpm": 0, "default_tpm": 0, "default_budget": 5.0, "default_budget_micros": 5_000_000,
            "default_period": "day", "default_max_tokens": 512}


class Rule:
    def __init__(self, **kw):
        self.rpm, self.tpm, self.budget, self.period = (kw.get(k) for k in ("rpm", "tpm", "budget", "period"))


def test_a_default_applies_at_the_project_only_where_no_scope_sets_that_limit():
    got = quota.effective({"key": None, "project": None, "team": Rule(rpm=30), "org": None}, DEFAULTS)
    assert got["project"].budget == 5_000_000 and got["project"].period == "day"
    assert got["project"].rpm == 0 and got["team"].rpm == 30
    got = quota.effective({"key": Rule(budget=1_000_000, period="week"), "project": None}, DEFAULTS)
    assert got["project"].budget == 0 and got["key"].budget == 1_000_000


def test_budget_slots_and_resets_follow_the_period():
    assert quota.budget_slot("day", NOW) == "2026-11-29"
    assert quota.budget_slot("week", NOW) == "2026-W48"
    assert quota.budget_slot("month", NOW) == "2026-11"
    assert quota.seconds_to_reset("month", NOW) == int((datetime.datetime(2026, 12, 1) - NOW).total_seconds())
    assert quota.bucket_slot(NOW) == str(int(quota.epoch(NOW)) // 5 * 5)
    assert quota.window_slots(NOW) == (str(int(quota.bucket_slot(NOW)) - 60), quota.bucket_slot(NOW))


def test_the_worst_case_is_the_prompt_bound_plus_max_tokens():
    prompt, completion = quota.worst_case({"messages": [{"role": "user", "content": "x" * 30}],
                                           "max_tokens": 7}, 512)
    assert completion == 7 and prompt >= 30
    assert quota.worst_case({"prompt": "hi"}, 512)[1] == 512
    assert quota.worst_case({"input": "embed me"}, 512)[1] == 0


@pytest.mark.parametrize("text", ["你好世界，今天天气很好。" * 20, "🙂🚀🎉" * 50, "x = [i**2 for i in r]\n" * 30,
                                  "plain English words, a sentence or two. " * 10])
def test_the_prompt_bound_holds_for_any_script_even_at_a_token_per_byte(text):
    body = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]}
    bound = quota.prompt_bound(body)
    # The worst any tokenizer does: one token per byte of the text, plus the template's own.
    assert bound >= len(("be brief" + text).encode("utf-8")) + 2 * quota.TEMPLATE_PER_MESSAGE
    # What is billed when the engine gave no count is a likely figure, never above the bound.
    assert 0 < quota.estimate_prompt_tokens(body) <= bound


def test_every_part_of_a_prompt_counts_tools_parts_token_arrays_and_lists():
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"q": "x" * 400}}}]
    without = quota.prompt_bound({"messages": [{"role": "user", "content": "hi"}]})
    assert quota.prompt_bound({"messages": [{"role": "user", "content": "hi"}], "tools": tools}) > without + 400
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "y" * 300}]}]}
    assert quota.prompt_bound(parts) > 300
    assert quota.prompt_bound({"input": ["aa", "bbb", "猫"]}) >= 2 + 3 + 3
    assert quota.prompt_bound({"input": [1, 2, 3, 4]}) >= 4
    assert quota.prompt_bound({"input": [[1, 2], [3, 4, 5]]}) >= 5
    assert quota.prompt_bound({"prompt": ["one", "two"]}) >= 6


def test_n_and_best_of_multiply_the_completion_and_a_missing_cap_takes_the_default():
    assert quota.worst_case({"prompt": "p", "max_tokens": 10, "n": 4}, 512)[1] == 40
    assert quota.worst_case({"prompt": "p", "max_tokens": 10, "n": 2, "best_of": 5}, 512)[1] == 50
    assert quota.worst_case({"prompt": "p", "max_completion_tokens": 9, "max_tokens": 99}, 512)[1] == 9
    assert quota.worst_case({"messages": [], "n": 3}, 100)[1] == 300
    assert quota.worst_case({"messages": [], "max_tokens": 0}, 100)[1] == 100


@pytest.fixture
def served(local_sim):
    made = local_sim("0")
    node = made["node"]
    reconcile(made["conf"], lambda: bool(node.replicas.count()) and all(r.state == "ready" for r in node.replicas))
    return made


def chat(client, headers, **kw):
    body = {"model": "demo", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], **kw}
    return client.post("/v1/chat/completions", headers=headers, json=body, buffered=True)


def test_usage_is_read_from_a_stream_and_stripped_when_not_asked_for(served, client):
    plain = chat(client, served["headers"], stream=True).get_data(as_text=True)
    assert '"usage"' not in plain and plain.rstrip().endswith("data: [DONE]")
    asked = chat(client, served["headers"], stream=True,
                 stream_options={"include_usage": True}).get_data(as_text=True)
    events = [json.loads(e[6:]) for e in asked.split("\n\n") if e.startswith("data: {")]
    assert events[-1]["usage"]["completion_tokens"] == 5 and events[-1]["choices"] == []
    settle_now(client.application)
    rows = list(Usage.select().order_by(Usage.id))
    assert [(u.completion_tokens, u.status) for u in rows] == [(5, 200), (5, 200)]


def test_a_budget_refuses_with_429_naming_the_scope(served, client):
    Price.create(model="demo", prompt_per_1k=0, completion_per_1k=1000 * 10**6)  # 1 per token
    project = Project.get(Project.name == "default")
    LimitRule.create(scope_kind="project", scope_id=project.id, budget=12 * 10**6, period="day")
    assert chat(client, served["headers"]).status_code == 200   # holds 5, then costs 5
    assert chat(client, served["headers"]).status_code == 200   # 10 spent
    refused = chat(client, served["headers"])
    assert refused.status_code == 429
    err = refused.get_json()["error"]
    assert err["code"] == err["type"] == "insufficient_quota" and "project 'default'" in err["message"]
    assert "10.000000 of 12.000000" in err["message"]
    assert int(refused.headers["Retry-After"]) > 0
    settle_now(client.application)
    spent = Counter.get(Counter.kind == "budget", Counter.scope_kind == "project",
                        Counter.slot == quota.budget_slot("day", utcnow()))
    assert (spent.used, spent.reserved) == (10 * 10**6, 0)


def test_rpm_counts_requests_in_the_minute(served, client):
    project = Project.get(Project.name == "default")
    LimitRule.create(scope_kind="project", scope_id=project.id, rpm=2)
    codes = [chat(client, served["headers"]).status_code for _ in range(3)]
    if codes != [200, 200, 429]:  # the minute turned between two requests
        codes = [chat(client, served["headers"]).status_code for _ in range(3)]
    assert codes[-1] == 429


def test_a_key_s_model_allow_list_is_enforced(served, client):
    _, key = tenancy.create_key("default", models=["other"])
    resp = chat(client, {"Authorization": f"Bearer {key}"})
    assert resp.status_code == 403 and resp.get_json()["error"]["code"] == "model_not_allowed"
    listed = client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).get_json()
    assert listed["data"] == []


def test_the_quotas_page_says_budgets_cannot_bind_without_prices(client, auth):
    auth.login(password=auth.password)
    page = client.get("/quotas").get_data(as_text=True)
    assert "budgets cannot bind until a price is set" in page
    Price.create(model="demo", prompt_per_1k=100_000, completion_per_1k=200_000)
    assert "budgets cannot bind" not in client.get("/quotas").get_data(as_text=True)


def test_a_project_s_usage_page_shows_its_requests(served, client, auth):
    chat(client, served["headers"], max_tokens=4)
    settle_now(client.application)
    auth.login(password=auth.password)
    page = client.get("/usage/default").get_data(as_text=True)
    assert "<td>demo</td><td>1</td>" in page
    assert client.get("/usage/nope").status_code == 404


def test_a_model_without_a_replica_is_served_by_its_fallback_and_says_so(served, client):
    Model.create(name="big", engine="llamacpp", source="/nowhere.gguf", sha256="0" * 64, replicas=0,
                 fallbacks=["demo"])
    resp = client.post("/v1/chat/completions", headers=served["headers"], buffered=True, json={
        "model": "big", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 200 and resp.headers["X-Llmgw-Model"] == "demo"
    settle_now(client.application)
    row = Usage.get(Usage.request_id == resp.headers["X-Request-Id"])  # the client's id finds it
    assert row.model == "demo"
    _, only_big = tenancy.create_key("default", models=["big"])
    refused = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {only_big}"},
                          json={"model": "big", "messages": [{"role": "user", "content": "hi"}]})
    assert refused.status_code == 503  # the fallback is not a model this key may use


def test_a_request_without_max_tokens_is_sent_the_cap_it_was_reserved_for(local_sim, client):
    """The engine, left to itself, would generate 2,000 tokens: it is told the default cap."""
    made = local_sim("0")
    Model.update(args=["--token-delay", "0", "--default-tokens", "2000"]).execute()
    client.application.config["LLMGW"]["limits"]["default_max_tokens"] = 24
    node = made["node"]
    reconcile(made["conf"], lambda: bool(node.replicas.count()) and all(r.state == "ready" for r in node.replicas))
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
    got = client.post("/v1/chat/completions", headers=made["headers"], json=body).get_json()
    assert got["usage"]["completion_tokens"] == 24
    many = client.post("/v1/chat/completions", headers=made["headers"], json=dict(body, n=3)).get_json()
    assert len(many["choices"]) == 3 and many["usage"]["completion_tokens"] == 72
    streamed = client.post("/v1/chat/completions", headers=made["headers"], buffered=True,
                           json=dict(body, stream=True, n=2)).get_data(as_text=True)
    contents = [e for e in streamed.split("\n\n") if '"content": "' in e and '"content": ""' not in e]
    assert len(contents) == 48 and streamed.rstrip().endswith("data: [DONE]")
    settle_now(client.application)
    assert [u.completion_tokens for u in Usage.select().order_by(Usage.id)] == [24, 72, 48]
