// Vision towers (vision.hpp): Qwen2.5-VL's and Qwen3-VL's, their parameters tensor by tensor as
// transformers holds them, against the checkpoints' published totals; the tower frozen, written
// to a model file and read back, and its bad values refused.
#include <catch2/catch.hpp>
#include <fstream>

#include <nlohmann/json.hpp>
#include <string>

#include "memcalc/estimate.hpp"
#include "memcalc/finetune.hpp"
#include "model_file.hpp"

using namespace memcalc;
using nlohmann::json;

namespace {
const std::string vl_configs = std::string(MEMCALC_SOURCE_DIR) + "/tests/configs/";

/// A tower's parameters by hand: the patch embedding, the position table, D blocks, the merger
/// and the deepstack mergers (Qwen3-VL's norm after the merge, so over the merged width).
std::uint64_t tower(const VisionTower& v) {
    const std::uint64_t h = v.hidden, f = v.ffn, hm = h * v.merge * v.merge, o = v.out_hidden;
    const std::uint64_t norm = v.layernorm ? 2 : 1;
    const std::uint64_t patch =
        h * v.channels * v.temporal_patch * v.patch * v.patch + (v.patch_bias ? h : 0);
    const std::uint64_t mlp = v.gated_mlp ? 3 * h * f + 2 * f + h : 2 * h * f + f + h;
    const std::uint64_t block = 2 * norm * h + 3 * h * h + 3 * h + h * h + h + mlp;
    const std::uint64_t merge_linears = hm * hm + hm + hm * o + o;
    return patch + v.position_rows * h + v.depth * block + norm * h + merge_linears +
           v.deepstack * (2 * hm + merge_linears);
}
}  // namespace

TEST_CASE("Qwen2.5-VL 7B: its tower and language model, the checkpoint's total",
          "[vision][hf_config][params]") {
    const cli::ModelFile file = cli::load_hf_config(vl_configs + "qwen2.5-vl-7b-instruct.json");
    const Architecture& m = file.architecture;
    const VisionTower& v = m.vision;
    CHECK(v.depth == 32);
    CHECK(v.hidden == 1280);
    CHECK(v.gated_mlp);
    CHECK_FALSE(v.layernorm);
    CHECK(v.out_hidden == m.hidden);
    const ParameterTable t = parameter_table(m);
    CHECK(t.part(Part::vision).value() == tower(v));
    CHECK(t.part(Part::vision).value() == 676550144u);  // the checkpoint's 'visual' module
    CHECK(t.total().value() == 8292166656u);
    REQUIRE_FALSE(file.notes.empty());
    CHECK_THAT(file.notes.back(), Catch::Contains("without them the step is text-only"));
}

TEST_CASE("Qwen3-VL 4B: LayerNorms, a position table and three deepstack mergers",
          "[vision][hf_config][params]") {
    const Architecture m =
        cli::load_hf_config(vl_configs + "qwen3-vl-4b-instruct.json").architecture;
    const VisionTower& v = m.vision;
    CHECK(v.deepstack == 3);
    CHECK(v.position_rows == 2304);
    CHECK(v.layernorm);
    CHECK(v.patch_bias);
    CHECK(m.tied_embeddings);  // text_config's, over the top level's
    const ParameterTable t = parameter_table(m);
    CHECK(t.part(Part::vision).value() == tower(v));
    CHECK(t.total().value() == 4437815808u);
}

TEST_CASE("Towers of other shapes count as their tensors do", "[vision][params]") {
    const auto [depth, hidden, ffn, merge, deepstack, gated] = GENERATE(
        table<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, bool>(
            {{1, 64, 96, 1, 0, true}, {3, 48, 80, 2, 2, false}, {2, 96, 64, 3, 1, false}}));
    Architecture m;
    m.name = "tiny-vl", m.hidden = 64, m.layers = 2, m.heads = 4, m.ffn = 128, m.vocab = 100;
    const ParameterTable text = parameter_table(m);
    VisionTower& v = m.vision;
    v.depth = depth, v.hidden = hidden, v.heads = 4, v.ffn = ffn, v.patch = 4;
    v.temporal_patch = 2, v.merge = merge, v.out_hidden = 64, v.deepstack = deepstack;
    v.gated_mlp = gated, v.layernorm = !gated, v.patch_bias = !gated;
    v.position_rows = gated ? 0 : 16;
    const ParameterTable t = parameter_table(m);
    CHECK(t.part(Part::vision).value() == tower(v));
    CHECK(t.total() == text.total() + t.part(Part::vision));
}

TEST_CASE("A frozen tower keeps its weights alone", "[vision][finetune]") {
    const Architecture m =
        cli::load_hf_config(vl_configs + "qwen2.5-vl-7b-instruct.json").architecture;
    const ParameterTable all = parameter_table(m);
    FineTuning f;
    f.mode = Training::frozen;
    f.frozen = {"vision"};
    CHECK(trainable_parameters(fine_tuned_table(m, all, f)).value() == 7615616512u);
    Settings s;
    s.seq = 256, s.activations = ActivationModel::architecture, s.tuning = f;
    const Report r = Estimator(m).estimate(s);
    CHECK(r.state.weights == all.total() * 2);
    CHECK(r.state.gradients == Count(7615616512u) * 2);
}

TEST_CASE("A tower is written to a model file and read back; bad values are refused",
          "[vision][model_file]") {
    const Architecture m =
        cli::load_hf_config(vl_configs + "qwen3-vl-4b-instruct.json").architecture;
    json file = {{"name", "vl"},     {"hidden", m.hidden}, {"layers", m.layers},
                 {"heads", m.heads}, {"ffn", m.ffn},       {"vocab", m.vocab}};
    json& v = file["vision"];
    for (const auto& f : vision_counts) v[std::string(f.key)] = m.vision.*f.member;
    for (const auto& f : vision_flags) v[std::string(f.key)] = m.vision.*f.member;
    const Architecture back = cli::parse_model_json(file.dump(), "vl.json", "vl").architecture;
    CHECK(parameter_table(back).part(Part::vision) == parameter_table(m).part(Part::vision));
    v["heads"] = 7;
    CHECK_THROWS_WITH(cli::parse_model_json(file.dump(), "vl.json", "vl"),
                      Catch::Contains("vision heads (7) must divide vision hidden (1024)"));
    v["heads"] = 16, v["depht"] = 2;
    CHECK_THROWS_WITH(cli::parse_model_json(file.dump(), "vl.json", "vl"),
                      Catch::Contains("unknown key 'depht'"));
    v.erase("depht"), v["merge"] = 0;
    CHECK_THROWS_WITH(cli::parse_model_json(file.dump(), "vl.json", "vl"),
                      Catch::Contains("vision merge must be a positive integer (got 0)"));
}

TEST_CASE("Qwen3.5: Qwen3-Next's layers, dense or experts, Qwen3-VL's tower, the mtp module",
          "[vision][hf_config][params][qwen3_next]") {
    // The checkpoints' safetensors totals hold the mtp.* module transformers leaves out.
    const auto [config, experts, tower_count, language_model, with_mtp] =
        GENERATE(table<const char*, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t>(
            {{"qwen3.5-0.8b.json", 0, 100592896u, 752393024u, 873438784u},
             {"qwen3.5-9b.json", 0, 456010480u, 8953803264u, 9653104368u},
             {"qwen3.6-27b.json", 0, 460730096u, 26895998464u, 27781427952u},
             {"qwen3.5-35b-a3b.json", 256, 446571248u, 34660610688u, 35951822704u}}));
    CAPTURE(config);
    const cli::ModelFile file = cli::load_hf_config(vl_configs + config);
    Architecture m = file.architecture;
    CHECK(m.vision.deepstack == 0);
    CHECK(m.attention_output_gate);
    CHECK(m.experts == experts);
    CHECK(m.shared_expert_gate == (experts > 0));
    const ParameterTable t = parameter_table(m);
    CHECK(t.part(Part::vision).value() == tower(m.vision));
    CHECK(t.part(Part::vision).value() == tower_count);
    CHECK(t.total().value() == tower_count + language_model);
    m.mtp_layers = 1;
    CHECK(parameter_table(m).total().value() == with_mtp);
    REQUIRE(file.notes.size() >= 2);
    CHECK_THAT(file.notes.front(), Catch::Contains("multi-token-prediction module"));
}

namespace {
/// One estimate of `config` at 4096 tokens with `images` of 448 x 448 (1,024 patches each).
Report with_images(const Architecture& m, std::uint64_t images, Recompute mode, bool frozen = false,
                   Attention attention = Attention::flash) {
    Settings s;
    s.seq = 4096, s.activations = ActivationModel::architecture, s.recompute = mode;
    s.framework.attention = attention;
    s.images = {images, 448, 448};
    if (frozen) s.tuning.mode = Training::frozen, s.tuning.frozen = {"vision"};
    return Estimator(m).estimate(s);
}

Count input_side(const Report& r) {
    Count sum;
    for (const SavedTensor& row : r.input_side) sum += row.bytes;
    return sum;
}
}  // namespace

TEST_CASE("A micro-batch's images: pixels, the tower's blocks, its mergers", "[vision][images]") {
    const Architecture m =
        cli::load_hf_config(vl_configs + "qwen2.5-vl-7b-instruct.json").architecture;
    const VisionTower& v = m.vision;
    CHECK(patches_per_image(v, {1, 448, 448}) == 32 * 32);
    CHECK(patches_per_image(v, {1, 460, 300}) == 32 * 22);  // to the nearest multiple of 28
    CHECK(patches_per_image(v, {1, 10, 10}) == 2 * 2);      // at least one merged token a side
    const auto [images, mode, attention] = GENERATE(
        table<std::uint64_t, Recompute, Attention>({{1, Recompute::none, Attention::flash},
                                                    {3, Recompute::none, Attention::eager},
                                                    {2, Recompute::full, Attention::flash}}));
    CAPTURE(images, mode, attention);
    const Count none = input_side(with_images(m, 0, mode, false, attention));
    const Count n = Count(1024) * images, pixels = n * (3 * 2 * 14 * 14) * 4;
    const Count mergers = n * 1280 * (4 + 3 * 2);
    Count tower;
    if (mode == Recompute::full) {
        tower = n * 1280 * 2 * 32;  // each block's input
    } else {
        const LayerActivations block = architecture_layer(tower_block(v, 1024), 1024, images,
                                                          Precision(DType::bf16), attention);
        tower = n * (3 * 2 * 14 * 14) * 2 + block.total() * 32;  // the cast pixels, 32 blocks
    }
    CHECK(input_side(with_images(m, images, mode, false, attention)) ==
          none + pixels + tower + mergers);
    // A frozen tower keeps its images' pixels alone.
    CHECK(input_side(with_images(m, images, mode, true, attention)) == none + pixels);
    CHECK(with_images(m, images, mode).peak_step().bytes.total() >
          with_images(m, images, mode, true).peak_step().bytes.total());
}

TEST_CASE("images need a tower and a size", "[vision][images]") {
    Settings s;
    s.seq = 512, s.activations = ActivationModel::architecture, s.images = {2, 448, 448};
    Architecture text;
    text.name = "text-only", text.hidden = 64, text.layers = 2, text.heads = 4, text.ffn = 128,
    text.vocab = 100;
    CHECK_THROWS_WITH(Estimator(text).estimate(s), Catch::Contains("has no vision tower"));
    const Architecture m =
        cli::load_hf_config(vl_configs + "qwen3-vl-4b-instruct.json").architecture;
    s.images = {2, 0, 448};
    CHECK_THROWS_WITH(Estimator(m).estimate(s), Catch::Contains("need their size in pixels"));
}

TEST_CASE("Gemma 3: SigLIP's tower and the pooled projector, counted and run", "[vision][gemma3]") {
    // The published totals of Gemma3ForConditionalGeneration; the tower and projector:
    // patch 1152 x (3 x 14 x 14 + 1), positions 4096 x 1152, 27 blocks of 15,239,504, the
    // post-LayerNorm 2 x 1152, the projector's norm 1152 and its 1152 x h linear.
    const auto [config, hidden, total] = GENERATE(table<const char*, std::uint64_t, std::uint64_t>(
        {{"gemma-3-4b-it.json", 2560, 4300079472u},
         {"gemma-3-12b-it.json", 3840, 12187325040u},
         {"gemma-3-27b-it.json", 5376, 27432406640u}}));
    CAPTURE(config);
    const cli::ModelFile file = cli::load_hf_config(vl_configs + config);
    CHECK(file.description.find("the language model alone") == std::string::npos);
    const Architecture& m = file.architecture;
    const VisionTower& v = m.vision;
    CHECK(v.merge == 4);  // 64 x 64 patches pooled to 16 x 16 tokens
    CHECK(v.out_hidden == hidden);
    const ParameterTable t = parameter_table(m);
    CHECK(t.part(Part::vision).value() ==
          1152u * 589 + 4096 * 1152 + 27 * 15239504u + 2 * 1152 + 1152 + 1152 * hidden);
    CHECK(t.total().value() == total);
    // Every image is resized to 896 x 896: 4,096 patches whatever its size.
    CHECK(patches_per_image(v, {1, 448, 300}) == 4096);
    CHECK(patches_per_image(v, {1, 0, 0}) == 4096);
}

TEST_CASE("Gemma 3's images: the tower's blocks, its post-norm and projector rows",
          "[vision][gemma3][images]") {
    const Architecture m = cli::load_hf_config(vl_configs + "gemma-3-4b-it.json").architecture;
    const std::uint64_t images = GENERATE(1, 3);
    Settings s;
    s.seq = 2048, s.activations = ActivationModel::architecture;
    s.framework.attention = Attention::flash;
    const Count none = input_side(Estimator(m).estimate(s));
    s.images = {images, 0, 0};  // no size: the processor resizes each to 896 x 896
    const Count n = Count(4096) * images, tokens = Count(256) * images;
    const LayerActivations block = architecture_layer(tower_block(m.vision, 4096), 4096, images,
                                                      Precision(DType::bf16), Attention::flash);
    const Count pixels = n * 588 * 4, cast = n * 588 * 2, tower = block.total() * 27;
    // The post-LayerNorm's input and fp32 statistics, the average pool's contiguous input, the
    // pooled RMSNorm's fp32 input, 1/rms and fp32 output (Gemma's), the projection's input.
    const Count projector = n * 1152 * 2 + n * 2 * 4 + n * 1152 * 2 + tokens * 1152 * 4 +
                            tokens * 4 + tokens * 1152 * 4 + tokens * 1152 * 2;
    CHECK(input_side(Estimator(m).estimate(s)) == none + pixels + cast + tower + projector);
    // Before torch 2.2 the RMSNorm's mean keeps x^2 in fp32 too (the kernel facts' row).
    s.framework.torch = TorchVersion::v1_13;
    const Count none_113 = [&] {
        Settings text = s;
        text.images = {};
        return input_side(Estimator(m).estimate(text));
    }();
    const LayerActivations block_113 =
        architecture_layer(tower_block(m.vision, 4096), 4096, images, Precision(DType::bf16),
                           Attention::flash, Runtime(Platform::cuda, TorchVersion::v1_13));
    CHECK(input_side(Estimator(m).estimate(s)) ==
          none_113 + pixels + cast + block_113.total() * 27 + projector + tokens * 1152 * 4);
    // q, k and v apart (SigLIP's), one storage of their input either way.
    CHECK_FALSE(tower_block(m.vision, 4096).fused_qkv);
}

TEST_CASE("gemma3's tower: what it cannot read is named", "[vision][gemma3][hf_config]") {
    json file = json::parse(std::ifstream(vl_configs + "gemma-3-4b-it.json"));
    file["vision_config"]["vision_use_head"] = true;
    CHECK_THROWS_WITH(cli::parse_hf_config(file.dump(), "g.json", "g"),
                      Catch::Contains("vision_use_head true (SigLIP's attention-pooling head) is "
                                      "not modelled"));
    file["vision_config"]["vision_use_head"] = false, file["mm_tokens_per_image"] = 200;
    CHECK_THROWS_WITH(cli::parse_hf_config(file.dump(), "g.json", "g"),
                      Catch::Contains("mm_tokens_per_image 200 must be the square of a divisor of "
                                      "image_size / patch_size (64)"));
    file.erase("vision_config");
    CHECK_THROWS_WITH(cli::parse_hf_config(file.dump(), "g.json", "g"),
                      Catch::Contains("needs its vision tower's keys in a vision_config object"));
}
