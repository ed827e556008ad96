"""Removing a model from the catalog: gracefully while a reconciler runs, at once otherwise."""
import asyncio
import time

from .. import leader
from ..errors import LlmgwError
from ..models import Model, Node, Replica, database
from .catalog import get, refuse_if_declared


def fallback_users(name):
    """Return the models that name this one as a fallback."""
    return [m for m in Model.select() if name in (m.fallbacks or [])]


async def remove(conf, name, force=False, said=lambda text: None, now=False):
    """Forget a model and stop its replicas; return (units stopped, sentences of what was not).

    While a reconciler leads (and unless now), the model is first scaled to 0: its replicas
    leave routing and are stopped by the reconciler once their requests are done (within
    reconciler.stop_grace), as when a model is scaled down. Then the rows go, so the reconciler
    cannot start again what is being stopped, and any engine still running is stopped here; one
    that cannot be stopped now has no row any more and is stopped when its node answers again.
    """
    from ..plans import launch
    from .nodes import transport_for
    model, users = _removable(conf, name, force)
    drained = 0
    if not now and model.replica_rows.count() and leader.someone_leads(conf):
        drained = await _drain_model(conf, model, said)
    units = [(r.unit, r.node, r.supervisor or launch.supervisor_for(r.node.facts or {}))
             for r in model.replica_rows]
    _forget(model, users)
    stopped, left = [], []
    for unit, node, sup in units:
        t = transport_for(node, conf)
        try:
            await t.check(launch.stop_argv(sup, unit, node.base_dir), what=f"stopping {unit}")
            stopped.append(f"{unit} on {node.name}")
        except LlmgwError as e:
            left.append(f"{unit} on {node.name} could not be stopped now ({e}); the reconciler "
                        f"stops it when the node answers again")
        finally:
            await t.close()
    if drained:
        stopped.insert(0, f"{drained} replica(s) once their requests were done")
    return stopped, left


def _removable(conf, name, force):
    model = get(name)
    refuse_if_declared(model, conf)
    users = fallback_users(name)
    if users and not force:
        raise LlmgwError(f"{', '.join(m.name for m in users)} name(s) {name!r} as a fallback; change "
                         f"them first (model set M --fallback …), or remove it anyway with --force, "
                         f"which takes it off their fallback lists.")
    return model, users


def _forget(model, users):
    with database.atomic():
        for user in users:
            Model.update(fallbacks=[f for f in user.fallbacks if f != model.name] or None) \
                .where(Model.id == user.id).execute()
        model.delete_instance(recursive=True)


def remove_by_reconciler(conf, name, force=False, sleep=time.sleep):
    """The pages' removal, which runs no command on a node itself: the model is scaled to 0,
    the leading reconciler stops its replicas once their requests are done, then the model is
    forgotten. Refused when no reconciler runs (`llmgw model remove --now` stops them from the
    command line). Return how many replicas were stopped."""
    model, users = _removable(conf, name, force)
    before = model.replica_rows.count()
    if before and not leader.someone_leads(conf):
        raise LlmgwError(f"no reconciler is running to stop {name}'s {before} replica(s); start "
                         f"`llmgw serve`, or remove it with `llmgw model remove {name} --now`.")
    if before:
        Model.update(replicas=0).where(Model.id == model.id).execute()
        deadline = time.monotonic() + _patience(conf)
        while model.replica_rows.count():
            if time.monotonic() > deadline:
                raise LlmgwError(f"{name}'s replicas are still stopping; it stays with 0 replicas. "
                                 f"Remove it again once they are gone (`llmgw replicas --model {name}`).")
            sleep(0.5)
    _forget(model, users)
    return before


def _patience(conf):
    r, g = conf["reconciler"], conf["gateway"]
    return max([r["stop_grace"]] + [n.drain_timeout for n in Node.select(Node.drain_timeout)]) \
        + g["route_cache_seconds"] + 3 * r["interval"] + 30


async def _drain_model(conf, model, said):
    """Scale a model being removed to 0 and wait while the reconciler stops its replicas."""
    r = conf["reconciler"]
    before = Replica.select().where(Replica.model == model).count()
    Model.update(replicas=0).where(Model.id == model.id).execute()
    patience = _patience(conf)
    deadline = time.monotonic() + patience
    told = None
    try:
        while time.monotonic() < deadline:
            left = Replica.select().where(Replica.model == model).count()
            if not left:
                return before
            if left != told:
                said(f"{model.name}: {left} replica(s) out of routing, finishing their requests "
                     f"(up to reconciler.stop_grace, {r['stop_grace']} s, or a drain's timeout)")
                told = left
            await asyncio.sleep(0.5)
    except BaseException:
        # Interrupted (Ctrl-C): the model stays, with the replicas it had.
        Model.update(replicas=model.replicas).where(Model.id == model.id).execute()
        raise
    said(f"{model.name}: the reconciler did not stop every replica within {patience} s; the rest "
         f"are stopped now")
    return before - Replica.select().where(Replica.model == model).count()
