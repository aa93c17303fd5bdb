"""The LLM-judge service: `python -m judge --port PORT [--conf FILE]` (settings section `judge`)."""
