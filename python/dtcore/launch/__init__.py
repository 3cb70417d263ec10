"""python -m dtcore.launch: starting a job on one node or many (on torch's elastic agent), with a log per
node and the root cause of a failure. docs/launch.md."""
