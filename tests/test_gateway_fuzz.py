"""Whatever arrives at /v1/*, the answer is a 4xx in OpenAI's shape, never a 500."""
import json
import random

import pytest

from llmgw.models import Model
from llmgw.services import tenancy

PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/v1/nope"]
VALUES = [None, True, 0, -1, 1.5, "", "x" * 300, [], [1, "a"], {}, {"role": 5}, "\u202e\x00",
          [{"role": "user", "content": "hi"}], {"include_usage": "yes"}]
FIELDS = ["model", "messages", "prompt", "input", "max_tokens", "stream", "stream_options",
          "temperature", "n", "max_token", "tools", "top_k", "__proto__"]


def bodies(rng, count):
    for _ in range(count):
        kind = rng.random()
        if kind < 0.15:
            yield rng.choice([b"", b"{", b"[]", b"null", b"\xff\xfe\x00", b'{"model": "demo",}',
                              b"x" * 1000, b'{"a": ' * 200])
        else:
            body = {f: rng.choice(VALUES) for f in rng.sample(FIELDS, rng.randint(0, 6))}
            if rng.random() < 0.5:
                body["model"] = "demo"
            yield json.dumps(body).encode()


@pytest.fixture
def key(app):
    Model.create(name="demo", engine="sim", source="", sha256="", replicas=1)
    return tenancy.create_key("default")[1]


def test_malformed_bodies_and_headers_only_ever_get_4xx(client, key):
    rng = random.Random(20261129)
    headers_choices = [{"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
                       {"Authorization": f"Bearer {key}", "Content-Type": "text/plain"},
                       {"Authorization": f"Bearer {key}"}, {"Authorization": "Bearer"},
                       {"Authorization": "bearer " + key}, {"Authorization": "Basic " + key},
                       {"Authorization": f"Bearer {key}\u00e9"}, {}]
    seen = set()
    for body in bodies(rng, 400):
        path = rng.choice(PATHS)
        headers = rng.choice(headers_choices)
        method = rng.choice(["post", "post", "post", "get", "put"])
        resp = getattr(client, method)(path, data=body, headers=headers)
        seen.add(resp.status_code)
        if resp.status_code == 200:  # only a listing with a good key, whatever body came along
            assert (method, path) == ("get", "/v1/models") and headers.get("Authorization", "").endswith(key)
            continue
        assert 400 <= resp.status_code < 500, (method, path, body[:80], resp.data[:200])
        assert resp.is_json and "error" in resp.get_json()
    assert {400, 401, 404, 405} <= seen


def test_an_oversized_body_is_413_in_openai_shape(client, key):
    resp = client.post("/v1/chat/completions", data=b"{" + b" " * (17 * 1024 * 1024) + b"}",
                       headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    assert resp.status_code == 413 and resp.get_json()["error"]["type"] == "invalid_request_error"


def test_an_unknown_field_is_named(client, key):
    resp = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                       json={"model": "demo", "messages": [], "max_token": 5})
    assert resp.status_code == 400
    assert resp.get_json()["error"]["message"] == "Unrecognized request argument supplied: max_token."
