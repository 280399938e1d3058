"""Bundled instance files (YAML), example plans (plans/*.json) and the exported JSON Schema."""
