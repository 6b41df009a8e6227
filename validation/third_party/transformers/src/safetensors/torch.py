# SHIM, written here (memcalc validation), not transformers' code: see
# validation/third_party/transformers/README.md. pytorch_utils.py imports these two for
# id_tensor_storage() (saving shared weights), never called in training.


def storage_ptr(tensor):
    raise NotImplementedError("safetensors is not installed; not needed to train")


def storage_size(tensor):
    raise NotImplementedError("safetensors is not installed; not needed to train")
