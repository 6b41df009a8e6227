#include <catch2/catch.hpp>

#include "memcalc/recipe.hpp"

using namespace memcalc;

TEST_CASE("the recipe table's bytes per parameter", "[recipe]") {
    using Row = std::tuple<const char*, std::uint64_t, std::uint64_t>;
    const auto [name, bytes, k] = GENERATE(table<const char*, std::uint64_t, std::uint64_t>({
        Row{"mixed-adam", 16, 12},             // ZeRO 3.1: 2 + 2 + K, K = 12
        Row{"fp32-adam", 16, 8},               // 4 + 4 + 8
        Row{"mixed-adam-fp32-grads", 18, 12},  // Megatron-LM: fp32 gradients
        Row{"mixed-sgd", 12, 8},
        Row{"fp32-sgd", 12, 4},
    }));
    CAPTURE(name);
    const Recipe* r = find_recipe(name);
    REQUIRE(r != nullptr);
    CHECK(r->bytes_per_parameter() == bytes);
    CHECK(r->zero_k() == k);
}

TEST_CASE("LLaMA 7B's training state is 107814649856 bytes", "[recipe]") {
    const TrainingState s = training_state(6738415616ULL, *find_recipe("mixed-adam"));
    CHECK(s.total().value() == 107814649856ULL);
    CHECK(s.weights.value() == 2 * 6738415616ULL);
    CHECK(s.master_weights.value() == 4 * 6738415616ULL);
    CHECK(s.optimizer_state.value() == 8 * 6738415616ULL);
}

TEST_CASE("an unknown recipe is not found", "[recipe]") { CHECK(find_recipe("adam") == nullptr); }
