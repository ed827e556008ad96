"""When a replica on a node last used each entry of its <base>/models, for collecting weights
nobody has used for weights.keep_unused."""


def up(db, sql):
    db.execute_sql("ALTER TABLE node ADD COLUMN weights_seen TEXT NOT NULL DEFAULT '{{}}'")


def down(db, sql):
    db.execute_sql("ALTER TABLE node DROP COLUMN weights_seen")
