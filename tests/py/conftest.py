import logging

import pytest

import dtcore


@pytest.fixture
def fresh_dtcore():
    """dtcore in this process, shut down after the test whatever happened."""
    dtcore.shutdown(barrier=False)
    yield dtcore
    dtcore.shutdown(barrier=False)


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def log_messages():
    """log_messages(name) -> a list of every message logged to that logger (or a child of it) from
    now until the test ends. dtcore's loggers do not propagate to the root, so caplog sees none."""
    attached: list[tuple[logging.Logger, _Messages]] = []

    def capture(name: str = "dtcore") -> list[str]:
        handler = _Messages()
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        attached.append((logger, handler))
        return handler.messages

    yield capture
    for logger, handler in attached:
        logger.removeHandler(handler)
