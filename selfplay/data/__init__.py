"""The task corpus (SQLite, with provenance) and its export and import as datasets."""
