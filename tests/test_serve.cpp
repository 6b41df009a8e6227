// Serving memory: the weights by storage format, the KV cache in paged blocks, prefill, and what
// fits.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "fixtures.hpp"
#include "run_program.hpp"
#include "memcalc/serve.hpp"
#include "memcalc/engine_budget.hpp"
#include "memcalc/serve_device.hpp"
#include "model_file.hpp"

using namespace memcalc;

namespace {
Architecture preset(const char* name) { return cli::load_preset(name).architecture; }

ServeSettings at(std::uint64_t context, std::uint64_t batch = 1, std::uint64_t tp = 1) {
    ServeSettings s;
    s.context = context, s.batch = batch, s.tp = tp;
    return s;
}

/// Each of `cases` (arguments after `command`, and what the error says) refused: nonzero, nothing
/// on stdout, one line on stderr saying it.
void check_refused(const std::string& command,
                   const std::vector<std::pair<std::string, std::string>>& cases) {
    for (const auto& [args, says] : cases) {
        CAPTURE(args);
        const auto bad = testing::memcalc(command + " " + args);
        CHECK(bad.status != 0);
        CHECK(bad.out.empty());
        CHECK_THAT(bad.err, Catch::Contains(says));
    }
}
}  // namespace

TEST_CASE(
    "the KV cache per token is 2 x layers x key/value heads x head_dim x the cache dtype's bytes",
    "[serve]") {
    // llama.cpp prints "KV self size = 1024.00 MiB, K (f16): 512.00 MiB, V (f16): 512.00 MiB" for
    // Llama 2 7B at n_ctx 2048 (TheBloke/Llama-2-7B-GGUF, a public log: find_string 'KV self size =
    // 1024.00 MiB', id 21437509663) and for Llama 3 8B at n_ctx 8192 (id 2232086978: its 15317 MiB
    // of f16 weights are Llama 3 8B's).
    const auto cache = [](const char* name, std::uint64_t context) {
        return serve(preset(name), at(context)).kv_cache.value();
    };
    CHECK(cache("llama-7b", 2048) == 1024ULL << 20);
    CHECK(cache("llama-3-8b", 8192) == 1024ULL << 20);
    SECTION("an fp8 cache halves it; blocks round each sequence up; the batch multiplies it") {
        const Architecture m = preset("llama-3-8b");
        ServeSettings s = at(1000, 3);
        s.kv_dtype = DType::fp8_e4m3;
        const ServeReport r = serve(m, s);
        CHECK(r.kv_bytes_per_token.value() == 32 * 2 * 8 * 128);
        CHECK(r.blocks_per_sequence == 63);  // 1000 tokens in blocks of 16
        CHECK(r.kv_cache.value() == 3 * 63 * 16 * 32 * 2 * 8 * 128);
    }
    SECTION(
        "tensor parallelism splits the key/value heads, and each rank keeps a whole one when "
        "fewer") {
        const Architecture m = preset("llama-3-70b");  // 8 key/value heads
        const ServeReport tp8 = serve(m, at(4096, 1, 8)), tp16 = serve(m, at(4096, 1, 16));
        CHECK(tp8.kv_heads_per_rank == 1);
        CHECK_FALSE(tp8.kv_replicated);
        CHECK(tp16.kv_heads_per_rank == 1);
        CHECK(tp16.kv_replicated);
        CHECK(tp16.kv_cache == tp8.kv_cache);
        CHECK(serve(m, at(4096, 1, 2)).kv_cache.value() == 4 * tp8.kv_cache.value());
        CHECK_THROWS_WITH(serve(m, at(4096, 1, 3)), Catch::Contains("tp (3)"));
        // The weights too: k_proj and v_proj keep a whole head on each of 16 ranks, as on each
        // of 8, not half of one; every other split tensor halves, the norms stay whole.
        const std::uint64_t h = m.hidden, L = m.layers;
        const std::uint64_t kv = L * 2 * h * m.head_size() * 2;  // k and v: a head each, bf16
        const std::uint64_t norms = (2 * L + 1) * h * 2;
        CHECK(tp16.weights.value() == (tp8.weights.value() - kv - norms) / 2 + kv + norms);
    }
}

TEST_CASE(
    "latent attention caches its compressed latent and k's rotary part; sliding windows cap theirs",
    "[serve]") {
    SECTION("DeepSeek-V3: (512 + 64) values a layer a token, whole on every rank") {
        const Architecture m = preset("deepseek-v3");
        const ServeReport r = serve(m, at(4096, 1, 8));
        CHECK(r.kv_latent);
        CHECK(r.kv_bytes_per_token.value() == 61 * (512 + 64) * 2);  // 70,272 B
        CHECK(r.kv_cache.value() == 4096ULL * 61 * (512 + 64) * 2);
        CHECK(serve(m, at(4096, 1, 1)).kv_cache == r.kv_cache);
    }
    SECTION(
        "gpt-oss: its 128-token sliding layers keep 9 blocks of 16 (the window and the one its "
        "start is in)") {
        const Architecture m = GENERATE(preset("gpt-oss-20b"), preset("gpt-oss-120b"));
        CAPTURE(m.name);
        const std::uint64_t half = m.layers / 2,
                            per_layer = 2 * 8 * 64 * 2;  // 8 key/value heads of 64, bf16
        const ServeReport r = serve(m, at(8192, 2));
        CHECK(r.windowed_layers == half);
        CHECK(r.kv_cache.value() == 2 * 16 * per_layer * (half * 512 + half * 9));
        // A context inside the window: every layer keeps it all.
        CHECK(serve(m, at(100)).kv_cache.value() == 7 * 16 * per_layer * m.layers);
    }
}

TEST_CASE(
    "weights: bf16 is 2 bytes a parameter; quantised formats store the layers' matrices with their "
    "scales",
    "[serve]") {
    const Architecture m =
        GENERATE(preset("llama-3-8b"), preset("mixtral-8x7b"), fixtures::gpt2_small());
    CAPTURE(m.name);
    const ParameterTable table = parameter_table(m);
    ServeSettings s = at(128);
    CHECK(serve(m, s).weights == table.total() * 2);
    CHECK(serve(m, s).parameters == table.total());
    // The matrices of the layers, and everything else in bf16.
    Count matrices, rest;
    for (const ParamRow& r : table.rows)
        (r.group == Group::layer && (r.part == Part::attention || r.part == Part::mlp) &&
                 r.dims.size() >= 2
             ? matrices
             : rest) += table.in_model(r);
    const auto with = [&](const char* format) {
        s.weights = weight_format(format);
        return serve(m, s).weights.value();
    };
    CHECK(with("fp8") >
          matrices.value() + 2 * rest.value());  // one byte each, and a scale per matrix
    CHECK(with("fp8") < matrices.value() + 2 * rest.value() + 4096);
    CHECK(with("int8") > with("fp8"));  // a scale per output channel
    CHECK(with("int4") < with("int8"));
}

TEST_CASE(
    "int4 stores AWQ's and GPTQ's packed values, an fp16 scale and a 4-bit zero per 128 inputs of "
    "each output",
    "[serve]") {
    const WeightFormat& int4 = *weight_format("int4");
    CHECK(int4.matrix_bytes(4096, 4096).value() == 4096 * 4096 / 2 + 32 * 4096 * 2 + 32 * 4096 / 2);
    CHECK(int4.matrix_bytes(4096, 14336).value() ==
          4096ULL * 14336 / 2 + 32 * 14336 * 2 + 32 * 14336 / 2);
    CHECK(int4.matrix_bytes(200, 8).value() ==
          200 * 8 / 2 + 2 * 8 * 2 + 2 * 8 / 2);  // a partial group
    CHECK(weight_format("int8")->matrix_bytes(4096, 1024).value() == 4096 * 1024 + 1024 * 4);
    CHECK(weight_format("fp8")->matrix_bytes(4096, 1024).value() == 4096 * 1024 + 4);
    CHECK(weight_format("int3") == nullptr);
}

TEST_CASE(
    "serving fits: the largest batch fits and the next does not; the cache capacity is in whole "
    "blocks",
    "[serve]") {
    const Architecture m = GENERATE(preset("llama-3-8b"), preset("llama-2-70b"));
    CAPTURE(m.name);
    ServeSettings s = at(8192, 1, m.layers > 40 ? 4 : 1);
    const Count capacity = Count(78) * 1'000'000'000ULL;
    const ServeFit f = serve_fit(m, s, capacity);
    REQUIRE(f.max_batch > 0);
    s.batch = f.max_batch;
    CHECK(serve(m, s).peak() <= capacity);
    s.batch = f.max_batch + 1;
    CHECK(serve(m, s).peak() > capacity);
    CHECK(f.kv_capacity_tokens.value() % 16 == 0);
    CHECK(f.kv_capacity_tokens.value() >= f.max_batch * 8192);
    CHECK_FALSE(serve_fit(m, s, Count(1'000'000)).fits);
    CHECK(serve_fit(m, s, Count(1'000'000)).max_batch == 0);
}

TEST_CASE("memcalc serve: JSON keys, a device's answer, and errors that name the value",
          "[serve][cli]") {
    const auto r =
        testing::memcalc("serve --preset llama-3-8b --context 8192 --batch 4 --format json");
    REQUIRE(r.status == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j.at("kv_cache").at("bytes").get<std::uint64_t>() == 4ULL << 30);
    CHECK(j.at("weights").at("bytes").get<std::uint64_t>() ==
          2 * j.at("model").at("parameters").get<std::uint64_t>());
    CHECK(j.at("peak").at("bytes").get<std::uint64_t>() ==
          j.at("weights").at("bytes").get<std::uint64_t>() +
              j.at("kv_cache").at("bytes").get<std::uint64_t>() +
              j.at("activations").at("bytes").get<std::uint64_t>());
    const auto fit =
        testing::memcalc("serve --preset llama-3-8b --context 8192 --gpu h100-sxm --format json");
    REQUIRE(fit.status == 0);
    CHECK(nlohmann::json::parse(fit.out).at("device").at("max_batch").get<std::uint64_t>() > 1);
    for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
             {"serve --preset llama-3-8b", "--context"},
             {"serve --preset llama-3-8b --context 0", "--context"},
             {"serve --preset llama-3-8b --context 4096 --weights int3", "'int3'"},
             {"serve --preset llama-3-8b --context 4096 --kv-dtype int2", "'int2'"},
             {"serve --preset llama-3-8b --context 4096 --tp 3", "tp (3)"},
             {"serve --preset gpt2 --context 4096", "1024 learned positions"}}) {
        CAPTURE(args);
        const auto bad = testing::memcalc(args);
        CHECK(bad.status != 0);
        CHECK(bad.out.empty());
        CHECK_THAT(bad.err, Catch::Contains(says));
    }
}

TEST_CASE("serve_fit's largest batch is exact past 2^32: doubling and bisecting span 64 bits",
          "[serve]") {
    // memcalc 1.2 stopped doubling at 2^32 and answered 2^33 - 1 for any larger batch.
    const Architecture m = fixtures::decoder();
    ServeSettings s = at(8);
    const Count capacity = Count(1'000'000'000'000'000ULL);  // a petabyte: some 4e11 sequences
    const ServeFit f = serve_fit(m, s, capacity);
    CHECK(f.max_batch > (1ULL << 33));
    s.batch = f.max_batch;
    CHECK(serve(m, s).peak() <= capacity);
    s.batch = f.max_batch + 1;
    CHECK(serve(m, s).peak() > capacity);
    // The whole range: a batch past 2^64 bytes is refused naming it, and never fits.
    s.batch = std::numeric_limits<std::uint64_t>::max();
    CHECK_THROWS_WITH(serve(m, s), Catch::Contains("the KV cache of batch (18446744073709551615) "
                                                   "x context (8, in blocks of 16 tokens)"));
    CHECK(serve_fit(m, at(8), Count(std::numeric_limits<std::uint64_t>::max())).max_batch <
          std::numeric_limits<std::uint64_t>::max());
}

TEST_CASE("memcalc serve names the input that overflows, and --reserve needs a device",
          "[serve][cli][errors]") {
    const std::string most = "18446744073709551615";
    for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
             {"--context 4096 --batch " + most, "KV cache of batch (" + most + ") x context (4096"},
             {"--context " + most, "batch (1) x context (" + most + ", in blocks of 16 tokens)"},
             {"--context 4096 --block-size " + most, "(4096, in blocks of " + most + " tokens)"},
             {"--context 4096 --reserve 0", "--reserve 0 needs --device-memory, --gpu or"}}) {
        CAPTURE(args);
        const auto bad = testing::memcalc("serve --preset llama-7b " + args);
        CHECK(bad.status != 0);
        CHECK(bad.out.empty());
        CHECK_THAT(bad.err, Catch::Contains(says));
    }
    // A given reserve is kept out of the device's memory; by default none is (the engine's
    // context, workspaces and graphs are rows of the device figure).
    const std::string device =
        "serve --preset llama-7b --context 4096 --gpu h100-sxm --format json";
    const auto with = testing::memcalc(device + " --reserve 4GiB");
    REQUIRE(with.status == 0);
    CHECK(nlohmann::json::parse(with.out).at("device").at("reserve_bytes") == 4ULL << 30);
    const auto by_default = testing::memcalc(device);
    REQUIRE(by_default.status == 0);
    CHECK(nlohmann::json::parse(by_default.out).at("device").at("reserve_bytes") == 0);
}

TEST_CASE("a serving rank's tensors make up its weights, cache and prefill exactly", "[serve]") {
    for (const char* name : {"llama-3-8b", "mixtral-8x7b", "gemma-2-9b", "jamba-1.5-mini",
                             "deepseek-v2-lite", "gpt2"}) {
        CAPTURE(name);
        const Architecture m = preset(name);
        ServeSettings s = at(1000, 3);
        const ServeReport r = serve(m, s);
        CHECK(detail::total_bytes(r.weight_tensors) == r.weights + r.lora);
        CHECK(detail::total_bytes(r.cache_tensors) == r.kv_cache + r.ssm_state);
        CHECK(detail::total_bytes(r.prefill_tensors) == r.activations);
    }
}

TEST_CASE("serving's three figures: allocated, reserved at or above it, and the device beyond",
          "[serve][reserved]") {
    const Architecture m = preset("llama-3-70b");
    for (const std::uint64_t tp : {1, 4}) {
        CAPTURE(tp);
        ServeSettings s = at(8192, 16, tp);
        const ServeReport r = serve(m, s);
        DeviceSettings device;
        device.gpu = gpu_facts_of("h100-sxm");
        const ServeDevice d = serve_device(r, s, device);
        REQUIRE(d.simulated);
        CHECK(d.allocated == r.peak());
        CHECK(d.reserved >= d.allocated + rows_inside(d.rows, &DeviceRow::bytes));
        CHECK(d.loaded_bytes >= r.weights);
        CHECK(d.loaded_bytes < d.reserved);
        CHECK(d.bytes == d.reserved + rows_outside(d.rows, &DeviceRow::bytes));
        CHECK(d.low_bytes <= d.bytes);
        CHECK(d.high_bytes >= d.bytes);
        const auto has = [&](const ServeDevice& f, std::string_view row) {
            for (const DeviceRow& x : f.rows)
                if (x.name == row) return true;
            return false;
        };
        CHECK(has(d, "cuda_graph_pool"));
        CHECK(has(d, "nccl_communicator") == (tp > 1));
        // One thread runs an engine's matmuls: one cuBLAS workspace, not training's two.
        for (const DeviceRow& x : d.rows)
            if (x.name == "cublas_workspace") CHECK(x.count == 1);
        s.cuda_graphs = false;  // --enforce-eager: no pool, less reserved
        const ServeDevice eager = serve_device(r, s, device);
        CHECK_FALSE(has(eager, "cuda_graph_pool"));
        CHECK(eager.reserved < d.reserved);
        AllocatorConfig expandable;
        expandable.mode = AllocatorMode::expandable;
        device.allocator = expandable;
        CHECK(serve_device(r, at(8192, 16, tp), device).reserved <= d.reserved);
    }
}

TEST_CASE("a device's largest batch weighs the device figure's high end, not the tensors alone",
          "[serve][reserved]") {
    for (const char* name : {"llama-3-8b", "qwen2.5-7b", "mistral-7b"}) {
        CAPTURE(name);
        const Architecture m = preset(name);
        const ServeSettings s = at(4096);
        const Count capacity = Count(80'000'000'000ULL);
        DeviceSettings device;
        device.gpu = gpu_facts_of("a100-80gb");
        const ServeFit tensors = serve_fit(m, s, capacity);
        const ServeFit on_device = serve_fit_on_device(m, s, capacity, device);
        REQUIRE(on_device.max_batch > 0);
        CHECK(on_device.max_batch < tensors.max_batch);
        CHECK(on_device.kv_capacity_tokens < tensors.kv_capacity_tokens);
        ServeSettings most = s;
        most.batch = on_device.max_batch;
        CHECK(serve_device(serve(m, most), most, device).high_bytes <= capacity);
        most.batch += 1;
        CHECK(serve_device(serve(m, most), most, device).high_bytes > capacity);
    }
}

TEST_CASE(
    "memcalc serve reports reserved and device figures, and --enforce-eager drops the "
    "graph pool",
    "[serve][cli]") {
    const std::string run = "serve --preset llama-3-8b --context 8192 --batch 8 --format json";
    const auto graphs = testing::memcalc(run), eager = testing::memcalc(run + " --enforce-eager");
    REQUIRE(graphs.status == 0);
    REQUIRE(eager.status == 0);
    const auto peak = nlohmann::json::parse(graphs.out).at("peak");
    const auto figure = [](const nlohmann::json& p, const char* key) {
        return p.at(key).get<std::uint64_t>();
    };
    CHECK(figure(peak, "reserved_bytes") > figure(peak, "bytes"));
    CHECK(figure(peak, "device_bytes") > figure(peak, "reserved_bytes"));
    CHECK(figure(peak.at("device_band"), "high_bytes") >= figure(peak, "device_bytes"));
    const auto names = [](const nlohmann::json& p) {
        std::vector<std::string> out;
        for (const auto& row : p.at("outside")) out.push_back(row.at("name"));
        return out;
    };
    const auto eager_peak = nlohmann::json::parse(eager.out).at("peak");
    CHECK(names(peak).size() == names(eager_peak).size() + 1);
    CHECK(figure(eager_peak, "reserved_bytes") < figure(peak, "reserved_bytes"));
    CHECK(nlohmann::json::parse(eager.out).at("settings").at("cuda_graphs") == false);
}

namespace {
EngineBudget budget_of(const char* model, const char* version, double utilization = 0.9,
                       bool graphs = true) {
    ServeSettings s = at(1);
    s.cuda_graphs = graphs;
    EngineSettings e;
    e.rule = engine_rule("vllm", version);
    e.share = utilization;
    e.max_model_len = 32768;
    DeviceSettings device;
    device.gpu = gpu_facts_of("h100-sxm");
    return engine_budget(preset(model), s, e, Count(85'520'809'984ULL), device);
}
}  // namespace

TEST_CASE("an engine's versions are rows: the newest at or below the one asked",
          "[serve][engine]") {
    REQUIRE(engine_rule("vllm"));
    CHECK(engine_rule("vllm")->version == std::string("0.21"));
    CHECK(engine_rule("vllm", "0.8")->version == std::string("0.7"));
    CHECK(engine_rule("vllm", "0.10")->version == std::string("0.10"));
    CHECK(engine_rule("vllm", "0.25.1")->version == std::string("0.21"));
    CHECK(engine_rule("vllm", "1.0")->version == std::string("0.21"));
    CHECK(engine_rule("vllm", "0.5") == nullptr);
    CHECK(engine_rule("vllm", "x.y") == nullptr);
    CHECK(engine_rule("tgi") == nullptr);
}

TEST_CASE("vLLM's KV cache is its share of the device less its terms, in whole blocks",
          "[serve][engine]") {
    for (const char* model : {"llama-3-8b", "qwen2.5-7b", "mistral-7b", "llama-3-70b"}) {
        for (const char* version : {"0.6", "0.7", "0.10", "0.21"}) {
            CAPTURE(model, version);
            const EngineBudget b = budget_of(model, version);
            std::uint64_t requested = 0, taken = 0;
            for (const BudgetTerm& t : b.terms) (t.adds ? requested : taken) += t.bytes.value();
            if (b.shortfall > Count(0)) {
                CHECK(b.shortfall.value() == taken - requested);
                CHECK(b.blocks == 0);
                continue;
            }
            const std::uint64_t left = requested - taken, kv = b.kv_cache_bytes.value();
            REQUIRE(b.blocks > 0);
            CHECK(kv <= left);
            CHECK(left - kv < kv / b.blocks);
            CHECK(b.tokens == b.blocks * 16);
            CHECK(b.max_concurrency > 0);
        }
    }
    // Llama 3 70B's weights alone pass 90% of an H100: the engine does not start.
    CHECK(budget_of("llama-3-70b", "0.21").shortfall > Count(0));
}

TEST_CASE(
    "vLLM 0.21 takes its CUDA graphs' estimate from the cache; 0.10 and --enforce-eager do "
    "not",
    "[serve][engine]") {
    const EngineBudget v10 = budget_of("llama-3-8b", "0.10"), v21 = budget_of("llama-3-8b", "0.21");
    const EngineBudget eager = budget_of("llama-3-8b", "0.21", 0.9, false);
    const std::uint64_t block = 131072ULL * 16;  // 32 layers x 8 heads x 128 x 2 x 2 B x 16 tokens
    const std::uint64_t graphs = 385875968;      // the pool's row
    const std::uint64_t less = v10.kv_cache_bytes.value() - v21.kv_cache_bytes.value();
    CHECK(less + block >= graphs);
    CHECK(less <= graphs + block);
    CHECK(eager.kv_cache_bytes == v10.kv_cache_bytes);
    // More of the device, more cache; V0's profiling batch of the whole model length, less.
    CHECK(budget_of("llama-3-8b", "0.21", 0.95).tokens > v21.tokens);
    CHECK(budget_of("llama-3-8b", "0.7").tokens < v10.tokens);
}

TEST_CASE("memcalc serve --engine vllm: the engine's terms in JSON, and errors that name the value",
          "[serve][engine][cli]") {
    const auto r = testing::memcalc(
        "serve --preset llama-3-8b --engine vllm --max-model-len 16384 --gpu h100-sxm --format "
        "json");
    REQUIRE(r.status == 0);
    const auto engine = nlohmann::json::parse(r.out).at("engine");
    for (const char* key : {"kv_cache_bytes", "kv_cache_tokens", "blocks", "max_concurrency",
                            "terms", "version", "max_num_batched_tokens"})
        CHECK(engine.contains(key));
    CHECK(engine.at("kv_cache_tokens").get<std::uint64_t>() ==
          16 * engine.at("blocks").get<std::uint64_t>());
    CHECK(nlohmann::json::parse(r.out).at("settings").at("context") == 16384);
    check_refused("serve --preset llama-3-8b",
                  {{"--engine tgi --gpu h100-sxm", "'tgi'"},
                   {"--engine vllm --engine-version 0.5 --gpu h100-sxm", "'0.5'"},
                   {"--engine vllm --gpu-memory-utilization 1.5 --gpu h100-sxm", "'1.5'"},
                   {"--engine vllm --gpu-memory-utilization 0 --gpu h100-sxm", "'0'"},
                   {"--context 4096 --max-model-len 4096", "--max-model-len 4096 needs --engine"},
                   {"--engine vllm", "--engine vllm needs --device-memory"}});
}

TEST_CASE("SGLang keeps a static fraction for the weights and the cache, by tensor parallelism",
          "[serve][engine]") {
    const EngineRule* rule = engine_rule("sglang");
    REQUIRE(rule);
    CHECK(rule->share == ShareRule::static_fraction);
    ServeSettings s = at(1);
    EngineSettings e;
    e.rule = rule;
    e.max_model_len = 32768;
    DeviceSettings device;
    device.gpu = gpu_facts_of("h100-sxm");
    const Count memory(85'520'809'984ULL);
    const EngineBudget one = engine_budget(preset("llama-3-8b"), s, e, memory, device);
    CHECK(one.share == 0.88);
    // No profiling term: the fraction leaves the activations the rest of the device.
    for (const BudgetTerm& t : one.terms) CHECK(std::string(t.name) != "activation_peak");
    // Tokens in pages of one, over every layer's bytes a token.
    CHECK(one.tokens == one.blocks);
    CHECK(one.kv_cache_bytes == Count(one.tokens) * 131072);
    s.tp = 4;
    const EngineBudget four = engine_budget(preset("llama-3-8b"), s, e, memory, device);
    CHECK(four.share == 0.85);
    // A quarter of the heads a rank and the weights split: more tokens fit each rank.
    CHECK(four.tokens > 4 * one.tokens);
    const auto r = testing::memcalc(
        "serve --preset llama-3-8b --engine sglang --gpu h100-sxm --max-model-len 8192 "
        "--gpu-memory-utilization 0.5");
    CHECK(r.status != 0);
    CHECK_THAT(r.err, Catch::Contains("--gpu-memory-utilization 0.5 is not sglang's"));
}

namespace {
/// vLLM's LoRA slots by hand for a dense grouped-query model: per layer, A (rank x in) and
/// B (out x rank) of q, k, v, o, gate, up and down, column-parallel ones' outputs and row-parallel
/// ones' inputs split by tp, k and v keeping a whole head where fewer heads than ranks.
std::uint64_t lora_by_hand(const Architecture& m, std::uint64_t loras, std::uint64_t rank,
                           std::uint64_t tp) {
    const std::uint64_t h = m.hidden, d = m.head_size(), kv = m.key_value_heads();
    const std::uint64_t q = m.heads * d, kv_rank = kv < tp ? d : kv * d / tp;
    const std::uint64_t per_layer =
        (h + q / tp) + 2 * (h + kv_rank) + (q / tp + h) + 2 * (h + m.ffn / tp) + (m.ffn / tp + h);
    return m.layers * per_layer * loras * rank * 2;
}
}  // namespace

TEST_CASE("vLLM's LoRA slots: A and B of every linear for max_loras slots, split as the layer is",
          "[serve][lora]") {
    // Llama 3 8B, 4 slots at rank 64: 32 layers x 81,920 (in + out summed) x 64 x 4 x 2 bytes.
    ServeSettings s = at(4096);
    s.max_loras = 4, s.max_lora_rank = 64;
    const ServeReport llama = serve(preset("llama-3-8b"), s);
    CHECK(llama.lora == Count(1'342'177'280ULL));
    CHECK(llama.lora_linears == 7 * 32);
    for (const char* name : {"llama-3-8b", "qwen2.5-7b", "mistral-7b", "llama-3.2-1b"}) {
        for (std::uint64_t tp : {1, 2, 4, 16}) {
            const Architecture m = preset(name);
            if (m.heads % tp != 0) continue;
            for (const auto& [loras, rank] : {std::pair{1, 16}, {3, 8}, {8, 256}}) {
                CAPTURE(name, tp, loras, rank);
                ServeSettings t = at(1000, 2, tp);
                t.max_loras = loras, t.max_lora_rank = rank;
                const ServeReport r = serve(m, t);
                CHECK(r.lora.value() == lora_by_hand(m, loras, rank, tp));
                // The buffers are tensors made with the weights, and in the peak.
                CHECK(detail::total_bytes(r.weight_tensors) == r.weights + r.lora);
                t.max_loras = 0;
                CHECK(r.peak() == serve(m, t).peak() + r.lora);
            }
        }
    }
    s.max_loras = 1;
    CHECK_THROWS_WITH(serve(preset("mixtral-8x7b"), s), Catch::Contains("experts"));
    CHECK_THROWS_WITH(serve(preset("jamba-1.5-mini"), s), Catch::Contains("experts"));
}

TEST_CASE("vLLM counts the LoRA slots with the weights: the cache is smaller by them",
          "[serve][lora][engine]") {
    for (const char* model : {"llama-3-8b", "qwen2.5-7b"}) {
        CAPTURE(model);
        ServeSettings s = at(1);
        EngineSettings e;
        e.max_model_len = 16384;
        DeviceSettings device;
        device.gpu = gpu_facts_of("h100-sxm");
        const Count memory(85'520'809'984ULL);
        const EngineBudget plain = engine_budget(preset(model), s, e, memory, device);
        s.max_loras = 8, s.max_lora_rank = 128;
        const EngineBudget lora = engine_budget(preset(model), s, e, memory, device);
        const Count adapters = serve(preset(model), s).lora;
        Count term;
        for (const BudgetTerm& t : lora.terms)
            if (std::string(t.name) == "lora_adapters") term = t.bytes;
        CHECK(term == adapters);
        const std::uint64_t less = plain.kv_cache_bytes.value() - lora.kv_cache_bytes.value();
        const std::uint64_t block = plain.kv_cache_bytes.value() / plain.blocks;
        CHECK(less + block > adapters.value());
        CHECK(less < adapters.value() + block);
    }
}

TEST_CASE("memcalc serve --max-loras: a row, a JSON object, and the engine's ranks",
          "[serve][lora][cli]") {
    const auto r = testing::memcalc(
        "serve --preset qwen2.5-7b --context 4096 --tp 2 --max-loras 2 --max-lora-rank 32 "
        "--format json");
    REQUIRE(r.status == 0);
    const auto json = nlohmann::json::parse(r.out);
    ServeSettings s = at(4096, 1, 2);
    s.max_loras = 2, s.max_lora_rank = 32;
    CHECK(json.at("lora").at("bytes") == serve(preset("qwen2.5-7b"), s).lora.value());
    CHECK(json.at("lora").at("max_loras") == 2);
    CHECK_FALSE(nlohmann::json::parse(testing::memcalc("serve --preset qwen2.5-7b --context 4096 "
                                                       "--format json")
                                          .out)
                    .contains("lora"));
    const auto table = testing::memcalc("serve --preset llama-3-8b --context 4096 --max-loras 1");
    CHECK_THAT(table.out, Catch::Contains("LoRA adapters") && Catch::Contains("rank 16"));
    check_refused(
        "serve --preset llama-3-8b",
        {{"--engine vllm --gpu h100-sxm --max-loras 1 --max-lora-rank 24",
          "'24' is not one vllm 0.21 takes (1, 8,"},
         {"--engine vllm --engine-version 0.6 --gpu h100-sxm --max-loras 1 --max-lora-rank 512",
          "'512' is not one vllm 0.6 takes (8, 16, 32, 64, 128, 256)"},
         {"--engine sglang --gpu h100-sxm --max-loras 2", "--max-loras 2 is vLLM's"},
         {"--context 64 --max-lora-rank 8", "--max-lora-rank 8 needs --max-loras"},
         {"--context 64 --max-loras 0", "--max-loras"}});
}

TEST_CASE("serve's --kv-cache-dtype as the engine spells it, and --block-size among the engine's",
          "[serve][engine][cli]") {
    const auto json = [](const std::string& args) {
        const auto r = testing::memcalc("serve --preset llama-3-8b --gpu h100-sxm " + args +
                                        " --max-model-len 8192 --format json");
        REQUIRE(r.status == 0);
        return nlohmann::json::parse(r.out);
    };
    CHECK(json("--engine vllm --kv-cache-dtype fp8").at("settings").at("kv_dtype") ==
          json("--engine vllm --kv-dtype fp8").at("settings").at("kv_dtype"));
    CHECK(json("--engine sglang --kv-cache-dtype fp8_e5m2").at("kv_cache").at("dtype") ==
          "fp8-e5m2");
    CHECK(json("--engine vllm --kv-cache-dtype auto").at("kv_cache").at("dtype") == "bf16");
    // Half the bytes a token: about twice the tokens in the same budget.
    const auto fp8 = json("--engine vllm --kv-cache-dtype fp8_e4m3").at("engine");
    const auto bf16 = json("--engine vllm").at("engine");
    CHECK(fp8.at("kv_cache_tokens").get<std::uint64_t>() >=
          2 * bf16.at("kv_cache_tokens").get<std::uint64_t>());
    CHECK(json("--engine vllm --block-size 32").at("engine").at("block_size") == 32);
    check_refused(
        "serve --preset llama-3-8b --gpu h100-sxm",
        {{"--engine sglang --kv-cache-dtype fp8",
          "'fp8' is not one sglang 0.4 takes (auto, "
          "fp8_e5m2, fp8_e4m3)"},
         {"--engine vllm --engine-version 0.6 --kv-cache-dtype bfloat16",
          "'bfloat16' is not one vllm 0.6 takes"},
         {"--engine vllm --kv-cache-dtype fp8 --kv-dtype fp8", "give one"},
         {"--context 64 --kv-cache-dtype fp8", "--kv-cache-dtype fp8 needs --engine"},
         {"--engine vllm --block-size 48", "--block-size '48' is not one vllm 0.21 takes"},
         {"--engine vllm --engine-version 0.6 --block-size 256",
          "'256' is not one vllm 0.6 takes (8, 16, 32, 64, 128)"}});
    // Without an engine any block size memcalc can count.
    CHECK(testing::memcalc("serve --preset llama-3-8b --context 64 --block-size 48").status == 0);
}

// A speculative-decoding draft model in the engine's budget: its weights, and its layers in the
// one KV-cache pool (vLLM V1) or a proportional share of the model's blocks (vLLM V0).

namespace {
/// vLLM's budget for `model` at max_model_len 32768 on an H100 SXM, with `draft` if given.
EngineBudget budget(const Architecture& model, const Architecture* draft, const char* version) {
    ServeSettings s;
    s.context = 1;
    s.draft = draft;
    s.num_speculative_tokens = draft ? 4 : 0;
    EngineSettings e;
    e.rule = engine_rule("vllm", version);
    e.max_model_len = 32768;
    DeviceSettings device;
    device.gpu = gpu_facts_of("h100-sxm");
    return engine_budget(model, s, e, Count(85'520'809'984ULL), device);
}

Count term(const EngineBudget& b, const char* name) {
    for (const BudgetTerm& t : b.terms)
        if (std::string(t.name) == name) return t.bytes;
    return Count(0);
}

/// k and v of every layer's key/value heads, bf16, tp 1.
std::uint64_t kv_by_hand(const Architecture& m) {
    return 2 * m.layers * m.key_value_heads() * m.head_size() * 2;
}

struct Pair {
    const char* model;
    const char* draft;
    std::uint64_t draft_parameters;  ///< the draft checkpoint's published count
};
}  // namespace

TEST_CASE("a draft model's weights are its parameters in bf16, and its cache shares the pool",
          "[serve][engine][draft]") {
    for (const Pair& pair : {Pair{"llama-3-8b", "llama-3.2-1b", 1'235'814'400ULL},
                             Pair{"qwen3-8b", "qwen2-0.5b", 494'032'768ULL}}) {
        const Architecture m = preset(pair.model), d = preset(pair.draft);
        ServeSettings s;
        s.context = 32768, s.draft = &d, s.num_speculative_tokens = 4;
        s.weights = weight_format("fp8");  // the model's format, not the draft's
        const ServeReport r = serve(m, s);
        CAPTURE(pair.model, pair.draft);
        CHECK(r.draft_parameters == Count(pair.draft_parameters));
        CHECK(r.draft_weights == Count(pair.draft_parameters * 2));
        CHECK(r.draft_kv_bytes_per_token == Count(kv_by_hand(d)));
        CHECK(r.draft_kv_cache == Count(32768 * kv_by_hand(d)));
        CHECK(r.peak() == serve(m,
                                [&] {
                                    ServeSettings alone = s;
                                    alone.draft = nullptr;
                                    return alone;
                                }())
                                  .peak() +
                              r.draft_weights + r.draft_kv_cache);
        for (const char* version : {"0.6", "0.7", "0.21"}) {
            CAPTURE(version);
            const EngineBudget b = budget(m, &d, version), alone = budget(m, nullptr, version);
            // With the draft's own rotary cos/sin cache, of its positions x its rotary dimension.
            CHECK(term(b, "draft_weights") ==
                  r.draft_weights + Count(d.max_positions * d.rotary_dim() * 2));
            CHECK(term(b, "activation_peak") >= term(alone, "activation_peak"));
            std::uint64_t requested = 0, taken = 0;
            for (const BudgetTerm& t : b.terms) (t.adds ? requested : taken) += t.bytes.value();
            const std::uint64_t left = requested - taken, model_block = kv_by_hand(m) * 16,
                                block = model_block + kv_by_hand(d) * 16;
            // V1: whole blocks over every layer of both; V0: the model's blocks alone, split.
            const std::uint64_t blocks = std::string(version) == "0.21"
                                             ? left / block
                                             : std::uint64_t(double(left / model_block) *
                                                             double(model_block) / double(block));
            CHECK(b.blocks == blocks);
            CHECK(b.tokens == blocks * 16);
            CHECK(b.kv_cache_bytes == Count(blocks * block));
            CHECK(b.max_concurrency == Approx(double(blocks) / (32768 / 16)));
            CHECK(b.tokens < alone.tokens);
        }
    }
}

TEST_CASE("engines that run no draft model, or whose draft pool memcalc does not model, refuse",
          "[serve][engine][draft]") {
    const Architecture m = preset("llama-3-8b"), d = preset("llama-3.2-1b");
    CHECK_THROWS_WITH(budget(m, &d, "0.10"), Catch::Contains("refuses a draft model"));
    ServeSettings s;
    s.context = 1, s.draft = &d, s.num_speculative_tokens = 4;
    EngineSettings e;
    e.rule = engine_rule("sglang");
    e.max_model_len = 8192;
    CHECK_THROWS_WITH(engine_budget(m, s, e, Count(85'520'809'984ULL), DeviceSettings{}),
                      Catch::Contains("does not model sglang's draft"));
    const Architecture other = preset("qwen2-0.5b");
    s.draft = &other;
    CHECK_THROWS_WITH(serve(m, s), Catch::Contains("vocabulary (151936)"));
}

TEST_CASE(
    "memcalc serve --draft-preset: a row, a JSON object, a budget term; errors name the value",
    "[serve][engine][draft][cli]") {
    const std::string base =
        "serve --preset llama-3-8b --engine vllm --max-model-len 32768 --gpu h100-sxm";
    const auto r = testing::memcalc(base +
                                    " --draft-preset llama-3.2-1b --num-speculative-tokens 4 "
                                    "--format json");
    REQUIRE(r.status == 0);
    const auto j = nlohmann::json::parse(r.out);
    const auto& draft = j.at("draft");
    CHECK(draft.at("model") == "llama-3.2-1b");
    CHECK(draft.at("weights_bytes").get<std::uint64_t>() ==
          2 * draft.at("parameters").get<std::uint64_t>());
    CHECK(draft.at("num_speculative_tokens") == 4);
    CHECK(draft.at("kv_bytes_per_token") == kv_by_hand(preset("llama-3.2-1b")));
    bool termed = false;
    for (const auto& t : j.at("engine").at("terms"))
        termed = termed ||
                 (t.at("name") == "draft_weights" && t.at("bytes") > draft.at("weights_bytes"));
    CHECK(termed);
    const auto table =
        testing::memcalc(base + " --draft-preset llama-3.2-1b --num-speculative-tokens 4");
    CHECK_THAT(table.out, Catch::Contains("draft model") && Catch::Contains("- draft_weights"));
    check_refused(
        base, {{"--draft-preset llama-3.2-1b", "needs --num-speculative-tokens"},
               {"--num-speculative-tokens 4", "--num-speculative-tokens 4 needs --draft-preset"},
               {"--draft-preset llama-3.2-1b --num-speculative-tokens 0", "'0'"},
               {"--draft-preset qwen2-0.5b --num-speculative-tokens 4", "vocabulary"},
               {"--draft-preset llama-3.2-1b --num-speculative-tokens 4 --engine-version 0.12",
                "refuses a draft model"},
               {"--draft-preset nope --num-speculative-tokens 4", "nope"}});
    check_refused("serve --preset llama-3-8b --context 4096",
                  {{"--draft-preset llama-3.2-1b --num-speculative-tokens 4",
                    "--draft-preset llama-3.2-1b needs --engine"}});
}

TEST_CASE("serve --engine hf: transformers' generate() budgets nothing, the batch's own cache",
          "[serve][cli]") {
    const std::string base =
        "memcalc serve --preset llama-3-8b --context 4096 --batch 4 --format json";
    const testing::Run plain = testing::shell(base), hf = testing::shell(base + " --engine hf");
    REQUIRE(plain.status == 0);
    REQUIRE(hf.status == 0);
    const auto p = nlohmann::json::parse(plain.out), h = nlohmann::json::parse(hf.out);
    CHECK(h["kv_cache"] == p["kv_cache"]);
    CHECK(h["weights"] == p["weights"]);
    // Every prompt in one forward (no chunks): 4 x 4,096 tokens; the MLP's gate, up and product
    // are its largest, beside the residual stream and the norm's output, and the last tokens'
    // logits in bf16 and fp32. No CUDA graphs captured.
    const std::uint64_t tokens = 4 * 4096;
    CHECK(h["activations"]["prefill_tokens"] == tokens);
    CHECK(h["settings"]["prefill_chunk"].is_null());
    CHECK(h["activations"]["bytes"] ==
          tokens * 4096 * 2 * 2 + tokens * 14336 * 3 * 2 + 4 * 128256 * (2 + 4));
    CHECK(p["activations"]["prefill_tokens"] == 8192);
    for (const auto& row : h["peak"]["outside"]) CHECK(row["name"] != "cuda_graph_pool");
    const testing::Run chunked = testing::shell(base + " --engine hf --prefill-chunk 4096");
    CHECK(chunked.status == 2);
    CHECK(chunked.out.empty());
    CHECK_THAT(chunked.err, Catch::Contains("--prefill-chunk 4096 is an engine's"));
    const testing::Run bad = testing::shell(base + " --engine hf --gpu-memory-utilization 0.5");
    CHECK(bad.status != 0);
    CHECK(bad.out.empty());
    CHECK_THAT(bad.err,
               Catch::Contains("--gpu-memory-utilization 0.5 needs --engine vllm or sglang"));
    CHECK_THAT(testing::shell(base + " --engine tgi").err,
               Catch::Contains("--engine must be vllm, sglang or hf (got 'tgi')"));
}

TEST_CASE("transformers' SDPA path repeats grouped k and v to every query head in the forward",
          "[serve]") {
    // 32 query heads of 128 over 8 key/value heads, an MLP narrow enough for attention to lead.
    Architecture m = fixtures::llama_7b();
    m.hidden = 4096, m.heads = 32, m.kv_heads = 8, m.ffn = 1024, m.vocab = 1000;
    const auto [tp, kv] = GENERATE(table<std::uint64_t, std::uint64_t>({{1, 8}, {2, 4}, {8, 1}}));
    CAPTURE(tp);
    const std::uint64_t tokens = 1000, heads = 32 / tp, d = 128;
    const Count fused = detail::forward_temporaries(m, tokens, 2, tp)[1].bytes;
    const Count repeated = detail::forward_temporaries(m, tokens, 2, tp, true)[1].bytes;
    CHECK(fused == Count(tokens * (2 * heads * d + 2 * kv * d) * 2));
    CHECK(repeated == Count(tokens * (2 * heads * d + 2 * kv * d + 2 * heads * d) * 2));
    m.kv_heads = 32;  // no grouped heads: nothing repeated
    CHECK(detail::forward_temporaries(m, tokens, 2, tp, true)[1].bytes ==
          detail::forward_temporaries(m, tokens, 2, tp)[1].bytes);
}

namespace {
Architecture config_named(const std::string& file) {
    return cli::load_hf_config(std::string(MEMCALC_SOURCE_DIR) + "/tests/configs/" + file)
        .architecture;
}

Count term_bytes(const EngineBudget& b, std::string_view name) {
    for (const BudgetTerm& t : b.terms)
        if (std::string_view(t.name) == name) return t.bytes;
    return Count(0);
}
}  // namespace

TEST_CASE("serving images: the encoder's pass before a prefill, its outputs cached through it",
          "[serve][vision]") {
    const Architecture gemma = config_named("gemma-3-4b-it.json");
    const auto [batch, per_prompt, chunk] =
        GENERATE(table<std::uint64_t, std::uint64_t, std::uint64_t>(
            {{4, 2, 8192}, {64, 1, 8192}, {1, 1, 100}}));
    CAPTURE(batch, per_prompt, chunk);
    ServeSettings s = at(8192, batch);
    s.prefill_chunk = chunk;
    const ServeReport text = serve(gemma, s);
    CHECK(text.encoder_items == 0);
    s.images = {per_prompt, 0, 0};  // Gemma 3's tower takes each image at 896 x 896
    const ServeReport r = serve(gemma, s);
    // As many as the chunk's tokens need (at least one), at most every sequence's images.
    const std::uint64_t items = std::min((chunk + 255) / 256, batch * per_prompt);
    CHECK(r.encoder_tokens_per_item == 256);
    CHECK(r.encoder_items == items);
    CHECK(r.encoder_outputs == Count(items) * 256 * 2560 * 2);
    const Count tower = detail::total_bytes(
        detail::forward_temporaries(tower_block(gemma.vision, 4096), items * 4096, 0, 1));
    CHECK(r.activations == r.encoder_outputs + std::max(text.activations, tower));
    CHECK(r.activations > text.activations);
    // vLLM's profiling run encodes its budget's images of the largest size before its forward.
    EngineSettings e;
    e.rule = engine_rule("vllm");
    e.max_model_len = 8192;
    DeviceSettings device;
    device.gpu = gpu_facts_of("h100-sxm");
    const Count memory(85'520'809'984ULL);
    ServeSettings plain = s;
    plain.images = {};
    CHECK(term_bytes(engine_budget(gemma, s, e, memory, device), "activation_peak") >
          term_bytes(engine_budget(gemma, plain, e, memory, device), "activation_peak"));
}

TEST_CASE("serving images: a tower of any size needs the largest image's; text models none",
          "[serve][vision]") {
    const Architecture qwen = config_named("qwen2.5-vl-7b-instruct.json");
    ServeSettings s = at(8192, 4);
    s.images = {2, 0, 0};
    CHECK_THROWS_WITH(serve(qwen, s), Catch::Contains("need their size in pixels"));
    s.images = {2, 1344, 1344};  // 96 x 96 patches, 48 x 48 merged tokens
    const ServeReport r = serve(qwen, s);
    CHECK(r.encoder_tokens_per_item == 2304);
    CHECK(r.encoder_items == 4);  // 8192 tokens need 4 such images
    CHECK_THROWS_WITH(serve(preset("llama-7b"), s), Catch::Contains("has no vision tower"));
    check_refused("serve --preset llama-7b --context 512",
                  {{"--images 2 --image-size 448x448", "has no vision tower"},
                   {"--image-size 448x448", "--image-size 448x448 needs --images N"}});
}
