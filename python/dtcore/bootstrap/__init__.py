"""Bootstrap: from a launcher's environment to a validated, connected world (csrc/dtcore/bootstrap).

context.py holds the process's Context and its lifecycle, join.py is `dtcore.init()` (and the
checker's own way in), fingerprint.py says what every rank must agree on.
"""

from .context import Context, get_context, is_initialized, shutdown
from .join import init

__all__ = ["Context", "init", "get_context", "is_initialized", "shutdown"]
