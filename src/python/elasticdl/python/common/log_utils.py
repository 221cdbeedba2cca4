"""``elasticdl.python.common.log_utils``: ``default_logger`` and ``get_logger``, plain
:mod:`logging` loggers (each replica configures logging at start-up)."""
import logging

__all__ = ["default_logger", "get_logger"]


def get_logger(name, level=None, handlers=None, update=False):
    logger = logging.getLogger(name)
    if level is not None:
        logger.setLevel(level.upper() if isinstance(level, str) else level)
    for handler in handlers or ():
        logger.addHandler(handler)
    return logger


default_logger = logging.getLogger("elasticdl")
