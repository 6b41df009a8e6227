# SHIM, written here (memcalc validation), not transformers' code: see
# validation/third_party/transformers/README.md. The availability checks the vendored files call,
# answered for this machine (torch 1.13, CPU, no TF, JAX or flash-attn) as transformers'
# import_utils.py answers them. Nothing here makes a tensor.
import torch


def is_torch_available():
    return True


def is_tf_available():
    return False


def is_flax_available():
    return False


def is_torch_tpu_available(check_device=True):
    return False


def is_flash_attn_2_available():
    return False


def is_torch_fx_available():
    # transformers: torch >= 1.10 (TORCH_FX_REQUIRED_VERSION)
    major, minor = (int(v) for v in torch.__version__.split(".")[:2])
    return (major, minor) >= (1, 10)


def is_torch_fx_proxy(x):
    if is_torch_fx_available():
        import torch.fx

        return isinstance(x, torch.fx.Proxy)
    return False
