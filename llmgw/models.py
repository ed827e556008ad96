"""The peewee models. The schema itself is created and changed only by migrations/."""
import datetime
import json
import secrets

import peewee as pw

from .db import database


def utcnow():
    """Return the current UTC time without tzinfo, as stored in the database."""
    return datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)


class JSONField(pw.TextField):
    """A text column holding JSON."""

    def db_value(self, value):
        return None if value is None else json.dumps(value, sort_keys=True)

    def python_value(self, value):
        return None if value is None else json.loads(value)


class Base(pw.Model):
    class Meta:
        database = database
        legacy_table_names = False


class Org(Base):
    name = pw.TextField(unique=True)
    created = pw.DateTimeField(default=utcnow)


class Team(Base):
    org = pw.ForeignKeyField(Org, backref="teams")
    name = pw.TextField()
    created = pw.DateTimeField(default=utcnow)


class Project(Base):
    team = pw.ForeignKeyField(Team, backref="projects")
    name = pw.TextField(unique=True)
    created = pw.DateTimeField(default=utcnow)


def new_session_token():
    return secrets.token_urlsafe(16)


class User(Base):
    email = pw.TextField(unique=True)
    password_hash = pw.TextField()
    is_admin = pw.BooleanField(default=False)
    is_active = pw.BooleanField(default=True)
    created = pw.DateTimeField(default=utcnow)
    # Part of every login session's id: replaced at logout and password change, which ends
    # every session made before (sessions live only in the signed cookie).
    session_token = pw.TextField(default=new_session_token)


class Membership(Base):
    user = pw.ForeignKeyField(User, backref="memberships")
    project = pw.ForeignKeyField(Project, backref="members")


class ApiKey(Base):
    project = pw.ForeignKeyField(Project, backref="keys")
    user = pw.ForeignKeyField(User, null=True)
    name = pw.TextField(default="")
    prefix = pw.TextField()
    key_hash = pw.TextField(unique=True)
    created = pw.DateTimeField(default=utcnow)
    expires = pw.DateTimeField(null=True)
    revoked = pw.DateTimeField(null=True)
    models = JSONField(null=True)  # allow-list; None: every model


class LimitRule(Base):
    """Limits set on one scope (key, project, team or org); None means 'not set here'."""

    scope_kind = pw.TextField()
    scope_id = pw.IntegerField()
    rpm = pw.IntegerField(null=True)
    tpm = pw.IntegerField(null=True)
    budget = pw.BigIntegerField(null=True)  # micro-units of the currency
    period = pw.TextField(default="month")


class Price(Base):
    model = pw.TextField(unique=True)
    prompt_per_1k = pw.BigIntegerField()  # micro-units per 1,000 tokens
    completion_per_1k = pw.BigIntegerField()


class Counter(Base):
    """What one scope used (and holds reserved) in one slot of one kind: requests (rpm) and
    tokens (tpm) per 5-second bucket, money (budget, micro-units) per day, week, month and
    for ever, requests refused (refused_<type>) per day. A "window" slot of rpm/tpm is the row
    locked while a window is checked."""

    scope_kind = pw.TextField()
    scope_id = pw.IntegerField()
    kind = pw.TextField()
    slot = pw.TextField()  # bucket start (epoch s), day, ISO week, month, "all" or "window"
    used = pw.BigIntegerField(default=0)
    reserved = pw.BigIntegerField(default=0)


class GatewayWorker(Base):
    """A gateway worker process that holds leases; it beats every few seconds."""

    id = pw.TextField(primary_key=True)
    host = pw.TextField()
    pid = pw.IntegerField()
    started = pw.DateTimeField(default=utcnow)
    beat = pw.DateTimeField(default=utcnow)
    inflight = JSONField(default=list)  # its requests in flight at the last beat


class LoginFailure(Base):
    """Failed logins of one account ("account:EMAIL") or address ("address:IP") in its window."""

    subject = pw.TextField(primary_key=True)
    failures = pw.IntegerField(default=0)
    first_at = pw.DateTimeField(default=utcnow)  # the window's first failure
    blocked_until = pw.DateTimeField(null=True)


class Lease(Base):
    """What one worker holds of one counter: granted to it and not yet settled or given back."""

    worker = pw.TextField()
    counter_id = pw.IntegerField()
    amount = pw.BigIntegerField(default=0)


class Usage(Base):
    created = pw.DateTimeField(default=utcnow)
    key_id = pw.IntegerField(null=True)
    project_id = pw.IntegerField()
    model = pw.TextField()
    prompt_tokens = pw.IntegerField()
    completion_tokens = pw.IntegerField()
    cost = pw.BigIntegerField()  # micro-units
    latency_ms = pw.IntegerField()
    status = pw.IntegerField()
    endpoint = pw.TextField()
    request_id = pw.TextField(null=True)  # also the response's X-Request-Id


class Node(Base):
    name = pw.TextField(unique=True)
    transport = pw.TextField(default="ssh")  # "ssh" or "local"
    addr = pw.TextField(default="")
    port = pw.IntegerField(default=22)
    ssh_user = pw.TextField(default="root")
    host_key = pw.TextField(default="")  # pinned public key, OpenSSH format
    host_key_fp = pw.TextField(default="")
    base_dir = pw.TextField(default="/opt/llmgw")
    facts = JSONField(default=dict)
    reachable = pw.BooleanField(default=False)
    last_seen = pw.DateTimeField(null=True)
    last_error = pw.TextField(default="")
    created = pw.DateTimeField(default=utcnow)
    addrs = JSONField(default=list)
    labels = JSONField(default=dict)
    fabric = pw.TextField(default="")
    fabric_hcas = JSONField(default=list)
    mgmt_interface = pw.TextField(default="")
    use_sudo = pw.BooleanField(default=False)
    discovered = pw.DateTimeField(null=True)
    # What the operator said: ready; cordoned (no new replicas); draining (its replicas start
    # elsewhere, then leave); drained (a drain is done). Lost is separate: see lost_since.
    state = pw.TextField(default="ready")
    drain_timeout = pw.IntegerField(default=0)  # seconds a draining replica's requests are given
    # Set when neither SSH nor any of its engines answered for reconciler.node_lost_after: its
    # replicas are placed elsewhere, and it takes no new ones until its stale engines are stopped.
    lost_since = pw.DateTimeField(null=True)
    weights_seen = JSONField(default=dict)  # entry of <base>/models -> epoch s a replica last used it

    @property
    def shown_state(self):
        return "lost" if self.lost_since else self.state


class NodeEvent(Base):
    """A line in a node's own log: what discovery found changed, what was done to it."""

    node = pw.ForeignKeyField(Node, backref="events", on_delete="CASCADE")
    created = pw.DateTimeField(default=utcnow)
    text = pw.TextField()


class NodeCommand(Base):
    """A command the control plane ran on a node: exit status None when it did not finish."""

    node = pw.ForeignKeyField(Node, backref="commands", on_delete="CASCADE")
    created = pw.DateTimeField(default=utcnow)
    command = pw.TextField()
    exit_status = pw.IntegerField(null=True)
    seconds = pw.FloatField(default=0)
    error = pw.TextField(default="")


class EngineInstall(Base):
    node = pw.ForeignKeyField(Node, backref="installs", on_delete="CASCADE")
    engine = pw.TextField()
    version = pw.TextField()
    variant = pw.TextField(default="")
    state = pw.TextField(default="pending")  # pending installing ready failed unsupported
    detail = pw.TextField(default="")
    binary = pw.TextField(default="")
    updated = pw.DateTimeField(default=utcnow)
    next_check = pw.DateTimeField(default=utcnow)
    failures = pw.IntegerField(default=0)


class Model(Base):
    name = pw.TextField(unique=True)
    engine = pw.TextField(default="llamacpp")
    source = pw.TextField()  # a path on the control plane or an http(s) URL
    sha256 = pw.TextField(default="")
    replicas = pw.IntegerField(default=1)
    args = JSONField(default=list)
    created = pw.DateTimeField(default=utcnow)
    fallbacks = JSONField(null=True)  # model names tried in order when this one has no replica
    # What one replica needs; 0 / empty means "no requirement".
    gpus = pw.IntegerField(default=0)  # whole cards per replica (with share_gpu: 1 card, shared)
    gpu_classes = JSONField(default=list)  # e.g. ["h100-80g", "a100-80g"]; empty: any class
    min_gpu_memory_mb = pw.IntegerField(default=0)  # per card
    memory_mb = pw.IntegerField(default=0)  # host RAM per replica; 0: the estimate's
    context = pw.IntegerField(default=0)  # the engine's context size; 0: the model's own
    requires = JSONField(default=dict)  # node labels {key: value}
    max_per_node = pw.IntegerField(default=0)  # 0: spread, several per node only when needed
    share_gpu = pw.BooleanField(default=False)
    on_nodes = pw.BooleanField(default=False)  # source is a path on the nodes, not copied there
    manifest = JSONField(null=True)  # a directory's [[path, bytes, sha256], …]; None: one file
    origin = pw.TextField(default="")  # "file": declared in server.toml, changed only there
    estimate = JSONField(null=True)  # the sizing of one replica, when its files could be read
    verdict = JSONField(null=True)  # the last placement: summary and one line per node


class Replica(Base):
    name = pw.TextField(unique=True)  # the unit is llmgw-<name>: the slot, then -gN past generation 0
    slot = pw.TextField(default="")  # its place in the model's count (qwen-0), which placement fills
    generation = pw.IntegerField(default=0)  # a new one each time the slot starts on another node
    model = pw.ForeignKeyField(Model, backref="replica_rows", on_delete="CASCADE")
    node = pw.ForeignKeyField(Node, backref="replicas", on_delete="CASCADE")
    port = pw.IntegerField()
    supervisor = pw.TextField(default="")  # "systemd" or "setsid"
    # pending fetching starting ready unhealthy failed moving restarting; leaving: draining
    # (serving until its replacement does), stopping, lost (its node was lost; stopped on return)
    state = pw.TextField(default="pending")
    detail = pw.TextField(default="")
    endpoint = pw.TextField(default="")
    updated = pw.DateTimeField(default=utcnow)
    failures = pw.IntegerField(default=0)
    load = pw.FloatField(null=True)  # running + queued requests, as the engine reports them
    spec = pw.TextField(default="")  # digest of what it was started with (model, args, binary)
    # Its claim: whole cards by UUID (with the indexes shown to people), or memory on one
    # shared card, and host RAM. Two replicas never hold the same whole card.
    gpu_uuids = JSONField(default=list)
    gpu_indexes = JSONField(default=list)
    gpu_memory_mb = pw.IntegerField(default=0)
    memory_mb = pw.IntegerField(default=0)
    # While its weights are copied: {done, total, sent, resumed_from, rate, eta} (bytes, B/s, s).
    progress = JSONField(null=True)
    # The API key its engine was last started with, sealed with secrets_box; the gateway and
    # the probes send it. "": started before engines had keys.
    engine_key = pw.TextField(default="")

    @property
    def unit(self):
        return f"llmgw-{self.name}"


class Endpoint(Base):
    """An OpenAI-compatible server llmgw routes to but does not run; url ends in /v1."""

    name = pw.TextField(unique=True)
    url = pw.TextField()
    models = JSONField(default=list)
    api_key = pw.TextField(default="")  # sealed with secrets_box
    state = pw.TextField(default="pending")
    detail = pw.TextField(default="")
    updated = pw.DateTimeField(default=utcnow)


class LogRequest(Base):
    """A log pane's question to the reconciler, and its answer."""

    node = pw.ForeignKeyField(Node, on_delete="CASCADE")
    source = pw.TextField()
    cursor = pw.TextField(default="")
    lines = pw.IntegerField(default=100)
    state = pw.TextField(default="pending")  # pending done failed
    result = JSONField(null=True)
    next_cursor = pw.TextField(default="")
    created = pw.DateTimeField(default=utcnow)


ALL = [Org, Team, Project, User, Membership, ApiKey, Node, NodeEvent, EngineInstall, Model, Replica,
       LogRequest]
