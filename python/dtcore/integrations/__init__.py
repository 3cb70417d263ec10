"""Thin adapters that put dtcore behind other libraries' training loops, on dtcore's public names only.

    from dtcore.integrations.accelerate import Accelerator, DtcorePlugin   # accelerate's prepare()

Each adapter is imported by its own module path, so that dtcore itself never imports the library
it adapts.
"""
