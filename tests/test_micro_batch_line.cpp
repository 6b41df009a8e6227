// A sweep's rows along the micro-batch off lines (micro_batch_line.hpp): every row the summary the
// estimator makes whole, on every preset and on generated shapes, or no line drawn.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "model_file.hpp"
#include "render.hpp"
#include "memcalc/micro_batch_line.hpp"
#include "memcalc/recipe.hpp"

using namespace memcalc;

namespace {

const std::vector<Recompute> line_modes = {Recompute::none, Recompute::selective, Recompute::full};

/// 1..n and a few far ones, out of order as a user may list them.
std::vector<std::uint64_t> listed_micro_batches(std::uint64_t n) {
    std::vector<std::uint64_t> out;
    for (std::uint64_t b = n; b >= 1; --b) out.push_back(b);
    out.insert(out.begin() + 3, {97, 64, 200});
    return out;
}

/// Every `stride`-th row of `lines` (each where it is 1) against the estimator's whole summary,
/// figure for figure and as printed; whether the lines were drawn.
bool line_rows_agree(const Estimator& e, const Settings& s,
                     const std::vector<std::uint64_t>& batches, std::size_t stride = 1) {
    MicroBatchLines lines(e, s, line_modes, batches);
    if (!lines.drawn()) return false;
    cli::CsvRowWriter fast_rows, whole_rows;
    for (std::size_t i = 0; i < batches.size(); i += stride) {
        const std::uint64_t b = batches[i];
        if (!lines.covers(b)) continue;
        Settings at = s;
        at.micro_batch = b;
        const std::vector<Summary> whole = e.summaries(at, line_modes);
        for (std::size_t m = 0; m < line_modes.size(); ++m) {
            CAPTURE(b, recompute_name(line_modes[m]));
            const Summary& fast = lines.at(b, m);
            CHECK(fast.settings.micro_batch == b);
            CHECK(fast.activations == whole[m].activations);
            CHECK(fast.kept_activations == whole[m].kept_activations);
            CHECK(fast.peak.name() == whole[m].peak.name());
            CHECK(fast.peak_stage == whole[m].peak_stage);
            for (auto category : breakdown_categories)
                CHECK((fast.peak.bytes.*category) == (whole[m].peak.bytes.*category));
            CHECK(fast.compute.step == whole[m].compute.step);
            CHECK(fast.compute.recompute == whole[m].compute.recompute);
            std::string fast_row, whole_row;
            fast_rows.append(fast_row, "m", fast);
            whole_rows.append(whole_row, "m", whole[m]);
            CHECK(fast_row == whole_row);
        }
    }
    return true;
}

}  // namespace

TEST_CASE("a sweep's lines along the micro-batch give each preset's summaries whole",
          "[sweep][lines][slow-sanitized]") {
    std::size_t presets = 0, drawn = 0;
    for (const std::string& name : cli::preset_names()) {
        ++presets;
        const Architecture m = cli::load_preset(name).architecture;
        const Estimator e(m);
        Settings s;
        s.seq = m.max_positions > 0 ? std::min<std::uint64_t>(1024, m.max_positions) : 1024;
        s.activations = ActivationModel::architecture;
        s.framework.attention = Attention::flash;
        CAPTURE(name);
        // Every third row: the sanitizer build runs this too.
        drawn += line_rows_agree(e, s, listed_micro_batches(60), 3) ? 1 : 0;
        // Pipelined with ZeRO-3, activations offloaded, the loop holding its logits, LoRA.
        Settings other = s;
        other.parallel.pp = m.layers % 2 == 0 ? 2 : 1;
        other.parallel.dp = 4, other.parallel.zero = 3, other.parallel.microbatches = 4;
        other.parallel.offload_activations = true;
        other.framework.attention = Attention::eager;
        other.tuning.mode = Training::lora;
        other.tuning.lora.targets = {"all-linear"};
        try {
            (void)e.summary(other);
        } catch (const error&) {
            continue;  // a layout this model refuses: no line is drawn for it either
        }
        line_rows_agree(e, other, listed_micro_batches(33), 4);
    }
    // Lines for most: the rows above were compared (a kink between the last probes leaves none).
    CHECK(drawn * 10 >= presets * 9);
}

TEST_CASE("a line is drawn through kinks where a maximum changes sides, and agrees everywhere",
          "[sweep][lines]") {
    // QLoRA: each layer's workspace holds its dequantised weight beside the op's temporaries, a
    // constant against figures that grow with the micro-batch; autocast's casts likewise.
    const Architecture m = cli::load_preset("llama-3-8b").architecture;
    const Estimator e(m);
    for (const char* recipe : {"mixed-adam", "amp-adam"}) {
        Settings s;
        s.seq = 64, s.activations = ActivationModel::architecture;
        s.recipe = builtin_recipe(recipe);
        if (std::string(recipe) == "mixed-adam") {
            s.tuning.mode = Training::qlora;
            s.tuning.lora.targets = {"all-linear"};
        }
        CAPTURE(recipe);
        // Autocast's workspaces bend at nearly every probe: few or no segments, each row whole.
        const bool drawn = line_rows_agree(e, s, listed_micro_batches(90));
        CHECK((drawn || s.recipe.name == "amp-adam"));
    }
}

TEST_CASE("no line is drawn where the micro-batch's tokens round", "[sweep][lines]") {
    const Architecture m = cli::load_preset("llama-7b").architecture;
    const Estimator e(m);
    Settings s;
    s.seq = 1000, s.activations = ActivationModel::architecture;
    const std::vector<std::uint64_t> batches = listed_micro_batches(40);
    CHECK(MicroBatchLines(e, s, line_modes, batches).drawn());
    Settings split = s;
    split.parallel.tp = 2;
    CHECK_FALSE(MicroBatchLines(e, split, line_modes, batches).drawn());
    Settings chunked = s;
    chunked.framework.loss = LossKernel::chunked, chunked.framework.loss_chunks = 7;
    CHECK_FALSE(MicroBatchLines(e, chunked, line_modes, batches).drawn());
    CHECK_FALSE(MicroBatchLines(e, s, {Recompute::op}, batches).drawn());
    // Too few micro-batches to share the probes' cost.
    CHECK_FALSE(MicroBatchLines(e, s, line_modes, {1, 2, 3, 4}).drawn());
}

TEST_CASE("generated shapes: every row off a line is the estimator's whole summary",
          "[sweep][lines][property]") {
    std::mt19937_64 random{20261205};
    const auto between = [&](std::uint64_t lo, std::uint64_t hi) {
        return std::uniform_int_distribution<std::uint64_t>(lo, hi)(random);
    };
    int drawn = 0;
    for (int shape = 0; shape < 120; ++shape) {
        Architecture m;
        m.name = "generated";
        m.heads = 1 + between(0, 7) * 2, m.kv_heads = between(0, 1) ? m.heads : 1;
        m.hidden = m.heads * 16 * between(1, 8), m.layers = between(1, 12);
        m.ffn = 8 * between(1, 512), m.vocab = between(2, 5000);
        m.mlp = between(0, 1) ? Mlp::gated : Mlp::plain;
        m.tied_embeddings = between(0, 1) == 1;
        if (between(0, 3) == 0) m.experts = 4, m.experts_per_token = between(1, 4);
        Settings s;
        s.seq = between(1, 300);
        s.activations =
            between(0, 1) ? ActivationModel::architecture : ActivationModel::korthikanti;
        s.parallel.pp = m.layers % 2 == 0 ? between(1, 2) : 1;
        s.parallel.dp = between(1, 2), s.parallel.zero = s.parallel.dp > 1 ? 1 : 0;
        s.parallel.microbatches = between(0, 3);
        CAPTURE(shape, m.heads, m.hidden, m.layers, m.ffn, m.vocab, m.experts, s.seq, s.parallel.pp,
                s.parallel.dp);
        const std::size_t stride = 1 + shape % 2;  // every row of half the shapes
        drawn += line_rows_agree(Estimator(m), s, listed_micro_batches(32 + between(0, 8)), stride)
                     ? 1
                     : 0;
    }
    CAPTURE(drawn);
    CHECK(drawn > 90);  // lines drawn for most shapes: the rows above were compared
}

TEST_CASE("a probe's peak, the earliest largest of its candidates, is layout_peak's",
          "[sweep][lines]") {
    const Architecture m = cli::load_preset("llama-3-8b").architecture;
    const Estimator e(m);
    Settings s;
    s.seq = 640, s.activations = ActivationModel::architecture;
    s.parallel.pp = 4, s.parallel.dp = 2, s.parallel.zero = 1, s.parallel.microbatches = 8;
    for (std::uint64_t b : {1, 3, 17}) {
        s.micro_batch = b;
        std::vector<std::vector<LayoutPeak>> steps;
        const std::vector<Summary> with = e.summaries(s, line_modes, &steps);
        const std::vector<Summary> without = e.summaries(s, line_modes);
        REQUIRE(steps.size() == line_modes.size());
        for (std::size_t i = 0; i < line_modes.size(); ++i) {
            CAPTURE(b, i);
            CHECK(with[i].peak.name() == without[i].peak.name());
            CHECK(with[i].peak.bytes.total() == without[i].peak.bytes.total());
            CHECK(with[i].peak_stage == without[i].peak_stage);
        }
    }
}
