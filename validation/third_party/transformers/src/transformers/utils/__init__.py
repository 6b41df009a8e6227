# SHIM, written here (memcalc validation), not transformers' code: see
# validation/third_party/transformers/README.md. transformers' utils package is hub, docstring and
# import plumbing. The vendored files import from it:
# - the docstring decorators, which in transformers only rewrite a function's __doc__: here they
#   return the function unchanged;
# - ModelOutput, from the vendored utils/generic.py (unchanged);
# - availability checks (import_utils.py here) and logging (logging.py here). Nothing here makes a
#   tensor or runs in a forward or backward.
from . import logging  # noqa: F401
from .generic import ModelOutput  # noqa: F401  vendored unchanged
from .import_utils import (  # noqa: F401
    is_flash_attn_2_available,
    is_torch_available,
    is_torch_fx_available,
    is_torch_fx_proxy,
    is_torch_tpu_available,
)


def _keep(fn):
    return fn


def add_start_docstrings(*docstr):
    return _keep


def add_start_docstrings_to_model_forward(*docstr):
    return _keep


def add_end_docstrings(*docstr):
    return _keep


def add_code_sample_docstrings(*args, **kwargs):
    return _keep


def replace_return_docstrings(*args, **kwargs):
    return _keep
