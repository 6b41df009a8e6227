// libFuzzer target: a model folder's model.safetensors.index.json (--config DIR): the shards its
// weight_map names, and the checkpoint check of its tensors against a small model.
#include <filesystem>

#include "in_process.hpp"
#include "model_folder.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    enter_scratch_folder();
    std::filesystem::create_directory("model");
    std::ofstream("model/config.json") << R"({"model_type": "llama", "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 64,
        "torch_dtype": "bfloat16", "quantization_config": {"weight_block_size": [128, 128]}})";
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::ofstream("model/model.safetensors.index.json", std::ios::binary)
        .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    try {
        const auto file = memcalc::cli::load_model_folder("model");
        if (file.checkpoint) (void)memcalc::cli::checkpoint_table(*file.checkpoint);
    } catch (const memcalc::error&) {
        return 0;
    }
    run_memcalc({"--config", "model", "--format", "json"});
    return 0;
}
