"""Shared test kits live beside this file (`rawpost`: raw, hand-signed envelopes); having a
conftest here puts this folder on `sys.path` so every test folder can import them."""
