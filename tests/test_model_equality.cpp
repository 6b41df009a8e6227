#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "fixtures.hpp"
#include "model_file.hpp"
#include "memcalc/estimate.hpp"
#include "memcalc/model_equality.hpp"

using namespace memcalc;

namespace {

/// One field changed at each depth of the model: a width, a flag, a rate, an enum, the nested
/// widths of latent attention, a state space and a vision tower, a layer kind, the kinds' order,
/// the name.
const std::vector<std::pair<const char*, std::function<void(Architecture&)>>> one_field = {
    {"hidden", [](Architecture& m) { m.hidden += 64; }},
    {"vocab", [](Architecture& m) { m.vocab += 1; }},
    {"norm",
     [](Architecture& m) { m.norm = m.norm == Norm::rmsnorm ? Norm::layernorm : Norm::rmsnorm; }},
    {"hidden_dropout", [](Architecture& m) { m.hidden_dropout += 0.25; }},
    {"repeat_kv", [](Architecture& m) { m.repeat_kv = !m.repeat_kv; }},
    {"layer_pattern",
     [](Architecture& m) {
         m.layer_pattern.push_back({0, 1});
     }},
    {"mla.v_head_dim", [](Architecture& m) { m.mla.v_head_dim += 8; }},
    {"ssm.d_state", [](Architecture& m) { m.ssm.d_state += 8; }},
    {"vision.attention_bias", [](Architecture& m) { m.vision.attention_bias ^= true; }},
    {"layer_kinds",
     [](Architecture& m) {
         m.layer_kinds.push_back({"extra", 64, 0, {}});
     }},
    {"name", [](Architecture& m) { m.name += "-copy"; }},
};

Settings at(std::uint64_t seq, Recompute mode) {
    Settings s;
    s.seq = seq, s.recompute = mode;
    return s;
}

/// What a report says, in the figures a change of model would move.
void require_same(const Report& a, const Report& b) {
    REQUIRE(a.parameter_count == b.parameter_count);
    CHECK(a.state.total() == b.state.total());
    CHECK(a.kept_activations == b.kept_activations);
    CHECK(a.peak_step().bytes.total() == b.peak_step().bytes.total());
    CHECK(a.peak_step().name() == b.peak_step().name());
    CHECK(a.model == b.model);
}

}  // namespace

TEST_CASE("a model equals its copy, and no model that differs from it in one field",
          "[estimate][model_equality]") {
    for (const auto& preset : cli::preset_names()) {
        const Architecture m = cli::load_preset(preset).architecture;
        CAPTURE(preset);
        const Architecture copy = m;
        CHECK(copy == m);
        for (const auto& [field, change] : one_field) {
            CAPTURE(field);
            Architecture other = m;
            change(other);
            CHECK(other != m);
            CHECK_FALSE(other == m);
        }
    }
    Architecture dense_then_moe = fixtures::dense_then_moe(), other = dense_then_moe;
    other.layer_kinds[1].window = 128;  // a field of one kind of layer among two
    CHECK(other != dense_then_moe);
}

TEST_CASE("estimate() keeps the last model's tables and answers for the model it is given",
          "[estimate][model_equality]") {
    Settings s = at(2048, Recompute::selective);
    s.activations = ActivationModel::architecture;  // every model type's blocks
    // Every preset after the one before it, then in reverse: each answer is a fresh Estimator's.
    std::vector<std::string> order = cli::preset_names();
    for (int pass = 0; pass < 2; ++pass) {
        for (const auto& preset : order) {
            const Architecture m = cli::load_preset(preset).architecture;
            CAPTURE(preset, pass);
            if (m.max_positions != 0 && m.max_positions < s.seq) continue;
            require_same(estimate(m, s), Estimator(m).estimate(s));
        }
        std::reverse(order.begin(), order.end());
    }
    // Models one field apart, one after the other (the width changed on a model that has it).
    const Architecture llama = fixtures::llama_7b();
    Architecture wider = llama, renamed = llama;
    wider.ffn += 256, renamed.name = "llama-7b-renamed";
    for (const Architecture& m : {llama, wider, llama, renamed, wider})
        require_same(estimate(m, s), Estimator(m).estimate(s));
}

TEST_CASE("estimate() after a model that cannot be counted answers for the next one",
          "[estimate][model_equality]") {
    const Settings s = at(1024, Recompute::full);
    const Architecture llama = fixtures::llama_7b();
    Architecture broken = llama;
    broken.heads = 0;  // validated when its tables are made
    const Report before = estimate(llama, s);
    CHECK_THROWS_AS(estimate(broken, s), error);
    CHECK_THROWS_AS(estimate(broken, s), error);  // not kept: thrown again
    require_same(estimate(llama, s), before);
    require_same(estimate(llama, s), Estimator(llama).estimate(s));
}

TEST_CASE("a report's parameter table outlives the estimator that shared it",
          "[estimate][model_equality]") {
    const Settings s = at(1024, Recompute::full);
    const Architecture llama = fixtures::llama_7b();
    Architecture wider = llama;
    wider.ffn += 256;
    const Report first = estimate(llama, s);   // shares the thread's kept Estimator's table
    const Report second = estimate(wider, s);  // which that Estimator, made again, lets go
    REQUIRE(first.parameters != second.parameters);
    CHECK(first.parameters->total() == first.parameter_count);
    CHECK(first.parameters->total() == Estimator(llama).estimate(s).parameter_count);
    CHECK(second.parameters->total() == second.parameter_count);
    Report copy = first;
    { const Report gone = Estimator(wider).estimate(s); }  // a table freed beside it
    CHECK(copy.parameters->total() == first.parameter_count);
    CHECK(copy.parameters == first.parameters);  // copies share, never copy, the table
}
