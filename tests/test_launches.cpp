#include <catch2/catch.hpp>

#include <cmath>

#include <nlohmann/json.hpp>

#include "fixtures.hpp"
#include "memcalc/plan.hpp"
#include "model_file.hpp"
#include "run_program.hpp"

using namespace memcalc;

namespace {
double fwd_of(LaunchOp op) { return launches_of(op).forward; }
double bwd_of(LaunchOp op) { return launches_of(op).backward; }

LayerLaunches launches_of_layer(const Architecture& m, Recompute mode, Attention attention) {
    const LayerActivations layer =
        architecture_layer(m, 512, 1, Settings{}.recipe.precision(), attention);
    return layer_launches(layer, mode, parameter_table(m), 0);
}

/// Rows a layer saves that its recomputation under `mode` rebuilds (each through the checkpoint's
/// hooks).
double rows_rebuilt(const Architecture& m, Recompute mode, Attention attention) {
    const LayerActivations layer =
        architecture_layer(m, 512, 1, Settings{}.recipe.precision(), attention);
    double n = 0;
    for (const SavedTensor& r : layer.rows)
        if (r.kept(Recompute::none) && (checkpoints_layer(mode) ? !r.layer_input : !r.kept(mode)))
            ++n;
    return n;
}
}  // namespace

TEST_CASE(
    "a layer's launches: its blocks' ops by the table, its linears' products from its "
    "parameters",
    "[launches]") {
    // GPT-2's layer: two LayerNorms, eager attention (its heads merged), GELU, two residual adds;
    // six biased linears (q, k, v, o, up, down), the q/k/v input's gradients summed.
    const LayerLaunches gpt =
        launches_of_layer(fixtures::gpt2_small(), Recompute::none, Attention::eager);
    CHECK(gpt.matmuls.forward == 6);
    CHECK(gpt.matmuls.backward == 12);
    CHECK(gpt.other.forward == 2 * fwd_of(LaunchOp::layer_norm) + fwd_of(LaunchOp::eager_core) +
                                   fwd_of(LaunchOp::merge_heads) + 1 +
                                   2 * fwd_of(LaunchOp::residual_add));
    CHECK(gpt.other.backward ==
          2 * bwd_of(LaunchOp::layer_norm) + bwd_of(LaunchOp::eager_core) +
              bwd_of(LaunchOp::merge_heads) + 1 + 2 * bwd_of(LaunchOp::residual_add) +
              2 * bwd_of(LaunchOp::gradient_sum) + 6 * bwd_of(LaunchOp::bias_gradient));
    // Mistral's: RMSNorms in bf16 (their casts), rotary on q and k, k and v repeated for eager
    // attention (k's transposed gradient copied), softmax in fp32, SwiGLU; seven bias-free
    // linears, gate's and up's input gradients summed too.
    const Architecture mistral = fixtures::mistral_7b();
    REQUIRE(mistral.softmax_fp32);
    const LayerLaunches m = launches_of_layer(mistral, Recompute::none, Attention::eager);
    CHECK(m.matmuls.forward == 7);
    CHECK(m.matmuls.backward == 14);
    const double norms = 2 * (fwd_of(LaunchOp::rmsnorm) + fwd_of(LaunchOp::rmsnorm_casts));
    CHECK(m.other.forward == norms + 2 * fwd_of(LaunchOp::rotary) +
                                 2 * fwd_of(LaunchOp::repeat_kv) + fwd_of(LaunchOp::eager_core) +
                                 fwd_of(LaunchOp::softmax_casts) + fwd_of(LaunchOp::merge_heads) +
                                 1 + fwd_of(LaunchOp::gated_product) +
                                 2 * fwd_of(LaunchOp::residual_add));
    // A fused kernel: one each way in place of the eager core, its casts, and the repeats of k
    // and v (it takes grouped heads as they are) with k's copy.
    const LayerLaunches flash = launches_of_layer(mistral, Recompute::none, Attention::flash);
    CHECK(flash.matmuls.forward == m.matmuls.forward);
    CHECK(m.other.forward - flash.other.forward ==
          fwd_of(LaunchOp::eager_core) + fwd_of(LaunchOp::softmax_casts) +
              2 * fwd_of(LaunchOp::repeat_kv) - fwd_of(LaunchOp::flash_core));
    CHECK(m.other.backward - flash.other.backward ==
          bwd_of(LaunchOp::eager_core) + bwd_of(LaunchOp::softmax_casts) +
              2 * bwd_of(LaunchOp::repeat_kv) + bwd_of(LaunchOp::gradient_copy) -
              bwd_of(LaunchOp::flash_core));
}

TEST_CASE(
    "recomputation reruns forward kernels: every one under full, the core attention's under "
    "selective",
    "[launches]") {
    for (const Architecture& m : {fixtures::gpt2_small(), fixtures::mistral_7b()}) {
        CAPTURE(m.name);
        const LayerLaunches none = launches_of_layer(m, Recompute::none, Attention::eager),
                            full = launches_of_layer(m, Recompute::full, Attention::eager),
                            selective =
                                launches_of_layer(m, Recompute::selective, Attention::eager);
        CHECK(none.rerun_matmuls + none.rerun_other == 0);
        CHECK(full.rerun_matmuls == full.matmuls.forward);
        CHECK(full.rerun_other ==
              full.other.forward +
                  checkpoint_hook_calls * rows_rebuilt(m, Recompute::full, Attention::eager));
        // Selective checkpoints the core attention alone: no product reruns, fewer kernels.
        CHECK(selective.rerun_matmuls == 0);
        const double core =
            selective.rerun_other -
            checkpoint_hook_calls * rows_rebuilt(m, Recompute::selective, Attention::eager);
        CHECK(core >= fwd_of(LaunchOp::eager_core));
        CHECK(core < full.other.forward);
    }
}

TEST_CASE(
    "the optimiser's launches: a loop's per tensor, foreach's per multi-tensor launch, a "
    "fused kernel's once",
    "[launches]") {
    const Architecture m = fixtures::mistral_7b();
    const Settings s;
    const auto params = parameter_splits(parameter_table(m), m.vocab);
    const ActivationTables tables =
        activation_tables(m, 1024, 1, s.recipe.precision(), s.activations, s.framework, {}, {});
    const auto launched = [&](OptimizerImpl impl, Parallelism p = {}) {
        Framework f = s.framework;
        f.optimizer = impl;
        Workload w = make_workload(m, s.recipe, 1024, 1, Recompute::none, params, tables, f);
        count_launches(w, tables);
        return optimizer_launches(w, p, stage_facts(w, p, 0));
    };
    double tensors = 0;
    for (const ParamRow& r : parameter_table(m).rows)
        tensors += r.group == Group::layer ? static_cast<double>(m.layers) : 1;
    REQUIRE(s.recipe.master);  // each step ends casting its master copy back: one op more
    const double ops = static_cast<double>(s.recipe.optimizer.loop_launches) + 1;
    CHECK(launched(OptimizerImpl::for_loop) == tensors * ops);
    const double elements = static_cast<double>(parameter_table(m).total().value());
    const double chunks = std::max(std::ceil(tensors / 36), std::ceil(elements / (320 * 65536.0)));
    CHECK(launched(OptimizerImpl::foreach) == ops * chunks);
    CHECK(launched(OptimizerImpl::fused) == chunks);
    Parallelism stages;
    stages.pp = 4, stages.microbatches = 4;  // a quarter of the layers a stage
    CHECK(launched(OptimizerImpl::for_loop, stages) < launched(OptimizerImpl::for_loop) / 3);
    stages.offload = Offload::optimizer;  // the host steps it
    CHECK(launched(OptimizerImpl::for_loop, stages) == 0);
}

TEST_CASE("the host's dispatch bounds a step: the launches' time past their kernels', by kind",
          "[launches][plan][time]") {
    Gpu g;
    g.name = "round", g.memory = 80000000000ULL, g.peak_bf16_flops = 100'000'000'000'000ULL;
    g.gpus_per_node = 8, g.intra_node_bandwidth = g.inter_node_bandwidth = 1'000'000'000ULL;
    g.memory_bandwidth = 1'000'000'000'000ULL, g.launch_seconds = 1e-5;
    DeviceWork work;
    work.flops = 7e12;              // 0.1 s of products at 0.7 of the peak
    work.elementwise_bytes = 5e10;  // 0.05 s at 1 TB/s
    work.matmul_launches = 5000, work.other_launches = 2000, work.optimizer_launches = 0;
    auto t = step_time(g, {}, work, Traffic{});
    REQUIRE(t);
    CHECK(t->dispatch == 0);      // 0.05 s and 0.02 s of launching: the device is the slower
    work.other_launches = 20000;  // 0.2 s of launching beside 0.05 s of element-wise work
    t = step_time(g, {}, work, Traffic{});
    CHECK(t->dispatch == Approx(0.15));
    CHECK(t->seconds() == Approx(0.1 + 0.05 + 0.15));
    work.matmul_launches = 30000;    // and the products' 0.3 s past their 0.1 s
    work.optimizer_launches = 1000;  // 0.01 s with no optimiser work timed
    t = step_time(g, {}, work, Traffic{});
    CHECK(t->dispatch == Approx(0.15 + 0.2 + 0.01));
}

TEST_CASE("plan: a small model's step is mostly its launches, a large one's none", "[launches]") {
    const auto step = [](const std::string& args) {
        const auto r = testing::memcalc("plan " + args + " --gpu h100-sxm --format json");
        REQUIRE(r.status == 0);
        return nlohmann::json::parse(r.out)["layouts"][0];
    };
    const auto small = step(
        "--preset gpt2 --gpus 1 --seq 1024 --global-batch 1 --activations "
        "architecture --optimizer-impl for-loop");
    CHECK(small["dispatch_seconds"].get<double>() >
          small["compute_seconds"].get<double>() + small["optimizer_seconds"].get<double>());
    const auto large = step(
        "--preset llama-7b --gpus 8 --seq 4096 --global-batch 64 --activations "
        "architecture");
    CHECK(large["dispatch_seconds"].get<double>() == 0);
    CHECK(large["compute_seconds"].get<double>() > 1);
}

TEST_CASE(
    "transformers' expert loop launches each hit expert's kernels, a grouped GEMM the experts' "
    "once",
    "[launches]") {
    // Mixtral's block: each expert its three products, its activation and product, and the loop's
    // own ops; the routing weights' gradients summed once an expert after the first.
    const auto layer = [](std::uint64_t experts, Runtime runtime) {
        Architecture m = fixtures::mixtral();
        m.experts = experts;
        const LayerActivations l =
            architecture_layer(m, 512, 1, Settings{}.recipe.precision(), Attention::flash, runtime);
        return layer_launches(l, Recompute::none, parameter_table(m), 0);
    };
    const Activation silu = fixtures::mixtral().activation;
    const Launches per_expert =
        activation_function(silu).launches + launches_of(LaunchOp::gated_product) +
        launches_of(LaunchOp::gradient_sum) * 2 + launches_of(LaunchOp::expert_loop);
    for (const auto& [from, to] : {std::pair{4, 8}, std::pair{8, 32}}) {
        INFO(from << " to " << to << " experts");
        const LayerLaunches few = layer(from, {}), many = layer(to, {});
        const double more = to - from;
        CHECK(many.matmuls.forward - few.matmuls.forward == 3 * more);
        CHECK(many.matmuls.backward - few.matmuls.backward == 6 * more);
        CHECK(many.other.forward - few.other.forward == per_expert.forward * more);
        CHECK(many.other.backward - few.other.backward == per_expert.backward * more);
        // One grouped GEMM: the experts' count changes no launch.
        const Runtime grouped(Platform::cuda, TorchVersion::v2_2, false);
        CHECK(layer(to, grouped).matmuls.total() == layer(from, grouped).matmuls.total());
        CHECK(layer(to, grouped).other.total() == layer(from, grouped).other.total());
    }
    // gpt-oss's loop over stacked weights: each expert its indexing of them beside.
    const auto stacked = [](std::uint64_t experts) {
        Architecture m = fixtures::mixtral();
        m.experts = experts, m.stacked_experts = true;
        const LayerActivations l =
            architecture_layer(m, 512, 1, Settings{}.recipe.precision(), Attention::flash);
        return layer_launches(l, Recompute::none, parameter_table(m), 0).other;
    };
    CHECK((stacked(8) + stacked(4) * -1).forward ==
          4 * (per_expert + launches_of(LaunchOp::stacked_expert_loop)).forward);
    // A micro-batch of 512 tokens x 2 reaches at most 1,024 experts: more run no more kernels.
    CHECK(layer(2048, {}).other.total() == layer(1024, {}).other.total());
    // Off CUDA, one_hot checks its indices first: two kernels more.
    CHECK(layer(8, Platform::cpu).other.forward - layer(8, {}).other.forward ==
          kernels_of(Platform::cpu).one_hot_launches.forward -
              kernels_of(Platform::cuda).one_hot_launches.forward);
}

TEST_CASE(
    "latent attention launches its splits, rotary, k's broadcast and concatenations, "
    "DeepSeek-V3.2 its indexer",
    "[launches]") {
    const auto launches = [](const Architecture& m, Module module) {
        const LayerActivations l =
            architecture_layer(m, 256, 1, Settings{}.recipe.precision(), Attention::eager);
        return l.launches[static_cast<std::size_t>(module)];
    };
    // The up projections' part (Megatron-LM's mla_up_proj): q and kv_b_proj's output split, rotary
    // on q's and k's rope parts, k's expanded to every head, q and k concatenated.
    const Launches up = launches_of(LaunchOp::split) * 2 + launches_of(LaunchOp::rotary) * 2 +
                        launches_of(LaunchOp::expand_gradient) + launches_of(LaunchOp::concat) * 2;
    for (const char* name : {"deepseek-v2-lite", "deepseek-v3"}) {
        INFO(name);
        const Architecture m = cli::load_preset(name).architecture;
        CHECK(launches(m, Module::mla_up_proj).forward == up.forward);
        CHECK(launches(m, Module::mla_up_proj).backward == up.backward);
    }
    const Architecture v3 = cli::load_preset("deepseek-v3").architecture;
    const Architecture v32 = cli::load_preset("deepseek-v3.2-exp").architecture;
    REQUIRE(v32.mla.indexed());
    const Launches extra = launches(v32, Module::attention) + launches(v3, Module::attention) * -1;
    CHECK(extra.forward == launches_of(LaunchOp::sparse_indexer).forward);
    CHECK(extra.backward == 0);
    // gpt-oss's sinks: a column joined to eager attention's scores and the row's max taken off.
    Architecture sinks = fixtures::mistral_7b();
    const Launches plain = launches(sinks, Module::core_attn) + launches(sinks, Module::attention);
    sinks.attention_sinks = true;
    const Launches with = launches(sinks, Module::core_attn) + launches(sinks, Module::attention);
    CHECK(with.forward - plain.forward == launches_of(LaunchOp::attention_sinks).forward);
    CHECK(with.backward - plain.backward == launches_of(LaunchOp::attention_sinks).backward);
}
