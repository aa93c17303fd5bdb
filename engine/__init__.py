"""The inference engine shared by llm_server and the trainer: model loading, the continuous-batching
generator with its slot KV cache and lean Llama forward, grammar masks and batched sampling.

Nothing here is imported at package level: `engine.models` resolves a model spec without torch, so the
launcher can use it and stay light.
"""
