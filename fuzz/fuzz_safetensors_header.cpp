// libFuzzer target: the start of a safetensors file (--config DIR reads each shard's header), and
// the checkpoint check of what it names against a small model.
#include <cstdint>
#include <string>

#include "model_folder.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static const std::string config =
        R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
        "vocab_size": 100,
        "torch_dtype": "bfloat16", "quantization_config": {"weight_block_size": [128, 128]}})";
    static const memcalc::Architecture model =
        memcalc::cli::parse_hf_config(config, "fuzz", "fuzz").architecture;
    const std::string bytes(reinterpret_cast<const char*>(data), size);
    try {
        // The whole file: its tensors must tile its data (a longer file's would leave bytes over).
        const auto tensors = memcalc::cli::parse_safetensors_header(bytes, size, "fuzz");
        const auto check =
            memcalc::cli::check_checkpoint(model, config, "", {{"fuzz", tensors}}, "x");
        (void)memcalc::cli::checkpoint_table(check);
    } catch (const memcalc::error&) {}
    return 0;
}
