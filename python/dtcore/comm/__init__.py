"""Collectives on the job's communicator (csrc/dtcore/comm), and the agreement helpers built on them."""

from .collectives import all_reduce, barrier, broadcast, is_main_process, main_process_first

__all__ = ["barrier", "all_reduce", "broadcast", "is_main_process", "main_process_first"]
