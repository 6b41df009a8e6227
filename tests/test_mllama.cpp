// mllama (Llama 3.2 Vision, model_type mllama): its parameters written out (the tiled tower, the
// projector, LLaMA's layers with cross-attention layers among them, an embedding of vocab + 8
// rows), its text-only steps (the cross-attention layers skipped, as MllamaTextModel skips them
// without images), serving with and without images, and the config reader's refusals.
#include <catch2/catch.hpp>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "memcalc/estimate.hpp"
#include "memcalc/engine_budget.hpp"
#include "memcalc/serve.hpp"
#include "model_file.hpp"

using namespace memcalc;
using nlohmann::json;

namespace {
/// A small mllama: 5 text layers, cross-attention at `cross`; a tower of 3 local and 2 global
/// blocks over 3 tiles of 28 x 28 pixels (2 x 2 patches and a class token each).
json mllama_config(const std::vector<std::uint64_t>& cross, std::uint64_t layers = 5) {
    return {{"model_type", "mllama"},
            {"text_config",
             {{"vocab_size", 96},
              {"hidden_size", 64},
              {"intermediate_size", 160},
              {"num_hidden_layers", layers},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"max_position_embeddings", 4096},
              {"cross_attention_layers", cross}}},
            {"vision_config",
             {{"hidden_size", 32},
              {"attention_heads", 4},
              {"intermediate_size", 48},
              {"num_hidden_layers", 3},
              {"num_global_layers", 2},
              {"image_size", 28},
              {"patch_size", 14},
              {"max_num_tiles", 3},
              {"supported_aspect_ratios", {{1, 1}, {1, 2}, {2, 1}, {1, 3}, {3, 1}}},
              {"intermediate_layers_indices", {0, 2}},
              {"vision_output_dim", 96}}}};
}

Architecture mllama_import(const json& config) {
    return cli::parse_hf_config(config.dump(), "mllama.json", "mllama").architecture;
}

/// The same model's language model without its cross-attention layers: LLaMA's layers alone.
Architecture without_cross_layers() { return mllama_import(mllama_config({}, 3)); }

/// modeling_mllama.py's tensors of the small model above, written out.
std::uint64_t small_tower_parameters() {
    const std::uint64_t hv = 32, f = 48, N = 2 * 2 + 1, tiles = 3, rows = 5 + 1;
    const std::uint64_t block = 2 * 2 * hv + 4 * hv * hv + (hv * f + f) + (f * hv + hv);
    return hv * 3 * 14 * 14               // patch_embedding, no bias
           + hv                           // class_embedding
           + N * hv + 1                   // gated_positional_embedding and its gate
           + rows * tiles * N * hv        // its tile_embedding
           + 2 * (rows * tiles * hv + 1)  // pre- and post-tile embeddings, gated
           + 2 * 2 * hv                   // layernorm_pre, layernorm_post
           + (3 + 2) * block + 2 * 2      // local and global layers, the latter's gates
           + (3 * hv) * 64 + 64;          // multi_modal_projector
}

std::uint64_t small_text_parameters(std::uint64_t self_layers, std::uint64_t cross_layers) {
    const std::uint64_t h = 64, kv = 2 * 16, f = 160;
    const std::uint64_t self = 2 * h + 2 * h * h + 2 * h * kv + 3 * h * f;
    const std::uint64_t cross = self + 2 * 16 + 2;  // q_norm, k_norm, two tanh gates
    return (96 + 8) * h + self_layers * self + cross_layers * cross + h + h * 96;
}

Report text_step(const Architecture& m, Recompute mode) {
    Settings s;
    s.seq = 256, s.micro_batch = 2, s.recompute = mode;
    s.activations = ActivationModel::architecture;
    return estimate(m, s);
}
}  // namespace

TEST_CASE("mllama's parameters: the tiled tower, the projector and the cross-attention layers",
          "[mllama][params]") {
    const cli::ModelFile vision = cli::load_hf_config(std::string(MEMCALC_SOURCE_DIR) +
                                                      "/tests/configs/llama-3.2-11b-vision.json");
    CHECK(parameter_table(vision.architecture).total().value() == 10'670'220'835);
    CHECK(parameter_table(vision.architecture).part(Part::vision).value() ==
          863'567'379 + 31'461'376);  // the tower and the projector
    CHECK_THAT(vision.description, Catch::Contains("8 cross-attention layers"));
    // Another shape, its cross-attention layers anywhere.
    const auto cross = GENERATE(std::vector<std::uint64_t>{1, 3}, std::vector<std::uint64_t>{0},
                                std::vector<std::uint64_t>{});
    const Architecture m = mllama_import(mllama_config(cross));
    CHECK(parameter_table(m).total().value() ==
          small_tower_parameters() + small_text_parameters(5 - cross.size(), cross.size()));
}

TEST_CASE("a step of text alone skips mllama's cross-attention layers", "[mllama][estimate]") {
    const Architecture m = mllama_import(mllama_config({1, 3})), plain = without_cross_layers();
    const Recompute mode = GENERATE(Recompute::none, Recompute::selective, Recompute::full);
    const Report r = text_step(m, mode), p = text_step(plain, mode);
    CHECK(r.activations.value() == p.activations.value());
    CHECK(r.kept_activations.value() == p.kept_activations.value());
    CHECK(r.compute.step == Approx(p.compute.step));
    CHECK(r.compute.recompute == Approx(p.compute.recompute));
    // Their idle parameters' weights, fp32 master copy and Adam state, at least, are on the device.
    const std::uint64_t idle = 2 * (small_text_parameters(3, 1) - small_text_parameters(4, 0));
    CHECK(r.peak_step().bytes.total().value() >= p.peak_step().bytes.total().value() + 14 * idle);
}

TEST_CASE("serving mllama without images caches its self-attention layers alone",
          "[mllama][serve]") {
    ServeSettings s;
    s.context = 1024, s.batch = 2;
    const ServeReport r = serve(mllama_import(mllama_config({1, 3})), s),
                      p = serve(without_cross_layers(), s);
    CHECK(r.kv_bytes_per_token.value() == p.kv_bytes_per_token.value());
    CHECK(r.kv_bytes_per_token.value() == 3 * 2 * 32 * 2);  // 3 layers of k and v, 2 heads of 16
}

namespace {
Report image_step(const Architecture& m, std::uint64_t images, std::uint64_t b,
                  Attention attention = Attention::eager, bool frozen_tower = false,
                  Recompute mode = Recompute::none) {
    Settings s;
    s.seq = 64, s.micro_batch = b, s.activations = ActivationModel::architecture;
    s.recompute = mode;
    s.images = {images, 0, 0};  // every image padded to its tiles: no size needed
    s.framework.attention = attention;
    if (frozen_tower) s.tuning.mode = Training::frozen, s.tuning.frozen = {"vision"};
    return estimate(m, s);
}

Count input_side_bytes(const Report& r) {
    Count sum;
    for (const SavedTensor& row : r.input_side) sum += row.bytes;
    return sum;
}

/// One eager cross-attention layer's saved bytes over s tokens (b 1) reading N image tokens,
/// written out from MllamaCrossAttentionDecoderLayer (bf16, h 64, a 4 query and k 2 key heads of
/// d 16, f 160): its RMSNorms, q/k norms per head, k and v repeated to every query head, the fp32
/// softmax and its bf16 cast, o_proj's input and the gated output, the MLP, the masked output
/// (measured to the byte on CPU: validation/cross_attention_saved.py).
std::uint64_t cross_layer_bytes(std::uint64_t s, std::uint64_t N) {
    const std::uint64_t h = 64, a = 4, k = 2, d = 16, f = 160;
    const std::uint64_t norm = 4 * s * h + 4 * s + 2 * s * h;
    const std::uint64_t q_norm = 4 * s * a * d + 4 * a * s + 2 * s * a * d;
    const std::uint64_t k_norm = 4 * N * k * d + 4 * k * N + 2 * N * k * d;
    const std::uint64_t core = 2 * s * a * d + 2 * (2 * N * a * d) + 6 * a * s * N + 2 * s * a * d;
    const std::uint64_t mlp = 2 * s * h + 4 * 2 * s * f;
    const std::uint64_t gates =
        2 * (2 + 2 * s * h);  // each tanh's one value and its product's input
    return 2 * norm + 2 * s * h + q_norm + k_norm + core + mlp + 2 * s + gates;
}
}  // namespace

TEST_CASE("mllama's images: its cross-attention layers read their tokens", "[mllama][images]") {
    const Architecture m = mllama_import(mllama_config({1, 3}));
    const std::uint64_t tile_tokens = 2 * 2 + 1, tiles = 3;
    const auto [images, b] =
        GENERATE(table<std::uint64_t, std::uint64_t>({{1, 1}, {2, 1}, {3, 2}}));
    CAPTURE(images, b);
    // Each sequence reads its share of the micro-batch's images, every one padded to its tiles.
    const std::uint64_t N = (images + b - 1) / b * tiles * tile_tokens;
    const Report r = image_step(m, images, b);
    CHECK(r.model.cross_attention_tokens == N);
    if (b == 1)
        CHECK(r.other_kinds.at(0).kept(Recompute::none).value() == cross_layer_bytes(64, N));
    // A frozen tower keeps its tiles' pixels, and the projector's output, which every k and v
    // projection reads, once.
    Settings plain;
    plain.seq = 64, plain.micro_batch = b, plain.activations = ActivationModel::architecture;
    const Report frozen = image_step(m, images, b, Attention::eager, true),
                 none = estimate(m, plain);
    const Count pixels = Count(images) * tiles * 3 * 28 * 28 * 4;
    const Count states = Count(images) * tiles * tile_tokens * 64 * 2;
    CHECK(input_side_bytes(frozen) == input_side_bytes(none) + pixels + states);
    // The two cross-attention layers' FLOPs: q and o over the tokens, k and v over the images'.
    const double T = 64.0 * b, keys = double(N) * b;
    const double cross =
        4 * T * 64 * 64 + 4 * keys * 64 * 32 + 4 * T * double(N) * 64 + 2 * T * 3 * 64 * 160;
    CHECK(image_step(m, images, b).compute.step == Approx(none.compute.step + 2 * 3 * cross));
    // Selective recomputation reruns their cores too: Q K^T and the weights over V against N keys.
    plain.recompute = Recompute::selective;
    CHECK(
        image_step(m, images, b, Attention::eager, false, Recompute::selective).compute.recompute ==
        Approx(estimate(m, plain).compute.recompute + 2 * 4 * T * double(N) * 64));
}

TEST_CASE("mllama's tower over its tiles", "[mllama][images]") {
    const Architecture m = mllama_import(mllama_config({1}));
    // Eager: every block's scores over an image's tiles at once, 3 tiles of 8 (5 padded) tokens.
    const Report eager = image_step(m, 2, 1), flash = image_step(m, 2, 1, Attention::flash);
    const std::uint64_t n = 3 * 8;
    bool mask = false;
    for (const SavedTensor& row : flash.input_side)
        if (std::string(row.op) == "vision attention mask") {
            mask = true;
            CHECK(row.bytes.value() == 2 * n * n * 2);
        }
    CHECK(mask);
    CHECK(input_side_bytes(eager) > input_side_bytes(flash));
}

TEST_CASE("serving mllama's images: its cross-attention layers cache their tokens",
          "[mllama][serve]") {
    const Architecture m = mllama_import(mllama_config({1, 3}));
    const auto [images, b, block] = GENERATE(table<std::uint64_t, std::uint64_t, std::uint64_t>(
        {{1, 1, 16}, {2, 3, 16}, {3, 2, 4}, {1, 4, 1}}));
    CAPTURE(images, b, block);
    ServeSettings s;
    s.context = 100, s.batch = b, s.block_size = block, s.images = {images, 0, 0};
    const std::uint64_t page = block;  // a lambda cannot capture a structured binding (C++17)
    const auto blocks = [page](std::uint64_t tokens) { return (tokens + page - 1) / page * page; };
    const std::uint64_t N = images * 3 * 5, layer = 2 * 2 * 16 * 2;  // k and v of 2 heads of 16
    // transformers' cache, a layer's own: 3 self-attention layers keep the text, 2 cross-attention
    // layers each image's 3 tiles of 5 tokens.
    const ServeReport own = serve(m, s);
    CHECK(own.cross_layers == 2);
    CHECK(own.cross_tokens == N);
    CHECK(own.cache_layers == 5);
    CHECK(own.kv_cache.value() == b * (3 * layer * blocks(100) + 2 * layer * blocks(N)));
    // An engine's pool: a token's slot holds all 5 layers, and the images' tokens take slots.
    s.engine_pool = true;
    CHECK(serve(m, s).kv_cache.value() == b * 5 * layer * blocks(100 + N));
    s.images = {};
    CHECK(serve(m, s).kv_cache.value() == b * 5 * layer * blocks(100));
    s.engine_pool = false;
    CHECK(serve(m, s).kv_cache.value() == b * 3 * layer * blocks(100));
}

TEST_CASE("serving mllama's images: the tower's pass and the cross-attention mask",
          "[mllama][serve]") {
    const Architecture m = mllama_import(mllama_config({1, 3}));
    const auto [chunk, images] =
        GENERATE(table<std::uint64_t, std::uint64_t>({{250, 2}, {100, 1}, {1000, 3}}));
    CAPTURE(chunk, images);
    ServeSettings s;
    s.context = 100, s.batch = 4, s.prefill_chunk = chunk, s.images = {images, 0, 0};
    const ServeReport r = serve(m, s);
    // The chunk's sequences' images at once (250 tokens: 3 sequences), each 3 tiles of 5 tokens.
    const std::uint64_t tokens = std::min<std::uint64_t>(chunk, 400);
    const std::uint64_t items = std::min<std::uint64_t>((tokens + 99) / 100, 4) * images;
    CHECK(r.encoder_items == items);
    CHECK(r.encoder_tokens_per_item == 15);
    // Kept: the projector's output (h 64) and the tower's, the last and 2 intermediate outputs.
    const std::uint64_t kept = items * 15 * (64 + 3 * 32) * 2;
    CHECK(r.encoder_outputs.value() == kept);
    // The tower: pixels (fp32, bf16), every local block's output over 3 tiles of 8 padded tokens
    // (output_hidden_states), the tiles' mask, then a block's temporaries (the stream twice and
    // the larger of q, k, v and o (4 heads of 8) and its fc1's output and GELU's) or the stacked
    // outputs.
    const std::uint64_t n = items * 24, pixels = items * 3 * 3 * 28 * 28;
    const std::uint64_t block = 2 * n * 32 * 2 + std::max(n * 4 * 32 * 2, 2 * n * 48 * 2);
    const std::uint64_t stacked = n * 2 * 32 * 2 + items * 15 * 3 * 32 * 2;
    const std::uint64_t tower =
        pixels * 6 + 4 * n * 32 * 2 + items * 24 * 24 * 2 + std::max(block, stacked);
    // The language model's: its forward's, the mask over each token's images' tokens (bf16) and
    // a layer's k and v repeated to its 4 query heads of 16, or the mask being made (int64, fp32
    // and bf16).
    const std::uint64_t mask = tokens * images * 15;
    const std::uint64_t repeated = 2 * (items * 15) * 4 * 16 * 2;
    const std::uint64_t model =
        std::max(detail::total_bytes(detail::forward_temporaries(m, tokens, 4, 1)).value() +
                     2 * mask + repeated,
                 14 * mask);
    CHECK(r.activations.value() == kept + std::max(tower, model));
}

TEST_CASE("engines serving mllama: SGLang's pool over every layer, vLLM refused",
          "[mllama][serve][engine]") {
    const Architecture m = mllama_import(mllama_config({1, 3}));
    ServeSettings s;
    s.context = 100, s.images = {2, 0, 0};
    EngineSettings e;
    e.rule = engine_rule("sglang");
    e.max_model_len = 1000;
    const Count memory(8ULL << 30);
    const EngineBudget b = engine_budget(m, s, e, memory, DeviceSettings{});
    // Pages of one token over all 5 layers; a request of 1,000 tokens and its images' 30.
    CHECK(b.kv_cache_bytes.value() == b.tokens * 5 * 128);
    CHECK(b.max_concurrency == Approx(double(b.tokens) / (1000 + 30)));
    e.rule = engine_rule("vllm", "0.6");
    CHECK_THROWS_WITH(engine_budget(m, s, e, memory, DeviceSettings{}),
                      Catch::Contains("removed it in 0.10.2"));
}

TEST_CASE("mllama's configs memcalc cannot model are refused by value", "[mllama][hf_config]") {
    const auto [path, value, message] = GENERATE(table<std::string, json, std::string>({
        {"/text_config/cross_attention_layers", {1, 5}, "entry 5 is past num_hidden_layers (5)"},
        {"/vision_config/vision_output_dim", 64, "vision_output_dim must be hidden_size x"},
        {"/vision_config/supported_aspect_ratios", 8, "supported_aspect_ratios must be an array"},
    }));
    json config = mllama_config({1});
    config[json::json_pointer(path)] = value;
    CAPTURE(path);
    CHECK_THROWS_WITH(mllama_import(config), Catch::Contains(message));
}

TEST_CASE("a model file's embedding rows and cross-attention layers are checked",
          "[mllama][model]") {
    Architecture m = mllama_import(mllama_config({1}));
    m.embedding_rows = m.vocab - 1;
    CHECK_THROWS_WITH(validate(m), Catch::Contains("embedding_rows (95) must be at least vocab"));
    m.embedding_rows = 0, m.vision.intermediate_layers = 4;
    CHECK_THROWS_WITH(validate(m),
                      Catch::Contains("intermediate_layers (4) must not exceed depth"));
    m.vision = VisionTower{};
    CHECK_THROWS_WITH(validate(m), Catch::Contains("mixer cross_attention reads a vision tower"));
}
