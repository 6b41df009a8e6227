#pragma once
/// The saved-tensor table of one layer derived from the architecture itself: what PyTorch's eager
/// autograd keeps for backward when the layer is written as HuggingFace transformers writes it
/// (RMSNorm upcast to fp32, q/k/v with key/value heads, rotary, eager or fused attention, gated or
/// plain MLPs, mixture-of-experts routing), and the temporaries its ops make while they run. The
/// profile is current CUDA PyTorch (2.2 or later): LayerNorm keeps fp32 statistics, and mean()
/// keeps no copy of its input; where kernels differ, an op reads its fact (kernels.hpp).
/// validation/reference_trainer.py counts the same tensors in a real framework. Each block kind is
/// a header of blocks/, writing its rows and ops into the layer's program; this header includes
/// them all.
#include "memcalc/blocks/ends.hpp"
#include "memcalc/blocks/layer.hpp"
#include "memcalc/blocks/mtp.hpp"
