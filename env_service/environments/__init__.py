"""Built-in environments. Each lives in its own folder and is enabled by name from an allowlist."""
