"""The run record on disk: write, read any version, settle (`store`, the one loader of its files), and `migrate` (the only writer of old records, keeping the original)."""
