"""The launcher behind `python launcher.py`: one validated run config, supervised children, teardown.

    settings.py    the run config (every service section + the launcher's own), --with-* flags
    plan.py        ports, URLs, thread budgets and commands: what would start, in which order
    supervisor.py  the children: own process groups, log files, /healthz, restarts, teardown
    manifest.py    what a run was made of (config, versions, seeds, commit, models, prompt hash)
    doctor.py      `python launcher.py doctor`: what is missing and how to fix it
"""
