"""API keys belong to a workspace (SPEC §16): every key stored without one — those made
between migration 0021 and the release that scoped keys to their workspace — is put in
its user's personal workspace, where every user is owner: such a key reaches what it
reached before in that workspace. Nothing else changes.
"""


def up(migrator, db):
    db.execute_sql(
        "UPDATE api_key SET workspace_id = (SELECT w.id FROM workspace w "
        "WHERE w.personal_user_id = api_key.user_id) WHERE workspace_id IS NULL")


def down(migrator, db):
    pass  # which keys had no workspace is not kept: each stays in its user's personal one
