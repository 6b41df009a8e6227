# SHIM, written here (memcalc validation), not transformers' code: see
# validation/third_party/transformers/README.md. configuration_gpt2.py defines GPT2OnnxConfig (ONNX
# export, never built here) on these: placeholders.


class OnnxConfigWithPast:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("ONNX export is not part of this shim")


class PatchingSpec:
    pass
