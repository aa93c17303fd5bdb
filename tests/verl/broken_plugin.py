"""A veRL plugin that fails on import, as a broken third-party plugin would."""

raise RuntimeError("this plugin is broken on purpose")
