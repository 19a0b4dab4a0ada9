"""Money (SPEC §12): exact USD amounts, model prices and call costs, provider limits.

Imports nothing of the engine or the services, so both may use it.
"""
