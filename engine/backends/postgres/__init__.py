"""The PostgreSQL backend: many workers on many machines share one database.

Only its schema (`schema.py`) and statements (`sql.py`) are here so far; the backend itself
plugs into the seam of `engine/backends/` once that exists.
"""
