"""Exit statuses that dtcore's programs give, and that schedulers and requeue scripts read."""

EXIT_PREEMPTED = 75  # a checkpoint was saved after SIGTERM/SIGUSR1: requeue and resume (EX_TEMPFAIL)
