"""Shared core: schemas, config, LLM client, service base, embeddings, logging."""
