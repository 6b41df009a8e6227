# SHIM, written here (memcalc validation), not transformers' code: see
# validation/third_party/transformers/README.md. transformers' logging wrapper reduced to what the
# vendored files call: get_logger and Logger.warning_once (as transformers'
# utils/logging.py:320-332 defines it). Messages only.
import functools
import logging


def get_logger(name=None):
    return logging.getLogger(name)


@functools.lru_cache(None)
def warning_once(self, *args, **kwargs):
    self.warning(*args, **kwargs)


logging.Logger.warning_once = warning_once
