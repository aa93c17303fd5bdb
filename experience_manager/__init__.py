"""experience_manager: distill trajectories into experiences, store them in Qdrant, retrieve and score them.

Run it with `python -m experience_manager --port PORT [--store PATH | --qdrant-url URL] [--conf FILE]`;
other packages talk to it only through `experience_manager.client.ExperienceClient`.
"""
