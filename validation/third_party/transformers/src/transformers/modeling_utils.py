# SHIM, written here (memcalc validation), not transformers' code: see
# validation/third_party/transformers/README.md. transformers' PreTrainedModel (modeling_utils.py,
# 4,000 lines of loading, saving, hub, quantisation and generation plumbing) reduced to what a
# model built from a config and trained calls, each method as transformers writes it at the
# vendored commit (line numbers of its modeling_utils.py):
# - __init__ (1143-1155): an nn.Module keeping its config (no GenerationConfig: generation is not
#   run);
# - post_init (1157-1163) -> init_weights (1830-1845): self.apply(self._initialize_weights), i.e.
#   the model's own _init_weights once per module (1394-1401), then tie_weights (1403-1497: the
#   head's weight *is* the embedding's when config.tie_word_embeddings, via _tie_or_clone_weights
#   1499-1518);
# - gradient_checkpointing_enable (1864-1904) and _set_gradient_checkpointing (1906-1926): every
#   module with a `gradient_checkpointing` attribute gets it set and _gradient_checkpointing_func =
#   functools.partial(torch.utils.checkpoint.checkpoint, **gradient_checkpointing_kwargs), {} by
#   default;
# - ModuleUtilsMixin's dtype (831-835) and get_head_mask (941-964, without a head mask: [None] per
#   layer), warn_if_padding_and_no_attention_mask (4144-4175: a warning only; it returns at once
#   when the config has no pad_token_id, as both models here have none). Beyond the model's own
#   parameters and buffers it makes no tensor, and no method here runs inside a forward or backward
#   except get_head_mask, dtype and the padding check, which make none.
import functools

from torch import nn
from torch.utils.checkpoint import checkpoint

from .configuration_utils import PretrainedConfig


class PreTrainedModel(nn.Module):
    config_class = None
    base_model_prefix = ""
    supports_gradient_checkpointing = False

    def __init__(self, config: PretrainedConfig, *inputs, **kwargs):
        super().__init__()
        if not isinstance(config, PretrainedConfig):
            raise ValueError("config should be a PretrainedConfig")
        self.config = config
        self.name_or_path = config.name_or_path
        self.warnings_issued = {}

    # --- initialisation
    # -------------------------------------------------------------------------------
    def post_init(self):
        self.init_weights()
        if self.supports_gradient_checkpointing and getattr(
            self.config, "gradient_checkpointing", False
        ):
            self.gradient_checkpointing_enable()
            delattr(self.config, "gradient_checkpointing")

    def init_weights(self):
        if self.config.pruned_heads:
            raise NotImplementedError("head pruning is not part of this shim")
        self.apply(self._initialize_weights)
        self.tie_weights()

    def _init_weights(self, module):
        pass

    def _initialize_weights(self, module):
        if getattr(module, "_is_hf_initialized", False):
            return
        self._init_weights(module)
        module._is_hf_initialized = True

    @property
    def base_model(self):
        return getattr(self, self.base_model_prefix, self)

    def get_input_embeddings(self):
        base_model = getattr(self, self.base_model_prefix, self)
        if base_model is not self:
            return base_model.get_input_embeddings()
        raise NotImplementedError

    def get_output_embeddings(self):
        return None

    def tie_weights(self):
        if getattr(self.config, "tie_word_embeddings", True):
            output_embeddings = self.get_output_embeddings()
            if output_embeddings is not None:
                self._tie_or_clone_weights(output_embeddings, self.get_input_embeddings())
        for module in self.modules():
            if hasattr(module, "_tie_weights"):
                module._tie_weights()

    def _tie_or_clone_weights(self, output_embeddings, input_embeddings):
        if self.config.torchscript:
            output_embeddings.weight = nn.Parameter(input_embeddings.weight.clone())
        else:
            output_embeddings.weight = input_embeddings.weight
        if getattr(output_embeddings, "bias", None) is not None:
            output_embeddings.bias.data = nn.functional.pad(
                output_embeddings.bias.data,
                (0, output_embeddings.weight.shape[0] - output_embeddings.bias.shape[0]),
                "constant",
                0,
            )
        if hasattr(output_embeddings, "out_features") and hasattr(
            input_embeddings, "num_embeddings"
        ):
            output_embeddings.out_features = input_embeddings.num_embeddings

    # --- gradient checkpointing
    # ----------------------------------------------------------------------
    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        if not self.supports_gradient_checkpointing:
            raise ValueError(f"{self.__class__.__name__} does not support gradient checkpointing.")
        if gradient_checkpointing_kwargs is None:
            gradient_checkpointing_kwargs = {}
        gradient_checkpointing_func = functools.partial(checkpoint, **gradient_checkpointing_kwargs)
        self._set_gradient_checkpointing(
            enable=True, gradient_checkpointing_func=gradient_checkpointing_func
        )

    def _set_gradient_checkpointing(self, enable=True, gradient_checkpointing_func=checkpoint):
        is_gradient_checkpointing_set = False
        if hasattr(self, "gradient_checkpointing"):
            self._gradient_checkpointing_func = gradient_checkpointing_func
            self.gradient_checkpointing = enable
            is_gradient_checkpointing_set = True
        for module in self.modules():
            if hasattr(module, "gradient_checkpointing"):
                module._gradient_checkpointing_func = gradient_checkpointing_func
                module.gradient_checkpointing = enable
                is_gradient_checkpointing_set = True
        if not is_gradient_checkpointing_set:
            raise ValueError(
                f"{self.__class__.__name__} is not compatible with gradient checkpointing."
            )

    @property
    def is_gradient_checkpointing(self):
        return any(getattr(m, "gradient_checkpointing", False) for m in self.modules())

    # --- ModuleUtilsMixin
    # ------------------------------------------------------------------------------
    @property
    def dtype(self):
        for t in self.parameters():
            if t.is_floating_point():
                return t.dtype
        return next(self.parameters()).dtype

    def get_head_mask(self, head_mask, num_hidden_layers, is_attention_chunked=False):
        if head_mask is not None:
            raise NotImplementedError("head masks are not part of this shim")
        return [None] * num_hidden_layers

    def warn_if_padding_and_no_attention_mask(self, input_ids, attention_mask):
        if (attention_mask is not None) or (self.config.pad_token_id is None):
            return
        raise NotImplementedError("the padding check is not part of this shim")


class SequenceSummary(nn.Module):
    """GPT2DoubleHeadsModel's multiple-choice head; not built here."""

    def __init__(self, config):
        raise NotImplementedError("SequenceSummary is not part of this shim")
