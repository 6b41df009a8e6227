// What autograd keeps by PyTorch version (kernels.hpp's torch_rows, --torch-version) and what a
// program's attention keeps when it repeats grouped k/v heads for a fused kernel (--repeat-kv).
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "memcalc/kernels.hpp"
#include "run_program.hpp"

using memcalc::TorchVersion;
using nlohmann::json;

namespace {

/// The activations a run reports: bytes a layer keeps and those of the head (final norm, loss).
struct Kept {
    std::uint64_t layer, head;
};

Kept kept(const std::string& options) {
    const testing::Run run =
        testing::memcalc(options + " --activations architecture --format json");
    REQUIRE(run.status == 0);
    const json a = json::parse(run.out)["activations"];
    return {a["layer_bytes"].get<std::uint64_t>(), a["head_bytes"].get<std::uint64_t>()};
}

}  // namespace

TEST_CASE("a release number is read as the row of version facts it falls in", "[version]") {
    const auto [text, row] = GENERATE(table<std::string, std::optional<TorchVersion>>({
        {"1.13", TorchVersion::v1_13},
        {"1.13.0a0", TorchVersion::v1_13},  // Debian's build
        {"2.1.2", TorchVersion::v1_13},
        {"2.2", TorchVersion::v2_2},
        {"2.4.1+cu121", TorchVersion::v2_2},
        {"10.0", TorchVersion::v2_2},
        {"1.12", std::nullopt},  // before the first row: not modelled
        {"2", std::nullopt},
        {"two.two", std::nullopt},
        {"", std::nullopt},
    }));
    INFO(text);
    CHECK(memcalc::torch_version_of(text) == row);
}

TEST_CASE("before torch 2.2 every RMSNorm also keeps x^2 in fp32 (mean's input)", "[version]") {
    // model, seq, micro-batch, the widths a layer's RMSNorms normalise per token, the final norm's
    const auto [model, s, b, widths, final_width] =
        GENERATE(table<std::string, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t>({
            {"--preset llama-7b", 128, 1, 2 * 4096, 4096},
            {"--preset mistral-7b", 64, 3, 2 * 4096, 4096},
            // two post-norms, q_norm and k_norm over the whole of q (4 x 16) and of k (2 x 16)
            {"--model-file " + std::string(MEMCALC_SOURCE_DIR) +
                 "/validation/models/olmo2-tiny.json",
             32, 2, 2 * 64 + 64 + 32, 64},
            // Jamba-style Mamba layers: the mixer's and the MLP's norms, and the dt (4), B and C
            // (8) norms inside the mixer
            {"--model-file " + std::string(MEMCALC_SOURCE_DIR) +
                 "/validation/models/mamba-tiny.json",
             32, 2, 2 * 64 + 4 + 2 * 8, 64},
            {"--preset gpt2", 128, 2, 0, 0},  // LayerNorms: no mean()
        }));
    INFO(model);
    const std::string options = model + " --seq " + std::to_string(s) + " -b " + std::to_string(b);
    const Kept before = kept(options + " --torch-version 1.13");
    const Kept after = kept(options + " --torch-version 2.4");
    CHECK(before.layer - after.layer == s * b * widths * 4);
    CHECK(before.head - after.head == s * b * final_width * 4);
}

TEST_CASE("a fused kernel handed repeated k/v keeps them at every query head", "[program]") {
    const auto [model, heads, kv_heads, head_dim] =
        GENERATE(table<std::string, std::uint64_t, std::uint64_t, std::uint64_t>({
            {"--preset llama-3-8b", 32, 8, 128},
            {"--preset mistral-7b", 32, 8, 128},
            {"--preset llama-7b", 32, 32, 128},  // no groups: nothing to repeat
        }));
    INFO(model);
    const std::string options = model + " --seq 256 -b 2 --attention flash";
    const Kept grouped = kept(options + " --repeat-kv false");
    const Kept repeated = kept(options + " --repeat-kv true");
    // k and v (bf16), each now of every query head; the eager path repeats them either way.
    CHECK(repeated.layer - grouped.layer == 2 * (heads - kv_heads) * head_dim * 512 * 2);
    CHECK(kept(model + " --seq 256 -b 2 --attention eager --repeat-kv true").layer ==
          kept(model + " --seq 256 -b 2 --attention eager --repeat-kv false").layer);
}

TEST_CASE("a wrong --torch-version is named, with the rows", "[version][cli]") {
    for (const char* wrong : {"1.9", "latest"}) {
        const testing::Run run =
            testing::memcalc(std::string("--preset llama-7b --torch-version ") + wrong);
        INFO(wrong);
        CHECK(run.status == 2);
        CHECK(run.out.empty());
        CHECK_THAT(run.err, Catch::Contains("--torch-version must be 1.13 or 2.2, or a release "
                                            "from 1.13 on (got '" +
                                            std::string(wrong) + "')"));
    }
}
