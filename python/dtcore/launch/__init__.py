"""python -m dtcore.launch, python -m dtcore.monitor, python -m dtcore.plot: starting a job on one node or
many (on torch's elastic agent), watching its metrics, and plotting them. docs/launch.md."""
