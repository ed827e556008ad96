"""A session token per account, part of every login session's id.

Sessions live only in the signed cookie, so logging out left a copied cookie valid. The token
is replaced at logout and at a password change, which ends every session made with the old
one. Sessions made before this migration (whose id has no token) must log in again.
"""
import secrets


def up(db, sql):
    db.execute_sql("ALTER TABLE \"user\" ADD COLUMN session_token TEXT NOT NULL DEFAULT ''")
    for (user_id,) in db.execute_sql('SELECT id FROM "user"').fetchall():
        db.execute_sql(f'UPDATE "user" SET session_token = {db.param} WHERE id = {db.param}',
                       (secrets.token_urlsafe(16), user_id))


def down(db, sql):
    db.execute_sql('ALTER TABLE "user" DROP COLUMN session_token')
