"""One placement pass's view of the fleet: each node's cards, memory and what is claimed on them.

Pure and in memory: built from node facts and the claims recorded on replica rows, changed only
by the planner as it claims, and asked why a node cannot take a model. Every refusal is a
sentence with the node and the numbers, because it is what an operator reads at two in the
morning to decide whether to buy a card, free one or fix a label.
"""
from dataclasses import dataclass, field

MIB = 1024 * 1024
COMING = ("pending", "installing")


def gib(mb):
    """Return MiB as a short GiB figure for a sentence: 12.1, 40, 0.5."""
    value = mb / 1024
    return f"{value:.0f}" if value >= 100 or value == int(value) else f"{value:.1f}"


@dataclass(frozen=True)
class Need:
    """What one replica of a model needs; 0 or empty means no requirement."""

    model: str
    engine: str
    replicas: int = 1
    gpus: int = 0  # whole cards; with share_mb > 0, one card shared by memory
    classes: tuple = ()
    min_card_mb: int = 0
    share_mb: int = 0
    memory_mb: int = 0
    requires: tuple = ()  # ((key, value), ...)
    max_per_node: int = 0

    @property
    def shares(self):
        return self.share_mb > 0

    def class_words(self):
        return " or ".join(self.classes) if self.classes else "GPU"


@dataclass
class Card:
    uuid: str
    index: int
    cls: str
    memory_mb: int
    healthy: bool
    reason: str
    bus_id: str = ""
    owner: str = ""  # the replica holding it whole
    shared: dict = field(default_factory=dict)  # replica -> MiB, when shared

    def label(self):
        if self.index is None:
            return f"the GPU at {self.bus_id or 'an unknown bus address'}"
        return f"GPU {self.index} ({self.uuid or 'no UUID'})"

    def free_whole(self):
        return self.healthy and not self.owner and not self.shared

    def unclaimed_mb(self):
        return self.memory_mb - sum(self.shared.values())


class NodeState:
    """One node during a pass."""

    def __init__(self, facts):
        self.name = facts["name"]
        self.reachable = bool(facts.get("reachable"))
        self.admin_state = facts.get("state", "ready")
        self.cordoned = self.admin_state in ("cordoned", "draining", "drained")
        self.draining = self.admin_state == "draining"
        self.lost = bool(facts.get("lost"))
        self.installs = facts.get("installs", {})
        self.labels = facts.get("labels") or {}
        self.memory_mb = int(facts.get("memory_mb") or 0)
        self.claimed_mb = 0
        self.cards = [Card(g.get("uuid", ""), g.get("index"), g.get("class", ""),
                           int(g.get("memory_mib") or 0), bool(g.get("healthy")) and bool(g.get("uuid")),
                           g.get("reason", ""), g.get("bus_id", "")) for g in facts.get("gpus", [])]
        self.by_uuid = {c.uuid: c for c in self.cards if c.uuid}
        self.per_model = {}  # model -> replicas here
        self.replicas = 0
        # card_refusal() per (gpus, classes, min_card_mb, share_mb): it reads only the cards'
        # class, size and count, which a pass never changes, and it is asked per node per need.
        self.card_refusals = {}

    # --- the parts of a verdict that do not change during a pass ---------------------------
    def static_refusal(self, need):
        """Return why this node can never take the need this pass, or '' (coming: see engine)."""
        if self.lost:
            return ("lost: neither SSH nor its engines answer; it takes replicas again once it is "
                    "back and its stale engines are stopped")
        if self.cordoned:
            doing = {"cordoned": "cordoned", "draining": "being drained",
                     "drained": "drained"}[self.admin_state]
            return f"{doing}: it takes no new replicas (`flask llmgw uncordon {self.name}`)"
        if not self.reachable:
            return "unreachable"
        missing = [f"{k}={v}" for k, v in need.requires if self.labels.get(k) != v]
        if missing:
            return "lacks label " + ", ".join(missing)
        state, detail = self.engine_state(need.engine)
        if state != "ready":
            return f"{need.engine} {state or 'not installed'}" + (f": {detail}" if detail else "")
        if not need.gpus:
            return ""
        variant = self.engine_variant(need.engine)
        if not self.card_refusal(need) and need.engine == "llamacpp" and variant \
                and not variant.startswith("cuda"):
            # It would hold the cards and compute on the CPU.
            return (f"llamacpp there is the {variant} build, which cannot use GPUs (the CUDA build "
                    f"is installed on x64 nodes with an NVIDIA driver loaded)")
        return self.card_refusal(need)

    def engine_variant(self, engine):
        got = self.installs.get(engine) or ()
        return got[2] if len(got) > 2 else ""

    def engine_state(self, engine):
        got = self.installs.get(engine) or ("", "")
        return got[0], got[1]

    def coming(self, need):
        """Return whether the node would do but for its engine still being installed."""
        # The engine first: it rules out nearly every node, and it is the cheapest test.
        if self.engine_state(need.engine)[0] not in COMING or not self.reachable or self.cordoned \
                or self.lost:
            return False
        if any(self.labels.get(k) != v for k, v in need.requires):
            return False
        return not (need.gpus and self.card_refusal(need))

    def card_refusal(self, need):
        """Return why no set of this node's cards could ever hold the need, or ''."""
        key = (need.gpus, need.classes, need.min_card_mb, need.share_mb)
        got = self.card_refusals.get(key)
        if got is None:
            got = self.card_refusals[key] = self._card_refusal(need)
        return got

    def _card_refusal(self, need):
        if not self.cards:
            if need.shares:
                return f"no GPU; a share of {gib(need.share_mb)} GiB on one {need.class_words()} needed"
            return f"no GPU, {need.gpus} × {' or '.join(need.classes)} needed" if need.classes \
                else f"no GPU, {need.gpus} needed"
        fitting = self.fitting_cards(need, healthy_only=False)
        if not fitting:
            have = ", ".join(sorted({c.cls or "unknown" for c in self.cards}))
            if need.classes and not any(c.cls in need.classes for c in self.cards):
                return f"has {have}, needs {need.class_words()}"
            biggest = max(c.memory_mb for c in self.cards)
            wanted = max(need.min_card_mb, need.share_mb)
            return (f"no card with {gib(wanted)} GiB or more ({have}: at most {gib(biggest)} GiB)")
        count = 1 if need.shares else need.gpus
        if len(fitting) < count:
            return f"has {len(fitting)} {self.class_text(need)} in all, {count} needed"
        return ""

    def class_text(self, need):
        return need.class_words() if need.classes else "GPU" + ("s" if need.gpus != 1 else "")

    def fitting_cards(self, need, healthy_only=True):
        """Return the cards of an allowed class and size, in index order."""
        wanted = max(need.min_card_mb, need.share_mb)
        return [c for c in self.cards
                if (not need.classes or c.cls in need.classes) and c.memory_mb >= wanted
                and (c.healthy or not healthy_only)]

    # --- what is free now ---------------------------------------------------------------------
    def unclaimed_mb(self):
        return self.memory_mb - self.claimed_mb

    def check(self, need):
        """Return (cards, '') that one more replica could claim here now, or (None, refusal)."""
        if need.max_per_node and self.per_model.get(need.model, 0) >= need.max_per_node:
            return None, (f"already runs {self.per_model[need.model]} of this model "
                          f"(at most {need.max_per_node} per node)")
        if need.memory_mb and self.unclaimed_mb() < need.memory_mb:
            return None, (f"{gib(max(self.unclaimed_mb(), 0))} GiB RAM unclaimed, "
                          f"{gib(need.memory_mb)} GiB needed")
        return self._pick_cards(need)

    def why_not(self, need):
        """Return '' when one more replica fits here now, else the refusal sentence."""
        return self.static_refusal(need) or self.check(need)[1]

    def claim(self, need, replica, cards):
        """Take the cards and memory check() found for one replica; return its claim."""
        for c in cards:
            if need.shares:
                c.shared[replica] = need.share_mb
            else:
                c.owner = replica
        self._count(need.model, need.memory_mb)
        return {"node": self.name, "gpus": [c.uuid for c in cards], "indexes": [c.index for c in cards],
                "gpu_memory_mb": need.share_mb if cards else 0, "memory_mb": need.memory_mb}

    def _count(self, model, memory_mb):
        self.claimed_mb += memory_mb
        self.per_model[model] = self.per_model.get(model, 0) + 1
        self.replicas += 1

    def _pick_cards(self, need):
        if not need.gpus:
            return [], ""
        fitting = self.fitting_cards(need)
        if need.shares:
            room = [c for c in fitting if not c.owner and c.unclaimed_mb() >= need.share_mb]
            if not room:
                return None, self._share_refusal(need, fitting)
            # Best fit: the fullest card that still holds it keeps whole cards whole.
            return [min(room, key=lambda c: (c.unclaimed_mb(), c.index if c.index is not None else -1))], ""
        free = [c for c in fitting if c.free_whole()]
        if len(free) < need.gpus:
            return None, self._count_refusal(need, fitting, free)
        return free[:need.gpus], ""

    def _count_refusal(self, need, fitting, free):
        words = need.class_words() if need.classes else "GPUs"
        text = f"{len(free)} of {len(fitting)} healthy {words} free, {need.gpus} needed"
        sick = [c for c in self.cards if not c.healthy and (not need.classes or c.cls in need.classes
                                                              or not c.cls)]
        if sick:
            text += "; " + "; ".join(f"{c.label()} is unhealthy: {c.reason}" for c in sick)
        return text

    def _share_refusal(self, need, fitting):
        healthy = [c for c in fitting if not c.owner]
        if not healthy:
            return f"no unclaimed {need.class_words()} to share ({len(fitting)} healthy, all held whole)"
        best = max(healthy, key=lambda c: c.unclaimed_mb())
        return (f"no card has {gib(need.share_mb)} GiB unclaimed (most: {gib(best.unclaimed_mb())} "
                f"GiB on GPU {best.index})")

    # --- claims carried over from earlier passes -------------------------------------------
    def hold(self, claim):
        """Keep a leaving replica's cards and RAM taken, without counting it for its model."""
        for uuid in claim.get("gpus") or []:
            card = self.by_uuid.get(uuid)
            if card is None:
                continue
            if claim.get("gpu_memory_mb"):
                card.shared[claim["replica"]] = claim["gpu_memory_mb"]
            elif not card.owner:
                card.owner = claim["replica"]
        self.claimed_mb += claim.get("memory_mb") or 0
        self.replicas += 1

    def keep(self, need, claim):
        """Re-take a recorded claim; return (its cards, '') or (None, why it no longer holds)."""
        cards, why = self._kept_cards(need, claim)
        if why:
            return None, why
        for card in cards:
            if need.shares:
                card.shared[claim["replica"]] = need.share_mb
            else:
                card.owner = claim["replica"]
        self._count(need.model, need.memory_mb)
        return cards, ""

    def _kept_cards(self, need, claim):
        missing = [f"{k}={v}" for k, v in need.requires if self.labels.get(k) != v]
        if missing:
            return None, f"{self.name} no longer carries label " + ", ".join(missing)
        if need.max_per_node and self.per_model.get(need.model, 0) >= need.max_per_node:
            return None, f"the model now allows at most {need.max_per_node} per node"
        # RAM and a card's share were checked when claimed; only a grown need is checked again,
        # so a node whose reported memory wavers a little does not shed running replicas.
        grown = need.memory_mb > (claim.get("memory_mb") or 0)
        if grown and self.unclaimed_mb() < need.memory_mb:
            return None, (f"the model now needs {gib(need.memory_mb)} GiB RAM and {self.name} has "
                          f"{gib(max(self.unclaimed_mb(), 0))} GiB unclaimed")
        uuids = list(claim.get("gpus") or [])
        if len(uuids) != need.gpus:
            return None, f"the model now needs {need.gpus} card(s) per replica; it held {len(uuids)}"
        if need.shares != bool(claim.get("gpu_memory_mb")) and uuids:
            return None, "the model's GPU sharing changed"
        cards = []
        for uuid in uuids:
            card = self.by_uuid.get(uuid)
            if card is None:
                return None, f"{uuid} is no longer reported by nvidia-smi on {self.name}"
            if not card.healthy:
                return None, f"{card.label()} on {self.name} is unhealthy: {card.reason}"
            if need.classes and card.cls not in need.classes:
                return None, f"{card.label()} is {card.cls}; the model now needs {need.class_words()}"
            if card.memory_mb < max(need.min_card_mb, need.share_mb):
                return None, (f"{card.label()} has {gib(card.memory_mb)} GiB; the model now needs "
                              f"{gib(max(need.min_card_mb, need.share_mb))} GiB per card")
            if card.owner or (not need.shares and card.shared):
                return None, f"{card.label()} is already held by {card.owner or ', '.join(card.shared)}"
            if need.shares and need.share_mb != claim.get("gpu_memory_mb") \
                    and card.unclaimed_mb() < need.share_mb:
                return None, (f"{card.label()} has {gib(card.unclaimed_mb())} GiB unclaimed beside "
                              f"its other shares; the model now takes {gib(need.share_mb)} GiB")
            cards.append(card)
        return cards, ""
