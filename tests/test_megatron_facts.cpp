// Megatron-LM's own code as program facts (its fused SwiGLU, its token dispatchers' permutation,
// the router's fp32 input copy) and multi-token prediction (--mtp-layers): each against a closed
// form of the rows the source keeps, on two shapes.
#include <catch2/catch.hpp>

#include <string>

#include "memcalc/architecture_activations.hpp"
#include "memcalc/estimate.hpp"
#include "memcalc/flops.hpp"
#include "memcalc/outside.hpp"
#include "memcalc/workload.hpp"
#include "run_program.hpp"
#include <nlohmann/json.hpp>

using namespace memcalc;

namespace {
/// A DeepSeek-like model: a dense first layer, then MoE layers of E experts (k each) beside a
/// shared expert; one dense-only variant.
Architecture moe_model(std::uint64_t h, std::uint64_t f, std::uint64_t E, std::uint64_t k) {
    Architecture m;
    m.name = "moe", m.hidden = h, m.layers = 4, m.heads = 4, m.ffn = f, m.vocab = 500,
    m.max_positions = 4096, m.experts = E, m.experts_per_token = k, m.shared_ffn = 2 * f;
    m.layer_kinds = {{"dense", 4 * f, std::uint64_t{0}, std::nullopt},
                     {"moe", std::nullopt, std::nullopt, std::nullopt}};
    m.layer_pattern = {{0, 1}, {1, 3}};
    return m;
}
const Architecture small = moe_model(64, 32, 8, 2), wider = moe_model(96, 48, 16, 4);

Count layer_total(const Architecture& m, std::size_t kind, std::uint64_t s, std::uint64_t b) {
    return architecture_layer(m.kind_view(kind), s, b, DType::bf16, Attention::flash).total();
}
}  // namespace

TEST_CASE("a fused SwiGLU keeps gate and up alone: one s b f tensor less in every MLP",
          "[megatron][architecture]") {
    const Architecture m = GENERATE(small, wider);
    const std::uint64_t s = GENERATE(16, 100), b = GENERATE(1, 2);
    CAPTURE(m.hidden, s, b);
    Architecture fused = m;
    fused.fused_glu = true;
    const std::uint64_t sb = s * b, dense_f = 4 * m.ffn, k = m.experts_per_token;
    CHECK(layer_total(m, 0, s, b).value() - layer_total(fused, 0, s, b).value() ==
          2 * sb * dense_f);
    // The routed experts' SiLU output over s b k slots, and the shared expert's.
    CHECK(layer_total(m, 1, s, b).value() - layer_total(fused, 1, s, b).value() ==
          2 * sb * k * m.ffn + 2 * sb * m.shared_ffn);
}

TEST_CASE("Megatron's permuted dispatch keeps neither the expert outputs nor their weighted copy",
          "[megatron][architecture]") {
    const Architecture m = GENERATE(small, wider);
    const bool fused_glu = GENERATE(false, true);
    const std::uint64_t s = GENERATE(16, 100), b = GENERATE(1, 2);
    CAPTURE(m.hidden, fused_glu, s, b);
    Architecture routed = m, permuted = m;
    routed.fused_glu = permuted.fused_glu = fused_glu;
    permuted.expert_dispatch = ExpertDispatch::permuted;
    const std::uint64_t slots = s * b * m.experts_per_token;
    // transformers' loop: two int64 indices a slot, the expert outputs and their weighted copy
    // (2 s b k h each), the routing weights in bf16. Megatron's: one int64 index a slot, the
    // weights in fp32 inside the activation, and without the fused kernel the activation's output
    // that the product with the weights keeps.
    const std::uint64_t loop = 16 * slots + 2 * 2 * slots * m.hidden + 2 * slots;
    const std::uint64_t megatron = 8 * slots + 4 * slots + (fused_glu ? 0 : 2 * slots * m.ffn);
    CHECK(layer_total(routed, 1, s, b).value() - layer_total(permuted, 1, s, b).value() ==
          loop - megatron);
    CHECK(layer_total(routed, 0, s, b) == layer_total(permuted, 0, s, b));  // the dense layer
}

TEST_CASE("a router on an fp32 copy of its input keeps that copy", "[megatron][architecture]") {
    const Architecture m = GENERATE(small, wider);
    const std::uint64_t s = GENERATE(16, 100), b = GENERATE(1, 2);
    Architecture copied = m;
    copied.router_input_fp32 = true;
    CHECK(layer_total(copied, 1, s, b).value() - layer_total(m, 1, s, b).value() ==
          4 * s * b * m.hidden);
    CHECK(layer_total(copied, 0, s, b) == layer_total(m, 0, s, b));
}

TEST_CASE(
    "multi-token prediction's parameters: a layer of the last kind, two norms, eh_proj and a "
    "final norm, on the head's side",
    "[megatron][mtp][params]") {
    const Architecture m = GENERATE(small, wider);
    const std::uint64_t n = GENERATE(1, 2);
    Architecture with = m;
    with.mtp_layers = n;
    const ParameterTable base = parameter_table(m), mtp = parameter_table(with);
    const std::uint64_t h = m.hidden;
    const std::uint64_t module = base.per_layer(1).value() + 3 * h + 2 * h * h;
    CHECK(mtp.total().value() - base.total().value() == n * module);
    Count flagged;
    for (const ParamRow& r : mtp.rows)
        if (r.mtp) {
            CHECK(r.group == Group::head);
            flagged += r.count;
        }
    CHECK(flagged.value() == n * module);
    CHECK(mtp.per_layer(1) == base.per_layer(1));  // the model's own layers are as they were
}

TEST_CASE(
    "multi-token prediction's state sits on the last stage: its experts over expert "
    "parallelism, an embedding copy where the first stage is another",
    "[megatron][mtp][parallel]") {
    const Architecture m = GENERATE(small, wider);
    Architecture with = m;
    with.mtp_layers = 1;
    Settings s;
    s.seq = 64, s.activations = ActivationModel::architecture;
    s.framework.attention = Attention::flash;
    s.parallel.pp = 2, s.parallel.ep = 2, s.parallel.dp = 2;
    const Report base = estimate(m, s), mtp = estimate(with, s);
    const ParameterTable t = parameter_table(with);
    std::uint64_t dense = 0, experts = 0;
    for (const ParamRow& r : t.rows)
        if (r.mtp) (r.expert ? experts : dense) += r.count.value();
    const std::uint64_t embedding = m.vocab * m.hidden;  // untied: the input side's copy
    CHECK(mtp.ranks[0].parameters == base.ranks[0].parameters);
    CHECK(mtp.ranks[1].parameters.value() - base.ranks[1].parameters.value() ==
          dense + experts / 2 + embedding);
}

TEST_CASE(
    "multi-token prediction saves, from the loss step to its backward, its inputs' rows, a "
    "layer's and the head's again",
    "[megatron][mtp][architecture]") {
    const Architecture m = GENERATE(small, wider);
    const std::uint64_t s = GENERATE(16, 100), b = GENERATE(1, 2), n = GENERATE(1, 2);
    const LossKernel loss = GENERATE(LossKernel::fp32, LossKernel::fused);
    CAPTURE(m.hidden, s, b, n, int(loss));
    Architecture with = m;
    with.mtp_layers = n, with.rmsnorm_kernel = RmsnormKernel::fused;
    Framework f;
    f.attention = Attention::flash, f.loss = loss;
    const Precision p = DType::bf16;
    const ActivationTables base = activation_tables(m, s, b, p, ActivationModel::architecture, f);
    const ActivationTables mtp = activation_tables(with, s, b, p, ActivationModel::architecture, f);
    const std::uint64_t sb = s * b, sbh = sb * m.hidden;
    // The rolled ids (8 sb); the embedding's fused norm (its input, 1/rms) and the hidden states'
    // (1/rms: its input is the head's); eh_proj's input, 2h wide.
    const std::uint64_t inputs = 8 * sb + (2 * sbh + 4 * sb) + 4 * sb + 2 * 2 * sbh;
    Architecture fused_norms = m;
    fused_norms.rmsnorm_kernel = RmsnormKernel::fused;
    const std::uint64_t layer =
        architecture_layer(fused_norms.kind_view(1), s, b, p, Attention::flash)
            .kept(Recompute::none)
            .value();
    const std::uint64_t head = saved_bytes(head_saved(fused_norms, s, b, p, {}, loss)).value();
    const std::uint64_t logits = loss == LossKernel::fused ? 2 * sb * m.vocab : 0;
    CHECK(saved_bytes(mtp.head.rows).value() == head + n * (inputs + layer + head + logits));
    CHECK(saved_bytes(base.head.rows).value() ==
          saved_bytes(head_saved(m, s, b, p, {}, loss)).value());
}

TEST_CASE("multi-token prediction's FLOPs: eh_proj, a layer of the last kind and the logits again",
          "[megatron][mtp][flops]") {
    const Architecture m = GENERATE(small, wider);
    const std::uint64_t n = GENERATE(1, 3);
    Architecture with = m;
    with.mtp_layers = n;
    const std::uint64_t s = 128, b = 2;
    const ComputeCost base = compute_cost(m, s, b, Recompute::full),
                      mtp = compute_cost(with, s, b, Recompute::full);
    const double T = s * b, h = static_cast<double>(m.hidden);
    const double module = 2 * T * 2 * h * h + base.kind_forward[1] + base.head_forward;
    CHECK(mtp.step == Approx(base.step + 3 * n * module));
    CHECK(mtp.recompute == Approx(base.recompute));  // never recomputed
    CHECK(mtp.head_forward == Approx(base.head_forward + n * module));
}

TEST_CASE("multi-token prediction needs the architecture model and fewer modules than layers",
          "[megatron][mtp]") {
    Architecture with = small;
    with.mtp_layers = 1;
    Settings s;
    s.seq = 64;
    CHECK_THROWS_WITH(estimate(with, s), Catch::Contains("mtp_layers 1") &&
                                             Catch::Contains("--activations architecture"));
    with.mtp_layers = 5;
    CHECK_THROWS_WITH(validate(with), Catch::Contains("mtp_layers 5"));
}

TEST_CASE("the option --mtp-layers and the model-file key mtp_layers: one figure, bad values named",
          "[megatron][mtp][cli]") {
    const std::string file = std::string(MEMCALC_SOURCE_DIR) +
                             "/validation/published/models/megatron-moe-proxy-1024.json";
    const std::string run = " --seq 1024 --activations architecture --format json";
    const auto from_file = testing::memcalc("--model-file " + file + run);
    const auto off = testing::memcalc("--model-file " + file + run + " --mtp-layers 0");
    const auto two = testing::memcalc("--model-file " + file + run + " --mtp-layers 2");
    REQUIRE(from_file.status == 0);
    REQUIRE(off.status == 0);
    REQUIRE(two.status == 0);
    const auto peak = [](const testing::Run& r) {
        return nlohmann::json::parse(r.out)["peak"]["bytes"].get<std::uint64_t>();
    };
    CHECK(nlohmann::json::parse(from_file.out)["model"]["mtp_layers"] == 1);
    CHECK(nlohmann::json::parse(off.out)["model"]["mtp_layers"] == 0);
    CHECK(peak(off) < peak(from_file));
    CHECK(peak(from_file) < peak(two));
    using Case = std::pair<std::string, std::string>;
    const auto [args, message] = GENERATE(table<std::string, std::string>({
        Case{"--mtp-layers x", "--mtp-layers must be a positive integer (got 'x')"},
        Case{"--mtp-layers -1", "--mtp-layers must be a positive integer (got '-1')"},
    }));
    CAPTURE(args);
    const auto bad = testing::memcalc("--preset llama-7b --seq 512 " + args);
    CHECK(bad.status == 2);
    CHECK(bad.out.empty());
    CHECK(bad.err == "memcalc: " + message + "\n");
    const auto too_many = testing::memcalc("--preset llama-7b --seq 512 --mtp-layers 33");
    CHECK(too_many.status != 0);
    CHECK(too_many.out.empty());
    CHECK(too_many.err == "memcalc: mtp_layers 33 is more than the model's 32 layers\n");
}

namespace {
/// A layer of `m` under flash attention on `kernel`, sequence-first or not.
LayerActivations flash_layer(Architecture m, bool sequence_first, AttentionKernel kernel,
                             std::uint64_t s, std::uint64_t b) {
    m.sequence_first = sequence_first;
    return architecture_layer(m, s, b, DType::bf16, Attention::flash,
                              Runtime{Platform::cuda, TorchVersion::v2_2, true, kernel});
}
Count work_of(const LayerActivations& layer, const std::string& op, bool backward) {
    for (const Workspace& w : layer.work)
        if (std::string(w.op) == op && w.backward == backward) return w.bytes;
    return Count(0);
}
}  // namespace

TEST_CASE("a sequence-first program copies the output of a batch-first kernel where b > 1",
          "[megatron][architecture]") {
    Architecture m = GENERATE(small, wider);
    m.kv_heads = 2;  // grouped k and v: q's copy is wider than theirs
    const std::uint64_t s = GENERATE(16, 100), b = GENERATE(1, 2, 3);
    CAPTURE(m.hidden, s, b);
    const std::uint64_t d = m.head_size(), sbq = s * b * m.heads * d, sbkv = s * b * 2 * d;
    const LayerActivations plain = flash_layer(m, false, AttentionKernel::flash_attention_2, s, b);
    const LayerActivations fa2 = flash_layer(m, true, AttentionKernel::flash_attention_2, s, b);
    const LayerActivations cudnn = flash_layer(m, true, AttentionKernel::cudnn, s, b);
    // cuDNN writes sequence-first: nothing copied, the layer as a batch-first program's.
    CHECK(cudnn.total() == plain.total());
    CHECK(work_of(cudnn, "flash attention", false) == Count(0));
    // flash-attn: its own output and, at b > 1, the output projection's contiguous copy (2 B each).
    CHECK(fa2.total() == plain.total() + Count(b > 1 ? 2 * sbq : 0));
    CHECK(work_of(fa2, "flash attention", false) == Count(2 * sbq + 2 * 2 * sbkv));
    CHECK(work_of(fa2, "flash attention backward", true) ==
          work_of(plain, "flash attention backward", true) + Count(b > 1 ? 2 * sbq : 0));
}

TEST_CASE("Megatron's 7B at TP 4 on A100 and GB200: flash-attn's output copied, 1 GiB more",
          "[megatron][published]") {
    // validation/published: the same program's golden values are 1 GiB apart, H100 (cuDNN) below
    // A100 and GB200 (flash-attn); 32 layers x s b a d / tp x 2 B = 2^30 at s 8192, b 2.
    const auto run = [](const std::string& kernel) {
        const testing::Run r = testing::memcalc(
            "--model-file " + std::string(MEMCALC_SOURCE_DIR) +
            "/validation/published/models/megatron-gpt-7b-tp4.json --seq 8192 -b 2 --tp 4 --dp 2 "
            "--zero 1 --global-batch 8 --activations architecture --profile megatron --recipe "
            "mixed-adam-fp32-grads --gpu b200 --format json --attention-kernel " +
            kernel);
        REQUIRE(r.status == 0);
        return nlohmann::json::parse(r.out)["peak"]["bytes"].get<std::uint64_t>();
    };
    CHECK(run("flash-attention-2") - run("cudnn") == std::uint64_t{1} << 30);
}

TEST_CASE("CUBLAS_WORKSPACE_CONFIG as PyTorch reads it: :SIZE:COUNT pairs in KiB, summed",
          "[outside][cli]") {
    CHECK(cublas_workspace_config_bytes(":4096:8") == std::uint64_t{32} << 20);
    CHECK(cublas_workspace_config_bytes(":4096:2:16:8") == outside_rows::cublas_default.value());
    CHECK(cublas_workspace_config_bytes(":0:0") == std::uint64_t{0});
    for (const char* bad : {"", ":", "4096:8", ":4096", ":4096:8:", ":a:8", ":4096:8 ",
                            ":99999999999999999999:1", ":18014398509481984:1024"}) {
        CAPTURE(bad);
        CHECK_FALSE(cublas_workspace_config_bytes(bad));
    }
}

TEST_CASE("the option --cublas-workspace-config sizes each cuBLAS workspace on every GPU",
          "[outside][cli]") {
    const std::string gpu = GENERATE("a100-80gb", "h100-sxm", "b200");
    const std::string config = GENERATE(":4096:8", ":1024:3");
    CAPTURE(gpu, config);
    const auto workspace = [&](const std::string& extra) {
        const testing::Run r = testing::memcalc(
            "--preset llama-7b --seq 512 --format json "
            "--gpu " +
            gpu + extra);
        REQUIRE(r.status == 0);
        const nlohmann::json j = nlohmann::json::parse(r.out);
        for (const auto& row : j["peak"]["outside"])
            if (row["name"] == "cublas_workspace") return std::make_pair(row, j["settings"]);
        FAIL("no cublas_workspace row");
        return std::make_pair(nlohmann::json{}, nlohmann::json{});
    };
    const auto [row, settings] = workspace(" --cublas-workspace-config " + config);
    const std::uint64_t bytes = *cublas_workspace_config_bytes(config);
    CHECK(row["bytes"] == bytes);
    CHECK(row["low_bytes"] == bytes);
    CHECK(row["high_bytes"] == bytes);
    CHECK(row["count"] == 2);  // the forward's thread and autograd's
    CHECK(settings["cublas_workspace_bytes"] == bytes);
    CHECK(workspace("").second["cublas_workspace_bytes"].is_null());
    const testing::Run bad = testing::memcalc("--preset llama-7b --cublas-workspace-config 4096:8");
    CHECK(bad.status != 0);
    CHECK(bad.out.empty());
    CHECK(bad.err ==
          "memcalc: --cublas-workspace-config '4096:8': not ':SIZE:COUNT' pairs, SIZE "
          "in KiB (CUBLAS_WORKSPACE_CONFIG, e.g. :4096:8)\n");
}
