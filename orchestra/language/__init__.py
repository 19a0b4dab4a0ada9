"""The workflow language (SPEC §7): the template model, CEL expressions, JSON Schemas and
the save-time checks. Pure: no store, no HTTP; the engine and the services both use it."""
