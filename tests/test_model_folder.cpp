// A HuggingFace model folder (--config DIR): the safetensors header reader, the checkpoint check
// tensor by tensor, and the folder through the program. Shards are synthetic: a real header over
// sparse zeros.
#include <catch2/catch.hpp>
#include <algorithm>
#include <filesystem>
#include <map>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "memcalc/params.hpp"
#include "model_folder.hpp"
#include "run_program.hpp"

using namespace memcalc;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

/// A folder of its own under the temporary directory, removed with everything in it.
struct TempFolder {
    fs::path path;
    TempFolder() {
        std::random_device random;
        path = fs::temp_directory_path() / ("memcalc_folder_" + std::to_string(random()));
        fs::create_directories(path);
    }
    ~TempFolder() {
        std::error_code ignored;
        fs::remove_all(path, ignored);
    }
    void write(const std::string& name, const std::string& text) const {
        std::ofstream(path / name, std::ios::binary) << text;
    }
};

struct Spec {
    std::string name, dtype;
    std::vector<std::uint64_t> shape;
};

/// A safetensors file: the 8-byte length, the header, then the data as a hole of zeros (never
/// written).
std::uint64_t write_safetensors(const fs::path& file, const std::vector<Spec>& tensors) {
    json header = json::object();
    std::uint64_t offset = 0;
    for (const auto& t : tensors) {
        std::uint64_t elements = 1;
        for (auto d : t.shape) elements *= d;
        const std::uint64_t bytes = (elements * cli::safetensors_dtype_bits(t.dtype) + 7) / 8;
        header[t.name] = {
            {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
        offset += bytes;
    }
    header["__metadata__"] = {{"format", "pt"}};
    const std::string text = header.dump();
    std::string length(8, '\0');
    for (int i = 0; i < 8; ++i)
        length[static_cast<std::size_t>(i)] = static_cast<char>(text.size() >> (8 * i) & 0xff);
    std::ofstream out(file, std::ios::binary);
    out << length << text;
    if (offset > 0) {
        out.seekp(static_cast<std::streamoff>(offset - 1), std::ios::cur);
        out.put('\0');
    }
    return offset;
}

/// A LLaMA-like model small enough to write by hand: h 64, 2 layers, 4 heads of 16, 2 kv heads, f
/// 128, V 100.
json tiny_config(bool tied = false) {
    return {{"model_type", "llama"},    {"hidden_size", 64},           {"num_hidden_layers", 2},
            {"num_attention_heads", 4}, {"num_key_value_heads", 2},    {"intermediate_size", 128},
            {"vocab_size", 100},        {"tie_word_embeddings", tied}, {"torch_dtype", "bfloat16"}};
}

/// Its checkpoint as transformers writes it: (out, in) matrices, every tensor in `dtype`.
std::vector<Spec> tiny_tensors(const std::string& dtype = "BF16") {
    std::vector<Spec> t{{"model.embed_tokens.weight", dtype, {100, 64}},
                        {"model.norm.weight", dtype, {64}},
                        {"lm_head.weight", dtype, {100, 64}}};
    for (int l = 0; l < 2; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        for (const Spec& s : std::vector<Spec>{{"input_layernorm.weight", dtype, {64}},
                                               {"self_attn.q_proj.weight", dtype, {64, 64}},
                                               {"self_attn.k_proj.weight", dtype, {32, 64}},
                                               {"self_attn.v_proj.weight", dtype, {32, 64}},
                                               {"self_attn.o_proj.weight", dtype, {64, 64}},
                                               {"post_attention_layernorm.weight", dtype, {64}},
                                               {"mlp.gate_proj.weight", dtype, {128, 64}},
                                               {"mlp.up_proj.weight", dtype, {128, 64}},
                                               {"mlp.down_proj.weight", dtype, {64, 128}}})
            t.push_back({p + s.name, s.dtype, s.shape});
    }
    return t;
}

/// The folder's model and check, read as the program reads it.
cli::CheckpointCheck checked(const TempFolder& folder) {
    const auto file = cli::load_model_folder(folder.path.string());
    REQUIRE(file.checkpoint);
    return *file.checkpoint;
}

const cli::CheckpointPart& part(const cli::CheckpointCheck& c, const std::string& key) {
    for (const auto& p : c.parts)
        if (p.key == key) return p;
    FAIL("no part " << key);
    return c.parts.front();
}

const std::string tiny_parameters =
    "86848";  // 2 x 100 x 64 + 64 + 2 x (2 x 64 + 64 x 64 x 2 + 2 x 32 x 64 + 3 x 64 x 128)

}  // namespace

TEST_CASE("the tiny model's count, by hand", "[model_folder]") {
    const auto m = cli::parse_hf_config(tiny_config().dump(), "c.json", "c").architecture;
    CHECK(parameter_table(m).total().value() == std::stoull(tiny_parameters));
}

TEST_CASE("safetensors headers: each tensor's dtype, shape and bytes; the data never read",
          "[model_folder]") {
    TempFolder folder;
    const std::uint64_t data = write_safetensors(
        folder.path / "a.safetensors",
        {{"w", "BF16", {3, 5}}, {"s", "F32", {2}}, {"b", "U8", {4, 2, 16}}, {"e", "F4", {3}}});
    CHECK(data == 30 + 8 + 128 + 2);
    const auto tensors = cli::read_safetensors_header((folder.path / "a.safetensors").string());
    REQUIRE(tensors.size() == 4);
    std::map<std::string, cli::SafetensorsTensor> by_name;
    for (const auto& t : tensors) by_name[t.name] = t;
    CHECK(by_name["w"].elements == 15);
    CHECK(by_name["w"].bytes == 30);
    CHECK(by_name["b"].shape == std::vector<std::uint64_t>{4, 2, 16});
    CHECK(by_name["e"].bytes == 2);  // three 4-bit values take two bytes
}

TEST_CASE("a malformed safetensors header: the file named and what is wrong", "[model_folder]") {
    using Row = std::pair<std::string, std::string>;
    const auto with_length = [](std::uint64_t n) {
        std::string s(8, '\0');
        for (int i = 0; i < 8; ++i)
            s[static_cast<std::size_t>(i)] = static_cast<char>(n >> (8 * i) & 0xff);
        return s;
    };
    const auto file = [&](const std::string& header, const std::string& data) {
        return with_length(header.size()) + header + data;
    };
    const auto [bytes, message] = GENERATE_COPY(table<std::string, std::string>({
        Row{"abc",
            "x.safetensors: truncated: 3 bytes, and a safetensors file starts with an 8-byte "
            "header length"},
        Row{with_length(1000) + "{}",
            "x.safetensors: header length 1000 runs past the end of the file (10 bytes)"},
        Row{with_length(200'000'000) + "{}",
            "header length 200000000 is over the format's limit of 100,000,000 bytes"},
        Row{file("hello", ""), "x.safetensors (header): malformed JSON"},
        Row{file("[]", ""), "x.safetensors: the header is not a JSON object (got array)"},
        Row{file(R"({"w":{"dtype":"BF16","shape":[2,2]}})", ""),
            "tensor 'w' needs dtype, shape and data_offsets"},
        Row{file(R"({"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,1]}})", "x"),
            "tensor 'w': dtype 'Q4' is not a safetensors dtype"},
        Row{file(R"({"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}})", "1234"),
            "tensor 'w': data_offsets [0, 8] fall outside the file's 4 bytes of data (truncated?)"},
        Row{file(R"({"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,6]}})", "123456"),
            "tensor 'w': 6 bytes of data, but BF16 of this shape takes 8"},
        Row{file(R"({"w":{"dtype":"BF16","shape":[2,-2],"data_offsets":[0,8]}})", "12345678"),
            "tensor 'w': shape must be an array of non-negative integers"},
        // The ranges must tile the data: two tensors on the same bytes are no checkpoint.
        Row{file(R"({"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}})",
                 "12345678"),
            "x.safetensors: tensor 'a' [0, 8] and tensor 'b' [0, 8] overlap "
            "(the tensors' data_offsets must tile the data)"},
        Row{file(R"({"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[4,12]},)"
                 R"("b":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}})",
                 "123456789012"),
            "tensor 'b' [0, 8] and tensor 'a' [4, 12] overlap"},
        Row{file(R"({"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"BF16","shape":[2,2],"data_offsets":[12,20]}})",
                 std::string(20, 'x')),
            "bytes 8 to 12 of the data are in no tensor "
            "(between tensor 'a' [0, 8] and tensor 'b' [12, 20])"},
        Row{file(R"({"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[4,12]}})", "123456789012"),
            "bytes 0 to 4 of the data are in no tensor (before tensor 'a' [4, 12])"},
        Row{file(R"({"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}})", "1234567890"),
            "bytes 8 to 10 of the data are in no tensor (after tensor 'a' [0, 8])"},
        Row{file(R"({"__metadata__":{}})", "12"),
            "bytes 0 to 2 of the data are in no tensor (the header names none)"},
    }));
    CAPTURE(bytes);
    CHECK_THROWS_WITH(cli::parse_safetensors_header(bytes, bytes.size(), "x.safetensors"),
                      Catch::Contains(message));
}

TEST_CASE("safetensors data_offsets that tile the data, in any order, empty ones anywhere",
          "[model_folder]") {
    const std::string header = R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                               R"("a":{"dtype":"U8","shape":[3],"data_offsets":[8,11]},)"
                               R"("e":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)"
                               R"("z":{"dtype":"F32","shape":[2,0],"data_offsets":[11,11]}})";
    std::string bytes(8, '\0');
    bytes[0] = static_cast<char>(header.size() & 0xff);
    bytes[1] = static_cast<char>(header.size() >> 8);
    bytes += header + "01234567890";
    const auto tensors = cli::parse_safetensors_header(bytes, bytes.size(), "x.safetensors");
    REQUIRE(tensors.size() == 4);
    CHECK(tensors[0].name == "a");
    CHECK(tensors[0].offset == 8);
    CHECK(tensors[0].bytes == 3);
}

TEST_CASE("a checkpoint that is memcalc's table exactly: no difference, every layer matched",
          "[model_folder]") {
    for (const std::string dtype : {"BF16", "F32"}) {
        CAPTURE(dtype);
        TempFolder folder;
        json config = tiny_config();
        config["torch_dtype"] = dtype == "BF16" ? "bfloat16" : "float32";
        folder.write("config.json", config.dump());
        const std::uint64_t bytes =
            write_safetensors(folder.path / "model.safetensors", tiny_tensors(dtype));
        const auto c = checked(folder);
        CHECK(c.from_headers);
        CHECK(c.tensors == 21);
        CHECK(c.parameters == std::stoull(tiny_parameters));
        CHECK(c.bytes == bytes);
        CHECK(c.expected_bytes == c.parameters * (dtype == "BF16" ? 2 : 4));
        CHECK(c.difference == 0);
        CHECK(c.unexplained == 0);
        CHECK(c.modelled_elements == c.parameters);
        CHECK(c.layer_differences.empty());
        REQUIRE(c.dtypes.size() == 1);
        CHECK(c.dtypes[0].dtype == dtype);
        CHECK(c.dtypes[0].elements == c.parameters);
        for (const auto& p : c.parts) CHECK(p.tensors == 0);
    }
}

TEST_CASE("what a checkpoint holds beyond the table, each in its part and exact",
          "[model_folder]") {
    TempFolder folder;
    auto tensors = tiny_tensors();
    tensors.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {8}});  // 32 bytes
    tensors.push_back({"model.layers.1.self_attn.rotary_emb.inv_freq", "F32", {8}});  // 32 bytes
    tensors.push_back({"model.vision_tower.patch_embed.weight", "BF16", {10, 10}});   // 200 bytes
    tensors.push_back(
        {"model.layers.2.eh_proj.weight", "BF16", {64, 128}});         // 16,384 bytes: an MTP layer
    tensors.push_back({"model.layers.2.enorm.weight", "BF16", {64}});  // 128 bytes
    for (auto& t : tensors)
        if (t.name == "model.norm.weight")
            t.dtype = "F32";  // 64 x (4 - 2) = 128 bytes more than memcalc's
    // The second shard: a split checkpoint reads every *.safetensors when there is no index.
    std::vector<Spec> first(tensors.begin(), tensors.begin() + 10),
        second(tensors.begin() + 10, tensors.end());
    folder.write("config.json", tiny_config().dump());
    write_safetensors(folder.path / "model-00001-of-00002.safetensors", first);
    write_safetensors(folder.path / "model-00002-of-00002.safetensors", second);
    const auto c = checked(folder);
    CHECK(c.source == "2 safetensors headers");
    CHECK(c.tensors == 26);
    CHECK(c.difference == 64 + 200 + 16384 + 128 + 128);
    CHECK(part(c, "rotary_inv_freq").tensors == 2);
    CHECK(part(c, "rotary_inv_freq").bytes == 64);
    CHECK(part(c, "other_modules").bytes == 200);
    CHECK(part(c, "mtp_layers").tensors == 2);
    CHECK(part(c, "mtp_layers").bytes == 16384 + 128);
    CHECK(part(c, "mtp_layers").first == "model.layers.2.eh_proj.weight");
    CHECK(part(c, "other_dtypes").bytes == 128);
    CHECK(c.unexplained == 0);
    CHECK(c.layer_differences.empty());  // the extra tensors are not counted into layers 0 and 1
}

TEST_CASE("a tied head written twice, and a layer that differs from memcalc's rows",
          "[model_folder]") {
    TempFolder folder;
    auto tensors = tiny_tensors();
    tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                                 [](const Spec& s) {
                                     return s.name == "model.layers.1.self_attn.k_proj.weight";
                                 }),
                  tensors.end());
    folder.write("config.json", tiny_config(true).dump());
    write_safetensors(folder.path / "model.safetensors", tensors);
    const auto c = checked(folder);
    CHECK(c.parameters ==
          std::stoull(tiny_parameters) - 100 * 64);  // tied: the embedding counted once
    CHECK(part(c, "tied_head_copy").tensors == 1);
    CHECK(part(c, "tied_head_copy").bytes == 100 * 64 * 2);
    CHECK(c.unexplained == -32 * 64 * 2);  // the k_proj the checkpoint lacks
    REQUIRE(c.layer_differences.size() == 1);
    CHECK(c.layer_differences[0].layer == 1u);
    CHECK(c.layer_differences[0].memcalc - c.layer_differences[0].checkpoint == 32 * 64);
}

TEST_CASE(
    "fp8 weights with block scales, and MXFP4 blocks: from the shards and from the index alone",
    "[model_folder]") {
    auto tensors = tiny_tensors();
    for (auto& t : tensors)
        if (t.name.find("q_proj") != std::string::npos ||
            t.name.find("gate_proj") != std::string::npos)
            t.dtype = "F8_E4M3";
    tensors.push_back({"model.layers.0.self_attn.q_proj.weight_scale_inv", "F32", {1, 1}});
    tensors.push_back({"model.layers.1.self_attn.q_proj.weight_scale_inv", "F32", {1, 1}});
    tensors.push_back({"model.layers.0.mlp.gate_proj.weight_scale_inv", "F32", {1, 1}});
    tensors.push_back({"model.layers.1.mlp.gate_proj.weight_scale_inv", "F32", {1, 1}});
    // Layer 1's down_proj as MXFP4: 64 x 128 values, two a byte in 32-value blocks, one scale a
    // block.
    tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                                 [](const Spec& s) {
                                     return s.name == "model.layers.1.mlp.down_proj.weight";
                                 }),
                  tensors.end());
    tensors.push_back({"model.layers.1.mlp.down_proj_blocks", "U8", {64, 4, 16}});
    tensors.push_back({"model.layers.1.mlp.down_proj_scales", "U8", {64, 4}});
    json config = tiny_config();
    config["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
    const std::int64_t fp8 =
        -2 * (64 * 64 + 128 * 64);  // two of each, a byte each where memcalc counts two

    TempFolder folder;
    folder.write("config.json", config.dump());
    const std::uint64_t bytes = write_safetensors(folder.path / "model.safetensors", tensors);
    const auto c = checked(folder);
    CHECK(part(c, "fp8_weights").tensors == 4);
    CHECK(part(c, "fp8_weights").bytes == fp8);
    CHECK(part(c, "fp8_scales").bytes == 4 * 4);
    CHECK(part(c, "mxfp4_blocks").bytes == 4096 - 64 * 128 * 2);
    CHECK(part(c, "mxfp4_scales").bytes == 256);
    CHECK(c.unexplained == 0);
    CHECK(c.layer_differences.empty());  // the blocks hold down_proj's 8,192 values
    std::map<std::string, std::uint64_t> by_dtype;
    for (const auto& d : c.dtypes) by_dtype[d.dtype] = d.tensors;
    CHECK(by_dtype == std::map<std::string, std::uint64_t>{
                          {"BF16", 16}, {"F32", 4}, {"F8_E4M3", 4}, {"U8", 2}});

    // The index alone: fp8 weights and their scales from the shapes memcalc knows; MXFP4's unknown.
    TempFolder index_only;
    index_only.write("config.json", config.dump());
    json weight_map = json::object();
    for (const auto& t : tensors) weight_map[t.name] = "model-00001-of-00001.safetensors";
    index_only.write(
        "model.safetensors.index.json",
        json{{"metadata", {{"total_size", bytes}}}, {"weight_map", weight_map}}.dump());
    const auto i = checked(index_only);
    CHECK_FALSE(i.from_headers);
    CHECK(i.bytes == bytes);
    CHECK(i.difference == c.difference);
    CHECK(part(i, "fp8_weights").bytes == fp8);
    CHECK(part(i, "fp8_scales").bytes == 4 * 4);
    CHECK(part(i, "mxfp4_blocks").tensors == 1);
    CHECK_FALSE(part(i, "mxfp4_blocks").bytes);
    CHECK_FALSE(i.unexplained);
    CHECK(i.left_to_unknown ==
          4096 - 64 * 128 * 2 + 256);  // what the MXFP4 tensors hold, less memcalc's bf16
}

TEST_CASE(
    "a real index with rotary buffers: LLaMA 7B's 32 inv_freq tensors hold the 8,192 bytes over",
    "[model_folder]") {
    // Pygmalion-7b: LLaMA 7B's shapes (the chapter's 6,738,415,616), saved by transformers 4.28
    // with each layer's rotary inv_freq (64 fp32 values, head_dim / 2).
    const auto file =
        cli::load_model_folder(std::string(MEMCALC_SOURCE_DIR) + "/tests/models/pygmalion-7b");
    REQUIRE(file.checkpoint);
    const auto& c = *file.checkpoint;
    CHECK(c.parameters == 6738415616u);
    CHECK(c.tensors == 323);
    CHECK(c.difference == 13476839424 - 2 * 6738415616);
    CHECK(c.difference == 32 * 64 * 4);
    CHECK(part(c, "rotary_inv_freq").tensors == 32);
    CHECK_FALSE(
        part(c, "rotary_inv_freq").bytes);  // the dtype is in the shards' headers, not the index
    CHECK(c.left_to_unknown == 8192);
    CHECK_FALSE(c.unexplained);
}

TEST_CASE("a real model folder's index: Phi-3-mini's total_size is memcalc's count in bfloat16",
          "[model_folder][cli]") {
    const std::string folder = std::string(MEMCALC_SOURCE_DIR) + "/tests/models/phi3-3b-slerp";
    const auto file = cli::load_model_folder(folder);
    CHECK(file.architecture.name == "phi3-3b-slerp");
    REQUIRE(file.checkpoint);
    const auto& c = *file.checkpoint;
    CHECK(c.tensors == 195);
    CHECK(c.bytes == 7642159104u);
    CHECK(c.parameters ==
          3821079552u);  // Phi-3-mini's published count (tests/configs/manifest.json)
    CHECK(c.difference == 0);
    CHECK(c.unexplained == 0);

    const auto run = testing::memcalc("--config " + folder + " --seq 4096 --format json");
    REQUIRE(run.status == 0);
    const json out = json::parse(run.out)["checkpoint"];
    CHECK(out["bytes"] == 7642159104u);
    CHECK(out["expected_bytes"] == 7642159104u);
    CHECK(out["difference"] == 0);
    CHECK(out["dtype"] == "bfloat16");
    CHECK(out["parts"]["tied_head_copy"]["tensors"] == 0);
    CHECK(out["dtypes"].is_null());
    const auto table = testing::memcalc("--config " + folder + " --seq 4096");
    REQUIRE(table.status == 0);
    CHECK_THAT(table.out, Catch::Contains("memcalc: 3,821,079,552 parameters x 2 B (bfloat16)"));
    CHECK_THAT(table.out, Catch::Contains("7,642,159,104"));
}

TEST_CASE(
    "a model folder through the program: the check in the table and JSON, and bad folders refused",
    "[model_folder][cli]") {
    TempFolder folder;
    folder.write("config.json", tiny_config().dump());
    write_safetensors(folder.path / "model.safetensors", tiny_tensors());
    const auto run =
        testing::memcalc("--config " + folder.path.string() + " --seq 16 --format json");
    REQUIRE(run.status == 0);
    const json out = json::parse(run.out);
    CHECK(out["parameters"]["total"] == std::stoull(tiny_parameters));
    CHECK(out["checkpoint"]["modelled_elements"] == std::stoull(tiny_parameters));
    CHECK(out["checkpoint"]["dtypes"][0]["bytes"] == 2 * std::stoull(tiny_parameters));
    CHECK(out["checkpoint"]["layer_differences"].empty());
    const auto table = testing::memcalc("--config " + folder.path.string() + " --seq 16");
    CHECK_THAT(table.out,
               Catch::Contains("Every layer and the tensors outside the layers hold the elements"));

    // Each bad folder: one line on stderr naming the file, exit 1, nothing on stdout.
    TempFolder bad;
    const std::string dir = bad.path.string();
    const auto refused = [&](const std::string& message) {
        const auto r = testing::memcalc("--config " + dir + " --seq 16");
        CHECK(r.status == 1);
        CHECK(r.out.empty());
        CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
        CHECK_THAT(r.err, Catch::Contains(message));
    };
    refused(dir + ": no config.json in this folder");
    bad.write("config.json", tiny_config().dump());
    bad.write("model.safetensors.index.json", "{\"weight_map\": ");
    refused(dir + "/model.safetensors.index.json: malformed JSON");
    bad.write("model.safetensors.index.json", R"({"metadata": {"total_size": 10}})");
    refused("model.safetensors.index.json: expected an object with a weight_map object");
    bad.write("model.safetensors.index.json",
              R"({"weight_map": {"a": "one.safetensors", "b": "two.safetensors"}})");
    write_safetensors(bad.path / "one.safetensors", {{"a", "BF16", {2}}});
    refused(
        "names two.safetensors, which is not in the folder (1 of 2 shards missing: a partial "
        "download?)");
    bad.write("model.safetensors.index.json", R"({"weight_map": {"a": "one.safetensors"}})");
    write_safetensors(bad.path / "one.safetensors", {{"a", "BF16", {2}}, {"b", "BF16", {2}}});
    refused("model.safetensors.index.json: does not name 'b', which a shard holds");
    fs::remove(bad.path / "model.safetensors.index.json");
    write_safetensors(bad.path / "two.safetensors", {{"a", "BF16", {2}}});
    refused(dir + "/two.safetensors: tensor 'a' is in one.safetensors too");
    fs::remove(bad.path / "one.safetensors");
    fs::remove(bad.path / "two.safetensors");
    json unknown_dtype = tiny_config();
    unknown_dtype.erase("torch_dtype");
    unknown_dtype["dtype"] = "int4";
    bad.write("config.json", unknown_dtype.dump());
    write_safetensors(bad.path / "one.safetensors", {{"a", "BF16", {2}}});
    refused("config.json: dtype 'int4' is not a dtype memcalc knows");
    fs::remove(bad.path / "one.safetensors");
    bad.write("config.json", tiny_config().dump());
    bad.write("model.safetensors", std::string("\x10\0\0\0\0\0\0\0{\"a\":", 13));
    refused(dir + "/model.safetensors: header length 16 runs past the end of the file (13 bytes)");
}
