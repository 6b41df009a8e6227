# SHIM, written here (memcalc validation), not transformers' code: see
# validation/third_party/transformers/README.md. transformers' PretrainedConfig
# (configuration_utils.py) reduced to what the vendored models read: the attribute_map aliasing
# (GPT2Config's hidden_size -> n_embd, ...) as transformers writes it, the defaults of the
# attributes the models read, and every other keyword set as an attribute. No hub, JSON or
# generation plumbing. A config holds numbers and flags only: it makes no tensor.
from typing import Dict


class PretrainedConfig:
    model_type: str = ""
    attribute_map: Dict[str, str] = {}

    def __setattr__(self, key, value):  # as transformers' configuration_utils.py:255-258
        if key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        super().__setattr__(key, value)

    def __getattribute__(self, key):  # as transformers' configuration_utils.py:260-263
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)

    def __init__(self, **kwargs):
        # transformers' defaults for the attributes the vendored models read
        self.return_dict = kwargs.pop("return_dict", True)
        self.output_hidden_states = kwargs.pop("output_hidden_states", False)
        self.output_attentions = kwargs.pop("output_attentions", False)
        self.torchscript = kwargs.pop("torchscript", False)
        self.pruned_heads = kwargs.pop("pruned_heads", {})
        self.tie_word_embeddings = kwargs.pop("tie_word_embeddings", True)
        self.is_encoder_decoder = kwargs.pop("is_encoder_decoder", False)
        self.is_decoder = kwargs.pop("is_decoder", False)
        self.add_cross_attention = kwargs.pop("add_cross_attention", False)
        self.tie_encoder_decoder = kwargs.pop("tie_encoder_decoder", False)
        self.bos_token_id = kwargs.pop("bos_token_id", None)
        self.pad_token_id = kwargs.pop("pad_token_id", None)
        self.eos_token_id = kwargs.pop("eos_token_id", None)
        self.sep_token_id = kwargs.pop("sep_token_id", None)
        self._name_or_path = str(kwargs.pop("name_or_path", ""))
        for key, value in kwargs.items():
            setattr(self, key, value)

    @property
    def name_or_path(self) -> str:
        return getattr(self, "_name_or_path", None)

    @property
    def use_return_dict(self) -> bool:
        return self.return_dict and not self.torchscript
