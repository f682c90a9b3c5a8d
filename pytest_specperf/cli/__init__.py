"""The ``specperf`` command-line tools, every command in one place."""
