"""What dtcore's launcher and the programs it runs tell each other and the schedulers: exit statuses, which
schedulers and requeue scripts read, and the launcher's record of the failures it restarted after."""

EXIT_PREEMPTED = 75  # a checkpoint was saved after SIGTERM/SIGUSR1: requeue and resume (EX_TEMPFAIL)

# dtcore.launch's record of each failure (one JSON object per line), in torch's agent's log directory of the
# run, above attempt_<k>/: written by launch/restarts.py, read by the restarted ranks (train/restarts.py).
FAILURES = "failures.jsonl"
