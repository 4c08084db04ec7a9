"""Shared test kits live beside this file (`rawpost`: raw, hand-signed envelopes); having a
conftest here puts this folder on `sys.path` so every test folder can import them."""

# A real PostgreSQL server, started once per session by the tests that ask for it.
from pgserver import pg_url, postgres_server  # noqa: F401
