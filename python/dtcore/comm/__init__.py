"""Collectives on the job's communicator (csrc/dtcore/comm), and the agreement helpers built on them."""

from .collectives import (
    all_gather,
    all_reduce,
    barrier,
    broadcast,
    gather_object,
    is_local_main_process,
    is_main_process,
    local_main_process_first,
    main_process_first,
    reduce_scatter,
)

__all__ = [
    "barrier",
    "all_reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "gather_object",
    "is_main_process",
    "main_process_first",
    "is_local_main_process",
    "local_main_process_first",
]
