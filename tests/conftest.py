import os

# Tests never reach a hub, and keep the two cores for the processes under test.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# OpenMP busy-waiting makes torch threads of different processes starve each other on 2 cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.pop("EVOLVER_API_TOKEN", None)
