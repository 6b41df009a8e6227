// Training state per tensor: frozen tensors keep their weights alone, in a storage of their own
// when given one; each class is sharded on its own. Checked against hand sums and, over generated
// shapes, against the rule that freezing never costs more than a class's padding.
#include <catch2/catch.hpp>
#include <random>

#include "fixtures.hpp"
#include "memcalc/memcalc.hpp"

using namespace memcalc;

namespace {

/// The model's table with every row `frozen` says so frozen, in `storage` when given.
template <class Frozen>
ParameterTable freeze(const Architecture& m, Frozen frozen,
                      std::optional<Storage> storage = std::nullopt) {
    ParameterTable t = parameter_table(m);
    for (auto& row : t.rows)
        if (frozen(row)) row.trainable = false, row.storage = storage;
    return t;
}

Settings at(std::uint64_t seq) {
    Settings s;
    s.seq = seq;
    return s;
}

}  // namespace

TEST_CASE("a frozen embedding keeps its weights and drops its gradient, master copy and moments",
          "[state]") {
    const Architecture m = fixtures::llama_7b();
    const std::uint64_t V = 32000, h = 4096;
    const Report all = estimate(m, at(4096));
    const Report frozen =
        Estimator(m, freeze(m, [](const ParamRow& r) { return r.part == Part::embedding; }))
            .estimate(at(4096));
    CHECK(frozen.parameter_count == all.parameter_count);
    CHECK(frozen.state.weights == all.state.weights);
    CHECK(all.state.total().value() - frozen.state.total().value() == V * h * (2 + 4 + 8));
    // Its gradient never exists: the optimizer step holds every other gradient.
    const Step& last = frozen.timeline().back();
    CHECK(all.timeline().back().bytes.gradients.value() - last.bytes.gradients.value() ==
          V * h * 2);
    CHECK(frozen.peak_step().bytes.total() < all.peak_step().bytes.total());
}

TEST_CASE(
    "frozen layers in 4-bit blocks: the weights are the storage's exact bytes, sharded by ZeRO-3 "
    "only",
    "[state]") {
    const Architecture m = fixtures::llama_7b();
    const Storage nf4{DType::nf4, 64, DType::fp32};
    const ParameterTable table = freeze(
        m, [](const ParamRow& r) { return r.group == Group::layer; }, nf4);
    const Estimator estimator(m, table);
    const std::uint64_t per_layer = table.per_layer().value(), layers = 32;
    const std::uint64_t outside =
        table.total().value() - layers * per_layer;  // embedding, final norm, head
    CHECK_THROWS_WITH(estimator.estimate(at(2048)),
                      Catch::Contains("need the architecture activation model"));
    const auto at =
        [](std::uint64_t seq) {  // the architecture model, which dequantises in a workspace
            Settings s = ::at(seq);
            s.activations = ActivationModel::architecture;
            return s;
        };
    const Report r = estimator.estimate(at(2048));
    CHECK(r.state.weights.value() == nf4.bytes(layers * per_layer).value() + 2 * outside);
    CHECK(r.state.optimizer_state.value() == 8 * outside);
    CHECK(r.state.gradients.value() == 2 * outside);
    Settings sharded = at(2048);
    sharded.parallel.dp = 4, sharded.parallel.zero = 3;
    const Report z3 = estimator.estimate(sharded);
    const std::uint64_t shard = (layers * per_layer + 3) / 4, trainable_shard = (outside + 3) / 4;
    CHECK(z3.busiest().state.weights.value() == nf4.bytes(shard).value() + 2 * trainable_shard);
    CHECK(z3.busiest().state.master_weights.value() == 4 * trainable_shard);
    // bitsandbytes dequantises one weight at a time, in the layer's workspace: the largest,
    // gate_proj's.
    CHECK(r.peak_step().bytes.gathered_weights.value() == 0);
    bool dequantised = false;
    for (const auto& w : r.layer.work)
        dequantised = dequantised || w.bytes == Count(2ULL * 4096 * 11008);
    CHECK(dequantised);
    sharded.parallel.zero = 1;  // the weights are whole again; the trainable state stays sharded
    const Report z1 = estimator.estimate(sharded);
    CHECK(z1.busiest().state.weights.value() ==
          nf4.bytes(layers * per_layer).value() + 2 * outside);
    CHECK(z1.busiest().state.optimizer_state.value() == 8 * trainable_shard);
}

TEST_CASE("an edited table must be the model's own rows", "[state]") {
    const Architecture m = fixtures::llama_7b();
    ParameterTable t = parameter_table(m);
    t.rows.pop_back();
    CHECK_THROWS_WITH(Estimator(m, t), Catch::Contains("is not llama-7b's"));
    ParameterTable other = parameter_table(fixtures::mistral_7b());
    CHECK_THROWS_WITH(Estimator(m, other),
                      Catch::Contains("only its rows' trainable and storage may change"));
}

TEST_CASE("a trainable tensor takes the recipe's storage", "[state]") {
    const Architecture m = fixtures::llama_7b();
    ParameterTable t = parameter_table(m);
    t.rows.front().storage = Storage{DType::nf4};
    CHECK_THROWS_WITH(Estimator(m, t), Catch::Contains("token_embedding is trainable"));
}

TEST_CASE("freezing never costs more than a class's padding, on any rank, in any layout",
          "[state][property]") {
    std::mt19937_64 random(20261130);
    const auto pick = [&](std::uint64_t n) {
        return std::uniform_int_distribution<std::uint64_t>(0, n - 1)(random);
    };
    for (int shape = 0; shape < 300; ++shape) {
        Architecture m;
        m.name = "generated", m.heads = 8, m.hidden = 8 * (16 << pick(3)), m.layers = 1 + pick(12);
        m.ffn = 8 * (1 + pick(512)), m.vocab = 2 + pick(60000), m.tied_embeddings = pick(2) == 0;
        m.norm = pick(2) == 0 ? Norm::rmsnorm : Norm::layernorm,
        m.bias = pick(2) == 0 ? Bias::none : Bias::all;
        if (pick(5) == 0) m.experts = 4, m.experts_per_token = 2;
        Settings s = at(64 * (1 + pick(16)));
        s.recompute = pick(2) == 0 ? Recompute::none : Recompute::full;
        s.activations = pick(2) == 0 ? ActivationModel::korthikanti : ActivationModel::architecture;
        s.framework.optimizer = pick(2) == 0 ? OptimizerImpl::fused : OptimizerImpl::foreach;
        s.parallel.dp = 1 + pick(4),
        s.parallel.zero = s.parallel.dp > 1 ? static_cast<unsigned>(pick(4)) : 0;
        s.parallel.pp = m.layers % 2 == 0 ? 1 + pick(2) : 1;
        s.parallel.microbatches = 1 + pick(3) + s.parallel.pp;
        const int which = static_cast<int>(pick(4));
        const auto frozen = [&](const ParamRow& r) {
            return which == 0   ? r.part == Part::embedding
                   : which == 1 ? r.group == Group::layer
                   : which == 2 ? r.part == Part::norms
                                : r.part == Part::attention;
        };
        const std::optional<Storage> storage =
            pick(2) == 0 ? std::nullopt : std::optional<Storage>(Storage{DType::int8, 256});
        if (storage)
            s.activations = ActivationModel::architecture;  // which dequantises them in a workspace
        CAPTURE(shape, which, m.layers, s.parallel.dp, s.parallel.zero, s.parallel.pp,
                storage.has_value());
        const Report all = Estimator(m).estimate(s);
        const Report part = Estimator(m, freeze(m, frozen, storage)).estimate(s);
        CHECK(part.state.total() <= all.state.total());
        REQUIRE(part.ranks.size() == all.ranks.size());
        for (std::size_t k = 0; k < all.ranks.size(); ++k) {
            const std::uint64_t padding =
                2 * 8 * 2;  // a weight element of padding per class, dense and expert
            CHECK(part.ranks[k].peak_step().bytes.total().value() <=
                  all.ranks[k].peak_step().bytes.total().value() + padding);
        }
    }
}
