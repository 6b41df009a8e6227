// Property tests over thousands of generated shapes (a fixed seed, so a failure reproduces).
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <random>

#include "memcalc/memcalc.hpp"
#include "render.hpp"

using namespace memcalc;

namespace {

struct Generator {
    std::mt19937_64 random{20261129};
    std::uint64_t between(std::uint64_t lo, std::uint64_t hi) {
        return std::uniform_int_distribution<std::uint64_t>(lo, hi)(random);
    }
    template <typename T>
    T pick(std::initializer_list<T> options) {
        return *(options.begin() + between(0, options.size() - 1));
    }

    Architecture architecture() {
        Architecture m;
        m.name = "generated";
        m.heads = pick<std::uint64_t>({1, 2, 3, 4, 6, 8, 12, 16, 32});
        m.kv_heads = pick<std::uint64_t>({1, m.heads, m.heads});
        m.head_dim = pick<std::uint64_t>({0, 0, 16, 64, 80, 128});
        m.hidden = m.heads * pick<std::uint64_t>({8, 16, 32, 64, 128});
        m.layers = between(1, 48);
        m.ffn = 8 * between(1, 2048);
        m.vocab = between(2, 70000);
        m.mlp = pick({Mlp::gated, Mlp::plain});
        m.norm = pick({Norm::rmsnorm, Norm::layernorm});
        m.bias = pick({Bias::none, Bias::qkv, Bias::attention, Bias::all});
        m.position = pick({Position::rotary, Position::learned, Position::none});
        m.max_positions = between(64, 8192);
        m.tied_embeddings = pick({false, true});
        m.activation =
            pick({Activation::silu, Activation::gelu, Activation::gelu_tanh, Activation::relu});
        m.parallel_attention = between(0, 5) == 0;
        m.norms_per_layer =
            m.parallel_attention ? pick<std::uint64_t>({1, 2}) : pick<std::uint64_t>({2, 2, 4});
        m.softmax_fp32 = pick({false, true});
        m.attention_dropout = pick({0.0, 0.1});
        m.hidden_dropout = pick({0.0, 0.1});
        if (between(0, 6) == 0)
            m.experts = pick<std::uint64_t>({2, 4, 8}), m.experts_per_token = between(1, m.experts);
        return m;
    }

    /// The same model with kinds of layer in random runs: some the model's own, some with another
    /// feed-forward width, some dense or with other experts.
    Architecture with_kinds(Architecture m) {
        const std::size_t kinds = between(2, 3);
        for (std::size_t k = 0; k < kinds; ++k) {
            LayerKind kind{"kind" + std::to_string(k), {}, {}, {}};
            switch (between(0, 2)) {
                case 1: kind.ffn = 8 * between(1, 2048); break;
                case 2:
                    kind.experts = pick<std::uint64_t>({0, 2, 4, 8});
                    if (*kind.experts > 0) kind.experts_per_token = between(1, *kind.experts);
                    break;
                default: break;
            }
            m.layer_kinds.push_back(kind);
        }
        for (std::uint64_t left = m.layers; left > 0;) {
            const std::uint64_t count = between(1, std::min<std::uint64_t>(left, 6));
            m.layer_pattern.push_back({static_cast<std::size_t>(between(0, kinds - 1)), count});
            left -= count;
        }
        return m;
    }

    Settings settings(const Architecture& m) {
        Settings s;
        s.seq = between(1, m.position == Position::learned ? m.max_positions : 8192);
        s.micro_batch = between(1, 4);
        s.recompute = pick({Recompute::none, Recompute::selective, Recompute::full});
        s.activations = pick({ActivationModel::korthikanti, ActivationModel::architecture});
        s.framework.attention = s.activations == ActivationModel::architecture
                                    ? pick({Attention::eager, Attention::flash})
                                    : Attention::eager;
        s.recipe = builtin_recipe(
            pick<std::string>({"mixed-adam", "fp32-adam", "mixed-adam-fp32-grads", "mixed-sgd"}));
        return s;
    }
};

Count peak(const Architecture& m, const Settings& s) {
    return estimate(m, s).peak_step().bytes.total();
}

}  // namespace

TEST_CASE("the peak never falls as the sequence or the micro-batch grows", "[property]") {
    Generator g;
    for (int shape = 0; shape < 1500; ++shape) {
        const Architecture m = g.architecture();
        Settings s = g.settings(m);
        if (m.position == Position::learned && s.seq == m.max_positions) --s.seq;
        if (s.seq == 0) s.seq = 1;
        CAPTURE(shape, m.hidden, m.heads, m.kv_heads, m.layers, m.ffn, s.seq, s.micro_batch,
                recompute_name(s.recompute));
        const Count here = peak(m, s);
        Settings longer = s, wider = s;
        longer.seq += 1;
        wider.micro_batch += 1;
        CHECK(peak(m, longer) >= here);
        CHECK(peak(m, wider) >= here);
    }
}

TEST_CASE("recomputation never raises what a layer keeps: none >= selective >= full",
          "[property]") {
    Generator g;
    for (int shape = 0; shape < 1500; ++shape) {
        const Architecture m = g.architecture();
        Settings s = g.settings(m);
        CAPTURE(shape, s.seq, s.micro_batch);
        const Report r = estimate(m, s);
        CHECK(r.layer.kept(Recompute::none) >= r.layer.kept(Recompute::selective));
        CHECK(r.layer.kept(Recompute::selective) >= r.layer.kept(Recompute::full));
    }
}

TEST_CASE("sharding and parallel splits never raise any rank's persistent memory", "[property]") {
    Generator g;
    for (int shape = 0; shape < 1500; ++shape) {
        const Architecture m = g.architecture();
        Settings s = g.settings(m);
        const Report one = estimate(m, s);
        Parallelism& p = s.parallel;
        p.dp = g.pick<std::uint64_t>({1, 2, 4, 8});
        p.tp = g.pick<std::uint64_t>({1, 2, 4});
        p.pp = g.pick<std::uint64_t>({1, 2, 3, 4});
        p.zero = p.dp > 1 ? static_cast<unsigned>(g.between(0, 3)) : 0;
        p.sequence_parallel = p.tp > 1 && g.between(0, 1) == 1;
        if (m.heads % p.tp || m.key_value_heads() % p.tp || m.ffn % p.tp || m.layers % p.pp ||
            s.seq % (p.sequence_parallel ? p.tp : 1))
            continue;
        CAPTURE(shape, m.heads, m.layers, p.dp, p.tp, p.pp, p.zero, p.sequence_parallel);
        const Report r = estimate(m, s);
        for (const auto& rank : r.ranks) CHECK(rank.state.total() <= one.state.total());
    }
}

TEST_CASE("the reported peak is the largest step, and the closed form finds the same one",
          "[property]") {
    Generator g;
    for (int shape = 0; shape < 1500; ++shape) {
        const Architecture m = g.architecture();
        Settings s = g.settings(m);
        s.parallel.pp = g.pick<std::uint64_t>({1, 2});
        s.parallel.dp = g.pick<std::uint64_t>({1, 4});
        s.parallel.zero = s.parallel.dp > 1 ? 3 : 0;
        if (m.layers % s.parallel.pp) s.parallel.pp = 1;
        CAPTURE(shape);
        const Report r = estimate(m, s);
        for (const auto& rank : r.ranks) {
            Count largest;
            for (const auto& step : rank.timeline())
                largest = std::max(largest, step.bytes.total());
            CHECK(rank.peak_step().bytes.total() == largest);
        }
    }
}

TEST_CASE(
    "the training loop's variants: held gradients never lower a peak, no state is lost, the closed "
    "form agrees",
    "[property][training-loop]") {
    Generator g;
    for (int shape = 0; shape < 1500; ++shape) {
        Architecture m = g.architecture();
        if (shape % 3 == 0) m = g.with_kinds(m);  // layers of several kinds
        Settings s = g.settings(m);
        Parallelism& p = s.parallel;
        p.dp = g.pick<std::uint64_t>({1, 2, 4});
        p.cp = s.seq % 2 == 0 ? g.pick<std::uint64_t>({1, 2}) : 1;
        p.pp = std::min<std::uint64_t>(m.layers, g.pick<std::uint64_t>({1, 2, 3}));
        if (m.layers % p.pp != 0) p.first_stage_layers = m.layers - (p.pp - 1) * (m.layers / p.pp);
        p.zero = p.dp > 1 ? static_cast<unsigned>(g.between(0, 3)) : 0;
        if (m.any_moe() && p.dp % 2 == 0 &&
            m.every_kind([](const Architecture& v) { return !v.is_moe() || v.experts % 2 == 0; }))
            p.ep = 2;
        if (p.zero > 0 && g.between(0, 3) == 0)
            p.offload = p.zero == 3 ? g.pick({Offload::optimizer, Offload::parameters})
                                    : Offload::optimizer;
        p.microbatches = g.pick<std::uint64_t>({0, 1, 2, 7});
        s.framework.grad_buffer = g.pick({GradBuffer::lazy, GradBuffer::persistent});
        CAPTURE(shape, m.layers, m.tied_embeddings, p.dp, p.cp, p.pp, p.first_stage_layers, p.zero,
                p.ep, offload_name(p.offload), p.microbatches,
                grad_buffer_name(s.framework.grad_buffer));
        const Report r = estimate(m, s);
        // No parameter's state is lost: summed over the ranks, at least the model's state (host
        // included).
        Count per_replica;
        for (const auto& k : r.ranks)
            per_replica += k.state.master_weights + k.state.optimizer_state + k.host;
        CHECK(Count(p.dp * p.tp * p.cp) * per_replica >=
              r.state.master_weights + r.state.optimizer_state);
        // More micro-batches or a persistent buffer never lower the peak.
        Settings fewer = s;
        fewer.parallel.microbatches = std::max<std::uint64_t>(1, p.steps_per_batch() / 2);
        fewer.framework.grad_buffer = GradBuffer::lazy;
        if (fewer.parallel.microbatches >= p.pp)
            CHECK(peak(m, fewer) <= r.peak_step().bytes.total());
        // The closed form finds the built timelines' peak.
        const ActivationTables t = activation_tables(
            m, s.seq, s.micro_batch, r.settings.recipe.activations, s.activations, s.framework);
        const Workload w = make_workload(m, r.settings.recipe, s.seq, s.micro_batch, s.recompute,
                                         parameter_splits(*r.parameters, m.vocab), t, s.framework);
        const LayoutPeak fast = layout_peak(w, p);
        CHECK(fast.bytes() == r.peak_step().bytes.total());
        CHECK(fast.step.name() == r.peak_step().name());
        // The floor by which plan drops layouts unweighed: every step of the first stage holds it.
        const StageFacts first = stage_facts(w, p, 0);
        Count least = fast.bytes();
        for (const Step& step : timeline(stage_inputs(w, p, first)))
            least = std::min(least, step.bytes.total());
        CHECK(persistent_state(first) <= least);
    }
}

TEST_CASE("a sweep's closed-form summary is the full estimate's, figure for figure",
          "[property][sweep]") {
    Generator g;
    cli::CsvRowWriter rows;
    for (int shape = 0; shape < 1200; ++shape) {
        const Architecture m = g.architecture();
        Settings s = g.settings(m);
        Parallelism& p = s.parallel;
        p.dp = g.pick<std::uint64_t>({1, 2, 4});
        p.tp = m.heads % 2 == 0 && m.key_value_heads() % 2 == 0 ? g.pick<std::uint64_t>({1, 2}) : 1;
        p.sequence_parallel = p.tp > 1 && g.between(0, 1) == 0;
        p.cp = s.seq % 2 == 0 ? g.pick<std::uint64_t>({1, 2}) : 1;
        p.pp = std::min<std::uint64_t>(m.layers, g.pick<std::uint64_t>({1, 2, 3, 4}));
        if (m.layers % p.pp != 0) p.first_stage_layers = m.layers - (p.pp - 1) * (m.layers / p.pp);
        p.zero = p.dp > 1 ? static_cast<unsigned>(g.between(0, 3)) : 0;
        if (m.any_moe() && p.dp % 2 == 0 &&
            m.every_kind([](const Architecture& v) { return !v.is_moe() || v.experts % 2 == 0; }))
            p.ep = 2;
        if (p.zero > 0 && g.between(0, 3) == 0) p.offload = Offload::optimizer;
        p.microbatches = g.pick<std::uint64_t>({0, 1, 2, 7});
        s.framework.grad_buffer = g.pick({GradBuffer::lazy, GradBuffer::persistent});
        s.framework.optimizer =
            g.pick({OptimizerImpl::fused, OptimizerImpl::foreach, OptimizerImpl::for_loop});
        CAPTURE(shape, m.layers, p.tp, p.dp, p.cp, p.pp, p.first_stage_layers, p.zero, p.ep,
                p.microbatches);
        const Estimator estimator(m);
        Summary full, fast;
        try {
            const Report r = estimator.estimate(s);
            full = summary(r);
            for (const RankReport& rank : r.ranks) {  // the closed form's peak, the timeline's
                CHECK(rank.peak_step().bytes.total() == rank.timeline()[rank.peak()].bytes.total());
                CHECK(rank.peak_step().name() == rank.timeline()[rank.peak()].name());
            }
        } catch (const error& e) {  // an invalid layout: the summary refuses it with the same words
            CHECK_THROWS_WITH(estimator.summary(s), e.what());
            continue;
        }
        fast = estimator.summary(s);
        CHECK(fast.parameters == full.parameters);
        CHECK(fast.state.total() == full.state.total());
        CHECK(fast.activations == full.activations);
        CHECK(fast.kept_activations == full.kept_activations);
        CHECK(fast.peak.bytes.total() == full.peak.bytes.total());
        CHECK(fast.peak.name() == full.peak.name());
        CHECK(fast.peak_stage == full.peak_stage);
        CHECK(fast.compute.step == full.compute.step);
        CHECK(fast.compute.recompute == full.compute.recompute);
        std::string row;
        rows.append(row, m.name, fast);  // after other shapes' rows: what it remembers never leaks
        CHECK(cli::csv_row(estimator.estimate(s)) == row);
        // Every recomputation mode from one table: each as its own estimate.
        const std::vector<Recompute> modes = {Recompute::full, Recompute::none,
                                              Recompute::selective};
        const std::vector<Summary> each = estimator.summaries(s, modes);
        REQUIRE(each.size() == modes.size());
        for (std::size_t i = 0; i < modes.size(); ++i) {
            Settings alone = s;
            alone.recompute = modes[i];
            const Summary expected = summary(estimator.estimate(alone));
            CHECK(each[i].settings.recompute == modes[i]);
            CHECK(each[i].kept_activations == expected.kept_activations);
            CHECK(each[i].peak.bytes.total() == expected.peak.bytes.total());
            CHECK(each[i].peak.name() == expected.peak.name());
            CHECK(each[i].compute.recompute == expected.compute.recompute);
        }
    }
}

TEST_CASE("a timeline's steps are step_at's, one by one, however its linear runs are made",
          "[property][fast]") {
    Generator g;
    for (int shape = 0; shape < 800; ++shape) {
        Architecture m = g.architecture();
        if (shape % 2 == 0)
            m = g.with_kinds(m);  // layers of several kinds: runs break at each change
        Settings s = g.settings(m);
        Parallelism& p = s.parallel;
        p.pp = std::min<std::uint64_t>(m.layers, g.pick<std::uint64_t>({1, 2, 3}));
        if (m.layers % p.pp != 0) p.first_stage_layers = m.layers - (p.pp - 1) * (m.layers / p.pp);
        p.dp = g.pick<std::uint64_t>({1, 2});
        p.zero = p.dp > 1 ? static_cast<unsigned>(g.between(0, 3)) : 0;
        p.microbatches = g.pick<std::uint64_t>({0, 1, 4});
        if (p.pp > 1 && p.first_stage_layers == 0 && m.layers % (2 * p.pp) == 0 &&
            g.between(0, 1) == 0) {
            p.vpp = 2, p.microbatches = 2 * p.pp;  // interleaved: layer numbers jump between chunks
        }
        s.framework.grad_buffer = g.pick({GradBuffer::lazy, GradBuffer::persistent});
        CAPTURE(shape, m.layers, p.pp, p.vpp, p.first_stage_layers, p.zero, p.microbatches);
        const Report r = estimate(m, s);
        const ActivationTables t = activation_tables(
            m, s.seq, s.micro_batch, r.settings.recipe.activations, s.activations, s.framework);
        const Workload w = make_workload(m, r.settings.recipe, s.seq, s.micro_batch, s.recompute,
                                         parameter_splits(*r.parameters, m.vocab), t, s.framework);
        for (std::uint64_t stage = 0; stage < p.pp; ++stage) {
            const TimelineInputs in = stage_inputs(w, p, stage_facts(w, p, stage));
            std::vector<Step> expected;  // the order timeline() promises, every step made alone
            for (std::uint64_t mb = 1; mb <= shown_microbatches(in); ++mb) {
                for (std::uint64_t i = 1; i <= in.layers; ++i)
                    expected.push_back(step_at(in, Phase::forward, i, mb));
                if (in.loss) expected.push_back(step_at(in, Phase::loss, 0, mb));
                for (std::uint64_t i = in.layers; i >= 1; --i)
                    expected.push_back(step_at(in, Phase::backward, i, mb));
            }
            expected.push_back(step_at(in, Phase::optimizer, 0));
            const std::vector<Step> built = timeline(in);
            REQUIRE(built.size() == expected.size());
            // The peak found as the steps are made (ends of linear runs only) is the scan's.
            const TimelineWithPeak with_peak = timeline_with_peak(in);
            CHECK(with_peak.peak == peak_index(built));
            REQUIRE(with_peak.steps.size() == built.size());
            CHECK(with_peak.steps[with_peak.peak].name() == built[peak_index(built)].name());
            for (std::size_t k = 0; k < built.size(); ++k) {
                CAPTURE(stage, k, expected[k].name());
                CHECK(built[k].name() == expected[k].name());
                Breakdown made = built[k].bytes;
                made.each(expected[k].bytes,
                          [](Count& mine, Count theirs) { CHECK(mine == theirs); });
            }
        }
    }
}

TEST_CASE("JSON round-trips: read back, every number is identical", "[property]") {
    Generator g;
    for (int shape = 0; shape < 400; ++shape) {
        const Architecture m = g.architecture();
        const Settings s = g.settings(m);
        const Report r = estimate(m, s);
        const nlohmann::json j = nlohmann::json::parse(cli::report_json(r, cli::View{}).dump());
        CAPTURE(shape);
        CHECK(j["parameters"]["total"].get<std::uint64_t>() == r.parameter_count.value());
        CHECK(j["state"]["bytes"].get<std::uint64_t>() == r.state.total().value());
        CHECK(j["activations"]["kept_bytes"].get<std::uint64_t>() == r.kept_activations.value());
        CHECK(j["peak"]["bytes"].get<std::uint64_t>() == r.peak_step().bytes.total().value());
        REQUIRE(j["timeline"].size() == r.timeline().size());
        for (std::size_t i = 0; i < r.timeline().size(); ++i)
            CHECK(j["timeline"][i]["bytes"].get<std::uint64_t>() ==
                  r.timeline()[i].bytes.total().value());
        CHECK(j["compute"]["step_flops"].get<double>() ==
              r.compute.step);  // doubles print exactly too
    }
}

TEST_CASE("a CSV row is what one format string gives, FLOPs past 2^64 included",
          "[property][csv]") {
    Generator g;
    for (int shape = 0; shape < 600; ++shape) {
        Architecture m = g.architecture();
        Settings s = g.settings(m);
        if (shape % 50 == 0)
            m.hidden = 65536, m.heads = 512, m.ffn = 262144, m.layers = 200, m.head_dim = 0,
            m.kv_heads = 8;
        if (shape % 50 == 0 && m.position != Position::learned)
            s.seq = 1000000;  // FLOPs far past 2^64
        s.parallel.dp = g.pick<std::uint64_t>({1, 8}), s.parallel.zero = s.parallel.dp > 1 ? 2 : 0;
        s.parallel.microbatches = g.pick<std::uint64_t>({0, 3});
        CAPTURE(shape);
        const Report r = estimate(m, s);
        const Parallelism& p = r.settings.parallel;
        const std::string expected = fmt::format(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{:.0f},{:.0f},{},{},{},{},{},{},{},{},{},{},{},"
            "{},{},{},{},,,\n",  // no device: the verdict's three cells empty
            cli::csv_field(m.name), s.seq, s.micro_batch, recompute_name(s.recompute),
            s.recipe.name, activation_model_name(s.activations),
            attention_name(s.framework.attention), r.parameter_count.value(),
            r.state.total().value(), r.activations.value(), r.kept_activations.value(),
            r.peak_step().bytes.total().value(), r.peak_step().name(), r.compute.step,
            r.compute.recompute, p.dp, p.tp, p.pp, p.cp, p.ep, p.zero, p.sequence_parallel,
            p.steps_per_batch(), r.busiest().stage, r.peak_step().microbatch,
            grad_buffer_name(s.framework.grad_buffer), p.first_stage_layers, p.last_stage_layers,
            training_name(r.settings.tuning.mode),
            p.recompute_layers ? std::to_string(*p.recompute_layers) : "");
        CHECK(cli::csv_row(r) == expected);
    }
}

TEST_CASE("ten-million-token sequences and ten-trillion-parameter models are in range",
          "[property]") {
    Architecture llama;
    llama.name = "llama-7b", llama.hidden = 4096, llama.layers = 32, llama.heads = 32,
    llama.ffn = 11008, llama.vocab = 32000;
    for (auto model : {ActivationModel::korthikanti, ActivationModel::architecture})
        for (auto mode : {Recompute::none, Recompute::selective, Recompute::full}) {
            Settings s;
            s.seq = 10000000, s.recompute = mode, s.activations = model;
            CHECK_NOTHROW(estimate(llama, s));
        }
    Architecture huge;  // 12 h^2 L = 10.3 trillion parameters
    huge.name = "huge", huge.hidden = 65536, huge.layers = 200, huge.heads = 512,
    huge.ffn = 4 * 65536, huge.vocab = 256000;
    huge.mlp = Mlp::plain;
    Settings s;
    s.seq = 8192, s.recompute = Recompute::full;
    const Report r = estimate(huge, s);
    CHECK(r.parameter_count.value() > 10000000000000ULL);
    s.parallel.dp = 4096, s.parallel.zero = 3;
    CHECK_NOTHROW(estimate(huge, s));
}
