# SHIM, written here: lightning_utilities.core.imports.RequirementCache, as lit_gpt/model.py asks it
# one thing at import: whether flash-attn 2 is installed. Not here, so model.py takes PyTorch's
# scaled_dot_product_attention (CausalSelfAttention.scaled_dot_product_attention).


class RequirementCache:
    def __init__(self, requirement, module=None):
        self.requirement = requirement

    def __bool__(self):
        return False

    def __str__(self):
        return f"Requirement {self.requirement!r} not met (shim: nothing is installed)"
