"""TEST DOUBLE of `sglang.srt` (see `sglang/__init__.py`): only `server_args` exists here."""
