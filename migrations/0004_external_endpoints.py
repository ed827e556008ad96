"""OpenAI-compatible servers llmgw routes to but does not run (the seed's static endpoints)."""


def up(db, sql):
    db.execute_sql(sql("""CREATE TABLE endpoint (id {pk}, name TEXT NOT NULL UNIQUE, url TEXT NOT NULL,
        models TEXT NOT NULL, api_key TEXT NOT NULL, state TEXT NOT NULL, detail TEXT NOT NULL,
        updated {ts} NOT NULL)"""))


def down(db, sql):
    db.execute_sql("DROP TABLE endpoint")
