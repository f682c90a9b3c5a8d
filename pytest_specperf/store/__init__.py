"""Files: baseline YAML (lock, atomic write), the case-JSON report, history runs."""
