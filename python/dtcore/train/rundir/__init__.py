"""Reading a run directory back, apart from the loop that writes it (Note [Run directory] in
dtcore/train/metrics.py): run (the files, read as a live or crashed run leaves them), monitor
(python -m dtcore.monitor) and plot (python -m dtcore.plot, and the plots a run writes at its end).
"""
