"""`accelerate launch`: where its config file lives, and the warning for a launch that started one
process although it was asked for more (the rule: csrc/dtcore/bootstrap/accelerate.h)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from .. import _C

log = logging.getLogger("dtcore")


def default_config_path(env: Mapping[str, str]) -> str:
    """Where `accelerate config` writes and `accelerate launch` reads its file, as accelerate finds it."""
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return os.path.join(home, "accelerate", "default_config.yaml")


def warn_if_started_fewer(spec: Any) -> None:
    """Logs a WARNING when accelerate started this process alone although it was asked for more."""
    if spec.launcher != "accelerate" or spec.world_size != 1:
        return  # the rule would say nothing: spare the file read
    path = default_config_path(os.environ)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:  # no file (or none readable): the variables alone are judged
        path, text = "", ""
    message = _C.accelerate_started_fewer(spec, path, text)
    if message:
        log.warning("%s", message)
