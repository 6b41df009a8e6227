// The per-tensor optimiser rows (adam-8bit, adafactor, muon): their state summed by hand over each
// model's tensors, sharded, and their step's temporaries.
#include <catch2/catch.hpp>

#include <functional>
#include <vector>

#include "fixtures.hpp"
#include "memcalc/estimate.hpp"

using namespace memcalc;

namespace {

/// A LLaMA-style model at CPU size (validation/gpu/models/llama-tiny.json): k and v are 2048
/// elements, below bitsandbytes' 4096.
Architecture llama_tiny() {
    Architecture m;
    m.name = "llama-tiny";
    m.hidden = 64, m.layers = 2, m.heads = 4, m.kv_heads = 2, m.ffn = 176, m.vocab = 128,
    m.max_positions = 256;
    return m;
}

/// One tensor as the optimiser sees it: its dimensions, whether it is one of a layer's matrices,
/// and how many the model has.
struct Tensor {
    std::vector<std::uint64_t> dims;
    bool layer_matrix;
    std::uint64_t copies;
    std::uint64_t elements() const {
        std::uint64_t n = 1;
        for (auto d : dims) n *= d;
        return n;
    }
};

/// The tensors of a gated, RMSNorm, untied, bias-free model, written out.
std::vector<Tensor> llama_tensors(const Architecture& m) {
    const std::uint64_t h = m.hidden, f = m.ffn, V = m.vocab, L = m.layers,
                        kv = m.key_value_heads() * m.head_size();
    return {{{V, h}, false, 1},     {{h}, false, 2 * L},   {{h, h}, true, 2 * L},
            {{h, kv}, true, 2 * L}, {{h, f}, true, 3 * L}, {{h}, false, 1},
            {{h, V}, false, 1}};
}

Count by_hand(const std::vector<Tensor>& tensors,
              const std::function<std::uint64_t(const Tensor&)>& bytes) {
    Count sum;
    for (const auto& t : tensors) sum += Count(t.copies) * bytes(t);
    return sum;
}

// bitsandbytes >= 0.44: uint8 m and v with an fp32 absmax per 256 from 4096 elements, fp32 m and v
// below.
std::uint64_t bnb_state(const Tensor& t) {
    const std::uint64_t n = t.elements();
    return n < 4096 ? 8 * n : 2 * n + 2 * 4 * ((n + 255) / 256);
}
// transformers' Adafactor, beta1=None: fp32 row and column vectors of a matrix, a whole fp32 v of a
// vector, and each tensor's fp32 RMS.
std::uint64_t adafactor_state(const Tensor& t) {
    return 4 + 4 * (t.dims.size() >= 2 ? t.dims[0] + t.dims[1] : t.elements());
}
// Muon: an fp32 momentum for the layers' matrices, fp32 AdamW m and v for the rest.
std::uint64_t muon_state(const Tensor& t) { return (t.layer_matrix ? 4 : 8) * t.elements(); }

Settings with_recipe(const char* name, std::uint64_t seq = 16) {
    Settings s;
    s.seq = seq;
    s.recipe = builtin_recipe(name);
    return s;
}

}  // namespace

TEST_CASE("each per-tensor optimiser's state is its tensors' sum by hand", "[optimizer]") {
    using Rule = std::uint64_t (*)(const Tensor&);
    const auto [name, rule] = GENERATE(table<const char*, Rule>(
        {{"adam-8bit", bnb_state}, {"adafactor", adafactor_state}, {"muon", muon_state}}));
    for (const Architecture& m : {llama_tiny(), fixtures::llama_7b()}) {
        CAPTURE(name, m.name);
        const Report r = estimate(m, with_recipe(name));
        CHECK(r.state.optimizer_state == by_hand(llama_tensors(m), rule));
        // Weights, gradients and master copy are the mixed-precision recipe's.
        CHECK(r.state.weights == r.parameter_count * 2);
        CHECK(r.state.master_weights == r.parameter_count * 4);
        CHECK(r.busiest().state.optimizer_state ==
              r.state.optimizer_state);  // one device: all of it
    }
}

TEST_CASE("8-bit state: a tensor below 4096 elements keeps fp32 m and v, one of 4096 is quantised",
          "[optimizer]") {
    // llama-tiny's k and v (64 x 32) are below the threshold; LLaMA 7B's norms (4096) are on it.
    CHECK(bnb_state({{64, 32}, true, 1}) == 8 * 2048);
    const Architecture m = fixtures::llama_7b();
    const Report r = estimate(m, with_recipe("adam-8bit"));
    std::vector<Tensor> all = llama_tensors(m);
    CHECK(r.state.optimizer_state == by_hand(all, bnb_state));
    all[1].dims = {4095};  // were the norms one element smaller they would keep fp32 state
    CHECK(by_hand(all, bnb_state).value() - r.state.optimizer_state.value() ==
          2 * m.layers * (8 * 4095 - (2 * 4096 + 2 * 4 * 16)));
    // About a quarter of Adam's 8 bytes per parameter.
    const double per_parameter =
        static_cast<double>(r.state.optimizer_state.value()) / r.parameter_count.value();
    CHECK(per_parameter == Approx(2.0 + 8.0 / 256).epsilon(1e-3));
}

TEST_CASE("adafactor factors matrices, not vectors; muon splits matrices from the rest",
          "[optimizer]") {
    const Architecture m = llama_tiny();
    const auto state = [&](const char* recipe) {
        return estimate(m, with_recipe(recipe)).state.optimizer_state;
    };
    // A matrix keeps R + C, a vector all n: drop the norms and the difference is theirs alone.
    const std::uint64_t norms = 2 * m.layers + 1;
    CHECK(
        state("adafactor").value() - by_hand({{{64}, false, norms}}, adafactor_state).value() ==
        by_hand(
            {{{128, 64}, false, 2}, {{64, 64}, true, 4}, {{64, 32}, true, 4}, {{64, 176}, true, 6}},
            adafactor_state));
    // Muon: 4 B for every layer matrix, 8 B for the embedding, head and norms.
    const Count matrices = Count(m.layers) * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 176);
    const Count rest = estimate(m, with_recipe("muon")).parameter_count.value() - matrices.value();
    CHECK(state("muon") == matrices * 4 + rest * 8);
    CHECK(state("muon") == by_hand(llama_tensors(m), muon_state));
}

TEST_CASE("tensor parallelism and ZeRO divide per-tensor state, leaning high where a piece changes",
          "[optimizer][parallel]") {
    const Architecture m = llama_tiny();
    const auto on_rank = [&](const char* recipe, Parallelism p) {
        Settings s = with_recipe(recipe);
        s.parallel = p;
        return estimate(m, s).busiest().state.optimizer_state;
    };
    Parallelism tp2;
    tp2.tp = 2;
    // Muon's state is per element: exact. Matrices halve; norms stay; the embedding and head keep
    // ceil(V / 2) rows.
    const Count matrices = Count(m.layers) * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 176);
    CHECK(on_rank("muon", tp2) ==
          matrices * 2 + Count(2 * m.layers * 64 + 64) * 8 + Count(2 * 64 * 64) * 8);

    // 8-bit halves of q and o fall below 4096 elements and keep fp32 state; every piece has its own
    // blocks. memcalc never counts less than the pieces' own state, nor much more.
    const auto piece = [](std::uint64_t n) { return bnb_state({{n}, false, 1}); };
    const std::uint64_t layer =
        2 * piece(64) + 2 * piece(64 * 64 / 2) + 2 * piece(64 * 32 / 2) + 3 * piece(64 * 176 / 2);
    const Count exact = Count(m.layers) * layer + piece(64) + 2 * piece(64 * 64);
    const Count counted = on_rank("adam-8bit", tp2);
    CHECK(counted >= exact);
    const Count split_tensors = Count(7 * m.layers + 2);
    CHECK(counted <= exact + split_tensors * (8 + 6 * 4095));

    // ZeRO-1 over 4 ranks: muon's buckets each divide; Adafactor sees one flat vector of the shard
    // (DeepSpeed's partitions), whose second moment is whole.
    Parallelism zero;
    zero.dp = 4, zero.zero = 1;
    const Count all = estimate(m, with_recipe("muon")).parameter_count;
    CHECK(on_rank("muon", zero) ==
          ceil_div(matrices, 4) * 4 + ceil_div(Count(all.value() - matrices.value()), 4) * 8);
    CHECK(on_rank("adafactor", zero) == ceil_div(all, 4) * 4 + 4);
    // 8-bit: each bucket divides (by 4 exactly here), and the shard is a piece of its own.
    const Count whole = estimate(m, with_recipe("adam-8bit")).state.optimizer_state;
    CHECK(on_rank("adam-8bit", zero) == ceil_div(whole, 4) + Count(8 + 6 * 4095));
}

TEST_CASE("the existing recipes' state is unchanged under any split", "[optimizer][parallel]") {
    // The closed form before per-tensor state: ceil(dense / shards) x bytes per parameter.
    const Architecture m =
        fixtures::gpt2_small();  // 124,439,808 parameters: not a multiple of 3 or 7
    for (const char* name : {"mixed-adam", "bf16-adam", "lion", "mixed-sgd"}) {
        for (std::uint64_t dp : {3, 7}) {
            CAPTURE(name, dp);
            Settings s = with_recipe(name, 64);
            s.parallel.dp = dp, s.parallel.zero = 1;
            const Report r = estimate(m, s);
            CHECK(r.busiest().state.optimizer_state ==
                  ceil_div(r.parameter_count, dp) * *s.recipe.optimizer_bytes());
            CHECK(r.state.optimizer_state == r.parameter_count * *s.recipe.optimizer_bytes());
        }
    }
}

TEST_CASE("each optimiser's step temporaries follow its own code", "[optimizer][step]") {
    const auto step = [](const Architecture& m, const char* recipe,
                         OptimizerImpl impl = OptimizerImpl::fused,
                         std::optional<DType> master = DType::fp32) {
        Settings s = with_recipe(recipe);
        s.framework.optimizer = impl;
        s.recipe.master = master;
        return estimate(m, s).timeline().back().bytes.workspace;
    };
    const Architecture tiny = llama_tiny();
    // bitsandbytes' kernel allocates nothing, even under a for-loop switch.
    CHECK(step(tiny, "adam-8bit", OptimizerImpl::for_loop) == 0);
    // Adafactor's loop, whatever the switch: grad^2 + eps beside its square and the previous
    // update, fp32; the largest tensors are the MLP's 64 x 176.
    CHECK(step(tiny, "adafactor") == Count(3 * 64 * 176) * 4);
    // A bf16 model with no master copy: fp32 copies of the weight and its gradient too.
    CHECK(step(tiny, "adafactor", OptimizerImpl::fused, std::nullopt) ==
          Count(3 * 64 * 176) * 4 + Count(2 * 64 * 176) * 4);
    // Muon: the aux AdamW's four of the embedding or head (128 x 64) beside the previous, fp32 (its
    // groups step the head, then the embedding), outweigh Newton-Schulz on 64 x 176 here...
    const Count ns_tiny = Count(4 * 64 * 176 + 2 * 64 * 64) * 2 + Count(64 * 176) * 2;
    CHECK(step(tiny, "muon") == Count(5 * 128 * 64) * 4);
    CHECK(step(tiny, "muon") > ns_tiny);
    // ...while on a wide model with a small vocabulary Newton-Schulz on 1024 x 4096 does: 4 m M + 2
    // m^2 bf16, beside the previous matrix's bf16 update.
    Architecture wide = tiny;
    wide.hidden = 1024, wide.heads = 16, wide.kv_heads = 16, wide.ffn = 4096;
    CHECK(step(wide, "muon") ==
          Count(4 * 1024 * 4096 + 2 * 1024 * 1024) * 2 + Count(1024 * 4096) * 2);
    // Adam as before: 2 x the largest + the next under the for-loop, none fused.
    CHECK(step(tiny, "mixed-adam", OptimizerImpl::for_loop) == Count(3 * 64 * 176) * 4);
    // A vocabulary of 1,024: the head (1024 x 64) is the largest after the embedding stepped first.
    // Its predecessor is unknown in groups, a matrix of a layer standing for it; in one group in
    // the model's order it is the final norm's weight (64).
    Architecture vocab = tiny;
    vocab.vocab = 1024, vocab.tied_embeddings = false;
    CHECK(step(vocab, "mixed-adam", OptimizerImpl::for_loop) ==
          Count(2 * 1024 * 64 + 64 * 176) * 4);
    vocab.params_in_model_order = true;
    CHECK(step(vocab, "mixed-adam", OptimizerImpl::for_loop) == Count(2 * 1024 * 64 + 64) * 4);
    // The layers' pairs are as before: the tiny model's largest is a layer's matrix.
    Architecture in_order = tiny;
    in_order.params_in_model_order = true;
    CHECK(step(in_order, "mixed-adam", OptimizerImpl::for_loop) == Count(3 * 64 * 176) * 4);
    // Lion's loop: the interpolation and its sign, no earlier update (measured:
    // validation/optimizer_state.py).
    CHECK(step(tiny, "lion", OptimizerImpl::for_loop) == Count(2 * 64 * 176) * 4);
    CHECK(step(tiny, "mixed-adam") == 0);
}
