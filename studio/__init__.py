"""evolver studio: the web view of runs (curves, tasks, trajectories with tokens, labels and advantages,
experiences), read from run folders and, while a run is live, from its services."""
