"""The store: peewee models, migrations, and opening a database from its URL."""
