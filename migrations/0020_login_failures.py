"""Failed logins counted per account and per address, shared by every worker and control plane.

A subject ("account:EMAIL" or "address:IP") that fails too often within accounts.login_lockout
seconds is refused logins until blocked_until.
"""


def up(db, sql):
    db.execute_sql(sql("""CREATE TABLE login_failure (subject TEXT PRIMARY KEY,
        failures INTEGER NOT NULL DEFAULT 0, first_at {ts} NOT NULL, blocked_until {ts})"""))


def down(db, sql):
    db.execute_sql("DROP TABLE login_failure")
