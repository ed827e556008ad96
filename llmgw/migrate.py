"""Apply the numbered migrations in migrations/ that the database has not seen yet."""
import importlib.util
import re
from pathlib import Path

import peewee

from .models import utcnow

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
NAME = re.compile(r"^(\d{4})_(\w+)\.py$")

DIALECT = {
    "sqlite": {"pk": "INTEGER PRIMARY KEY AUTOINCREMENT", "ts": "DATETIME"},
    "postgres": {"pk": "SERIAL PRIMARY KEY", "ts": "TIMESTAMP"},
}


def available(directory=MIGRATIONS_DIR):
    """Return [(version, name, path)] of the migration files, in order."""
    found = []
    for path in sorted(directory.glob("*.py")):
        m = NAME.match(path.name)
        if m:
            found.append((int(m.group(1)), m.group(2), path))
    return found


def _load(path):
    spec = importlib.util.spec_from_file_location(f"llmgw_migration_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dialect(db):
    return "postgres" if isinstance(db, peewee.PostgresqlDatabase) else "sqlite"


def applied(db):
    """Return the set of versions already applied."""
    db.execute_sql("CREATE TABLE IF NOT EXISTS schema_migrations "
                   "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied TEXT NOT NULL)")
    return {row[0] for row in db.execute_sql("SELECT version FROM schema_migrations")}


def upgrade(db, directory=MIGRATIONS_DIR):
    """Apply every pending migration, each in its own transaction; return the names applied.

    On PostgreSQL several control planes may start at once: an advisory lock lets one migrate
    while the others wait, then find nothing left to do.
    """
    if _dialect(db) != "postgres":
        return _upgrade(db, directory)
    from .leader import MIGRATION_KEY
    db.execute_sql("SELECT pg_advisory_lock(%s)", (MIGRATION_KEY,))
    try:
        return _upgrade(db, directory)
    finally:
        db.execute_sql("SELECT pg_advisory_unlock(%s)", (MIGRATION_KEY,))


def _upgrade(db, directory):
    words = DIALECT[_dialect(db)]

    def sql(text):
        return text.format(**words)

    done = applied(db)
    ran = []
    for version, name, path in available(directory):
        if version in done:
            continue
        with db.atomic():
            _load(path).up(db, sql)
            db.execute_sql("INSERT INTO schema_migrations (version, name, applied) VALUES "
                           f"({version}, '{name}', '{utcnow().isoformat()}')")
        ran.append(f"{version:04d}_{name}")
    return ran


def downgrade(db, to_version, directory=MIGRATIONS_DIR):
    """Undo applied migrations newer than to_version, newest first."""
    words = DIALECT[_dialect(db)]
    done = applied(db)
    for version, name, path in reversed(available(directory)):
        if version in done and version > to_version:
            with db.atomic():
                _load(path).down(db, lambda text: text.format(**words))
                db.execute_sql(f"DELETE FROM schema_migrations WHERE version = {version}")
