# SHIM, written here (memcalc validation), not transformers' code: see
# validation/third_party/transformers/README.md. transformers' own __init__ is a lazy-import table
# of every model. configuration_gpt2.py imports three names from it for its ONNX export class
# (unused here): placeholders, no tensors.
__version__ = "4.36.0.dev0"  # the vendored commit's, 0864dd3beb238b7bec3528a3d1d6c17a28f51a51


class PreTrainedTokenizer:  # only named in a type annotation of GPT2OnnxConfig
    pass


class TensorType:  # only named in a type annotation of GPT2OnnxConfig
    pass


def is_torch_available():
    return True
