"""The LLM-judge service: `python -m advantage.judge --port PORT [--conf FILE]` (settings section `judge`)."""
