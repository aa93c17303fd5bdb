"""Shared core: wire schemas, config, LLM client, HTTP client and service base, embeddings, logging."""
