// --compare: Megatron-LM's and DeepSpeed's own formulas as their current code has them, to the
// byte. Megatron-LM: megatron/training/theoretical_memory_usage.py on main since PR #4687 (May
// 2026). DeepSpeed: estimate_zero2/zero3_model_states_mem_needs on master since PR #5099 (commit
// f4cb866).
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "fixtures.hpp"
#include "memcalc/compare.hpp"
#include "run_program.hpp"

using namespace memcalc;
using nlohmann::json;

namespace {
Report estimate_fp32_grads(const Architecture& m, std::uint64_t seq, Recompute mode,
                           const Parallelism& p) {
    Settings settings;
    settings.seq = seq, settings.recompute = mode, settings.parallel = p;
    settings.recipe = builtin_recipe("mixed-adam-fp32-grads");
    return estimate(m, settings);
}
json compare_of(const std::string& arguments) {
    const auto program = testing::memcalc(arguments + " --format json");
    REQUIRE(program.status == 0);
    return json::parse(program.out)["compare"];
}
}  // namespace

TEST_CASE("Megatron: Mixtral 8x7B at ep 8, to the byte of Megatron's own function",
          "[compare][megatron]") {
    const json m = compare_of(
        "--preset mixtral-8x7b --seq 4096 --dp 8 --ep 8 --zero 1 --recompute full "
        "--recipe mixed-adam-fp32-grads --compare megatron")["megatron"];
    // Per layer: attention 2 h^2 (1 + 8/32) = 41,943,040 (split by tp = 1); routed experts
    // 2 h f 8 x 1.5 = 1,409,286,144 (split by etp x ep = 8); norms 2 h = 8,192 and the router h x 8
    // = 32,768 (whole). On the shard: tp 32 x 41,943,040 + 2 x 4,096 x 32,000 (embedding and
    // output) = 1,604,321,280; replicated 32 x 40,960 + 4,096 (final norm) = 1,314,816; experts 32
    // x 1,409,286,144 / 8 = 5,637,144,576. Bytes: (1,604,321,280 + 1,314,816) x (6 + 12/8) +
    // 5,637,144,576 x (6 + 12/1), the expert-data-parallel group being 8 / (1 x 8 x 1) = 1 rank.
    CHECK(m["weight_and_optimizer_bytes"].get<std::uint64_t>() == 113510873088ULL);
    CHECK(m["tensor_parallel_parameters"].get<double>() == 1604321280.0);
    CHECK(m["replicated_parameters"].get<double>() == 1314816.0);
    CHECK(m["expert_parameters"].get<double>() == 5637144576.0);
    CHECK(m["expert_data_parallel_size"] == 1);
    CHECK(m["expert_bytes_per_parameter"].get<double>() == 18.0);
    // Without SP: (s b h (10 + 24) x 32 + 8 s b + s b h + (s b V + s b h) x 2) x 1.05 =
    // 19,494,425,395.2, a float Megatron only prints in MB: rounded to the nearest byte.
    CHECK(m["activation_bytes"].get<std::uint64_t>() == 19494425395ULL);
    CHECK(m["total_bytes"].get<std::uint64_t>() == 113510873088ULL + 19494425395ULL);
    CHECK_THAT(m["follows"].get<std::string>(), Catch::Contains("PR #4687"));
}

TEST_CASE("Megatron: a dense model with tp 2 and pp 2, by hand from the formula",
          "[compare][megatron]") {
    Architecture model = fixtures::llama_7b();
    model.hidden = 2048, model.layers = 16, model.heads = 16, model.kv_heads = 8, model.ffn = 5632;
    Parallelism p;
    p.dp = 4, p.tp = 2, p.pp = 2, p.zero = 1, p.sequence_parallel = true;
    const MegatronEstimate e =
        megatron_estimate(estimate_fp32_grads(model, 1024, Recompute::selective, p));
    // Attention 2 h^2 (1 + 8/16) = 12,582,912 and MLP 2 h f x 1.5 = 34,603,008 a layer, split by
    // tp; vocabulary 32,000 already a multiple of 128 x 2. The first stage: (16 x 47,185,920 / 2 +
    // 2,048 x 32,000) / 2 = 221,511,680; its norms (16 x 2 h + h) / 2 = 33,792, whole on both tp
    // ranks.
    CHECK(e.padded_vocab == 32000);
    CHECK(e.tensor_parallel_parameters == 221511680.0);
    CHECK(e.replicated_parameters == 33792.0);
    CHECK(e.expert_parameters == 0.0);
    CHECK(e.bytes_per_parameter == 6 + 12.0 / 4);
    CHECK(e.weight_and_optimizer_bytes() == 1993909248ULL);  // 221,545,472 x 9
    // SP + selective: s b h (18 + 4 f/h) = 2,097,152 x 29 a layer, x 16, + 8 s b pp + s b h pp,
    // x min(1, 2 micro-batches / 2 stages), no output layer on the first of 2 stages, / tp.
    CHECK(e.sequence_parallel_formula);
    CHECK(e.activation_bytes() == 488644608ULL);
    CHECK(e.total_bytes() == 1993909248ULL + 488644608ULL);
}

TEST_CASE("Megatron: experts split by tp x ep, their optimiser over dp x cp / ep",
          "[compare][megatron]") {
    Architecture model = fixtures::llama_7b();
    model.hidden = 1024, model.layers = 4, model.heads = 8, model.ffn = 2048, model.vocab = 1000;
    model.experts = 8, model.experts_per_token = 2, model.bias = Bias::all;
    Parallelism p;
    p.dp = 4, p.tp = 2, p.cp = 2, p.ep = 4, p.zero = 1;
    const MegatronEstimate e =
        megatron_estimate(estimate_fp32_grads(model, 2048, Recompute::full, p));
    // Vocabulary padded to 1,024 (a multiple of 128 x 2). tp-split: (4 x attention 2 h^2 x 2 +
    // embedding h x 1,024) / 2 + the output layer / 2 = 9,437,184. Whole: 4 x (norms 2 h + router
    // h x 8 + its bias 8) + final norm h = 42,016. Experts: 4 x 2 h f 8 x 1.5 / (2 x 4) =
    // 25,165,824.
    CHECK(e.padded_vocab == 1024);
    CHECK(e.tensor_parallel_parameters == 9437184.0);
    CHECK(e.replicated_parameters == 42016.0);
    CHECK(e.expert_parameters == 25165824.0);
    // World 4 x 2 x 1 x 2 = 16; the expert-data-parallel group 16 / (2 x 4 x 1) = 2 ranks.
    CHECK(e.expert_data_parallel == 2);
    CHECK(e.bytes_per_parameter == 9.0);
    CHECK(e.expert_bytes_per_parameter == 12.0);
    CHECK(e.weight_and_optimizer_bytes() == 387302688ULL);  // 9,479,200 x 9 + 25,165,824 x 12
}

TEST_CASE("DeepSpeed ZeRO-2: 2P + 18P/N, Llama 2 70B on 64 GPUs", "[compare][deepspeed]") {
    const json d = compare_of(
        "--preset llama-2-70b --seq 4096 --dp 64 --zero 2 --compare deepspeed")["deepspeed"];
    // P = 68,976,648,192: 2P + int(18P / 64) = 137,953,296,384 + 19,399,682,304.
    CHECK(d["gpu_bytes"].get<std::uint64_t>() == 157352978688ULL);
    CHECK(d["cpu_bytes"].get<std::uint64_t>() ==
          68976648192ULL * 4 * 8 * 3 / 2);  // P x 4 x 8 GPUs x 1.5
    CHECK(d["zero_stage"] == 2);
    CHECK_THAT(d["follows"].get<std::string>(), Catch::Contains("PR #5099"));
}

TEST_CASE("DeepSpeed ZeRO-2 truncates as Python's int() does; offload keeps 2P on the GPU",
          "[compare][deepspeed]") {
    const std::uint64_t P = 6738415616ULL;  // llama-7b
    // 18P / 5 = 24,258,296,217.6: int() gives ...217 where rounding would give ...218.
    const json five =
        compare_of("--preset llama-7b --seq 2048 --dp 5 --zero 2 --compare deepspeed")["deepspeed"];
    CHECK(five["gpu_bytes"].get<std::uint64_t>() == 2 * P + 24258296217ULL);
    CHECK(five["cpu_bytes"].get<std::uint64_t>() == P * 4 * 5 * 3 / 2);  // 5 GPUs on the one node
    const json offload = compare_of(
        "--preset llama-7b --seq 2048 --dp 16 --zero 2 --offload optimizer --compare deepspeed")
        ["deepspeed"];
    CHECK(offload["gpu_bytes"].get<std::uint64_t>() == 2 * P);
    CHECK(offload["cpu_bytes"].get<std::uint64_t>() ==
          P * 64 * 3 / 2);  // P x max(4 x 16, 16) x 1.5
}

TEST_CASE("DeepSpeed ZeRO-3: 4 B of the largest module plus 18P/N, 2P/N or nothing",
          "[compare][deepspeed]") {
    const std::uint64_t P = 6738415616ULL, largest = 32000ULL * 4096;  // llama-7b; its embedding
    const json gpu = compare_of(
        "--preset llama-7b --seq 2048 --dp 16 --zero 3 --compare deepspeed")["deepspeed"];
    CHECK(gpu["largest_layer"].get<std::uint64_t>() == largest);
    CHECK(gpu["gpu_bytes"].get<std::uint64_t>() == 4 * largest + 18 * P / 16);
    CHECK(gpu["cpu_bytes"].get<std::uint64_t>() ==
          largest * 4 * 8 * 3 / 2);  // zero_init: the largest module
    const json optimizer = compare_of(
        "--preset llama-7b --seq 2048 --dp 16 --zero 3 --offload optimizer --compare deepspeed")
        ["deepspeed"];
    CHECK(optimizer["gpu_bytes"].get<std::uint64_t>() == 4 * largest + 2 * P / 16);
    CHECK(optimizer["cpu_bytes"].get<std::uint64_t>() ==
          P * 16 / 2 * 3 / 2);  // P x 16 x (1 / 2 nodes) x 1.5
    const json parameters = compare_of(
        "--preset llama-7b --seq 2048 --dp 24 --zero 3 --offload parameters --compare deepspeed")
        ["deepspeed"];
    CHECK(parameters["gpu_bytes"].get<std::uint64_t>() == 4 * largest);
    CHECK(parameters["cpu_bytes"].get<std::uint64_t>() ==
          P * 18 / 3 * 3 / 2);  // P x 18 x (1 / 3 nodes) x 1.5
}

TEST_CASE("every compare byte figure in JSON is a whole number", "[compare][json]") {
    const json m = compare_of(
        "--preset llama-2-70b --seq 4096 --dp 8 --tp 8 --zero 1 --compare megatron")["megatron"];
    for (const char* key : {"weight_and_optimizer_bytes", "activation_bytes", "total_bytes"}) {
        INFO(key);
        CHECK(m[key].is_number_unsigned());
    }
    CHECK(m["total_bytes"].get<std::uint64_t>() ==
          m["weight_and_optimizer_bytes"].get<std::uint64_t>() +
              m["activation_bytes"].get<std::uint64_t>());
    const json d =
        compare_of("--preset llama-7b --seq 2048 --dp 7 --zero 3 --compare deepspeed")["deepspeed"];
    for (const char* key : {"gpu_bytes", "cpu_bytes", "largest_layer"}) {
        INFO(key);
        CHECK(d[key].is_number_unsigned());
    }
}
