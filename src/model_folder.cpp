// A HuggingFace model folder: config.json, and the checkpoint's index or safetensors headers, each
// tensor sorted by what memcalc's parameter table holds of it.
#include "model_folder.hpp"

#include <algorithm>
#include <array>
#include <filesystem>
#include <map>
#include <set>

#include "json_reader.hpp"
#include "memcalc/params.hpp"

namespace memcalc::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

/// What a checkpoint tensor is to memcalc, from its name (and, in the shards, its dtype).
enum Role : std::size_t {
    rotary_inv_freq,  ///< a rotary buffer older checkpoints saved: no parameters
    tied_head_copy,   ///< lm_head.weight written beside the embedding it is tied to
    mtp_layers,       ///< layers.N, N >= num_hidden_layers: DeepSeek-V3's multi-token prediction
    fp8_weights,      ///< a parameter memcalc counts, stored in one byte
    fp8_scales,       ///< weight_scale_inv: one fp32 per 128 x 128 block of an fp8 weight
    mxfp4_blocks,     ///< _blocks: a parameter memcalc counts, two 4-bit values a byte (gpt-oss)
    mxfp4_scales,     ///< _scales: one byte per 32 of those values
    other_modules,    ///< a vision tower, a projector: modules memcalc does not model
    other_dtypes,     ///< a parameter memcalc counts, stored in a dtype other than config.json's
    modelled,         ///< a parameter memcalc counts, in config.json's dtype
    roles
};

struct PartRow {
    const char* key;
    const char* label;
    bool modelled;
};
const std::array<PartRow, modelled> part_rows{{
    {"rotary_inv_freq", "rotary inv_freq buffers", false},
    {"tied_head_copy", "lm_head.weight, a copy of the tied embedding", false},
    {"mtp_layers", "multi-token-prediction layers (N >= num_hidden_layers)", false},
    {"fp8_weights", "fp8 weights (1 byte each)", true},
    {"fp8_scales", "fp8 block scales (weight_scale_inv)", false},
    {"mxfp4_blocks", "MXFP4 blocks (_blocks, 4 bits each)", true},
    {"mxfp4_scales", "MXFP4 scales (_scales)", false},
    {"other_modules", "modules memcalc does not model (vision, projector)", false},
    {"other_dtypes", "parameters stored in another dtype", true},
}};

/// config.json's dtype names and their bytes.
const std::array<std::pair<const char*, std::uint64_t>, 6> config_dtypes{{{"float32", 4},
                                                                          {"bfloat16", 2},
                                                                          {"float16", 2},
                                                                          {"float64", 8},
                                                                          {"float8_e4m3fn", 1},
                                                                          {"float8_e5m2", 1}}};

/// Module names of other models inside one checkpoint (transformers' multimodal classes).
const std::array<const char*, 10> other_module_names{
    {"vision_tower", "vision_model", "visual", "multi_modal_projector", "mm_projector",
     "audio_tower", "vision_embed_tokens", "image_newline", "vision", "audio_model"}};

std::vector<std::string> components(const std::string& name) {
    std::vector<std::string> out(1);
    for (char c : name)
        if (c == '.')
            out.emplace_back();
        else
            out.back() += c;
    return out;
}

bool all_digits(const std::string& s) {
    return !s.empty() && s.size() < 10 &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

struct Named {
    Role role;
    std::optional<std::uint64_t> layer;
};

/// A tensor's role and layer from its name alone.
Named classify(const std::string& name, const Architecture& m) {
    const auto parts = components(name);
    std::optional<std::uint64_t> layer;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i)
        if ((parts[i] == "layers" || parts[i] == "h" || parts[i] == "blocks" ||
             parts[i] == "layer") &&
            all_digits(parts[i + 1])) {
            layer = std::stoull(parts[i + 1]);
            break;
        }
    const std::string& last = parts.back();
    if (last == "inv_freq") return {rotary_inv_freq, layer};
    if (last == "weight_scale_inv") return {fp8_scales, layer};
    if (ends_with(last, "_scales")) return {mxfp4_scales, layer};
    const bool other = std::any_of(parts.begin(), parts.end(), [](const std::string& p) {
        return std::find(other_module_names.begin(), other_module_names.end(), p) !=
               other_module_names.end();
    });
    if (other) return {other_modules, layer};
    if (layer && *layer >= m.layers) return {mtp_layers, layer};
    if (m.tied_embeddings && parts.size() >= 2 && parts[parts.size() - 2] == "lm_head")
        return {tied_head_copy, layer};
    if (ends_with(last, "_blocks")) return {mxfp4_blocks, layer};
    return {modelled, layer};
}

/// The kind of layer `layer` is (Architecture::layer_pattern; one kind when none).
std::size_t kind_of_layer(const ParameterTable& t, std::uint64_t layer) {
    for (const auto& run : t.runs) {
        if (layer < run.count) return run.kind;
        layer -= run.count;
    }
    return 0;
}

/// The dims (in, out) of one matrix memcalc has a row for: "model.layers.3.self_attn.q_proj.weight"
/// is the q_proj row; one of a mixture's experts ("experts.7.") is a slice of its stacked row.
std::optional<std::pair<std::uint64_t, std::uint64_t>> matrix_of(
    const std::string& name, const ParameterTable& t, std::optional<std::uint64_t> layer) {
    const auto parts = components(name);
    if (parts.size() < 2) return std::nullopt;
    const std::string& module = parts[parts.size() - 2];
    const bool one_expert = parts.size() >= 4 && parts[parts.size() - 4] == "experts" &&
                            all_digits(parts[parts.size() - 3]);
    for (const auto& row : t.rows) {
        if (row.tensor != module || row.dims.size() < 2) continue;
        if (layer && row.group == Group::layer && row.kind != kind_of_layer(t, *layer)) continue;
        if (row.expert != one_expert || row.dims.size() != (row.expert ? 3u : 2u)) continue;
        const auto* d = row.dims.end() - 2;
        return std::make_pair(d[0], d[1]);
    }
    return std::nullopt;
}

std::int64_t signed_bytes(std::uint64_t have, std::uint64_t expected, const std::string& origin) {
    constexpr std::uint64_t limit = std::uint64_t{1} << 62;
    if (have > limit || expected > limit) throw error(origin + ": sizes over 2^62 bytes");
    return static_cast<std::int64_t>(have) - static_cast<std::int64_t>(expected);
}

using TensorList = std::vector<std::pair<std::string, const SafetensorsTensor*>>;
using Shards = std::vector<std::pair<std::string, std::vector<SafetensorsTensor>>>;

/// config.json's dtype and quantization into `c`; a missing dtype is what transformers loads by
/// default: float32. Returns the fp8 scales' block: rows, columns.
std::pair<std::uint64_t, std::uint64_t> read_config_dtype(CheckpointCheck& c,
                                                          const std::string& config,
                                                          const std::string& origin) {
    const json document = parse_json(config, origin + "/config.json");
    const JsonReader in(document, origin + "/config.json");
    const char* dtype_key = in.has("torch_dtype") ? "torch_dtype" : "dtype";
    c.dtype = in.text_or(dtype_key, "float32");
    const auto dtype = std::find_if(config_dtypes.begin(), config_dtypes.end(),
                                    [&](const auto& d) { return c.dtype == d.first; });
    if (dtype == config_dtypes.end())
        in.fail(std::string(dtype_key) + " '" + c.dtype +
                "' is not a dtype memcalc knows (float32, bfloat16, float16, float64, "
                "float8_e4m3fn, float8_e5m2)");
    c.bytes_per_element = dtype->second;
    std::uint64_t block_rows = 128, block_columns = 128;  // DeepSeek-V3's weight_block_size
    if (document.contains("quantization_config") &&
        document.at("quantization_config").is_object()) {
        const json& q = document.at("quantization_config");
        if (q.contains("weight_block_size") && q.at("weight_block_size").is_array() &&
            q.at("weight_block_size").size() == 2) {
            const json sizes = {{"rows", q.at("weight_block_size")[0]},
                                {"columns", q.at("weight_block_size")[1]}};
            const JsonReader block(sizes,
                                   origin + "/config.json: quantization_config.weight_block_size");
            block_rows = block.positive("rows"), block_columns = block.positive("columns");
        }
    }
    return {block_rows, block_columns};
}

/// model.safetensors.index.json: its total size into `c`, and its tensors into `tensors` when the
/// shards were not read; when they were, the index and the headers must name the same tensors.
void read_index(CheckpointCheck& c, const std::string& index, const Shards& shards,
                TensorList& tensors, const std::string& origin) {
    const std::string where = origin + "/model.safetensors.index.json";
    const json doc = parse_json(index, where);
    if (!doc.is_object() || !doc.contains("weight_map") || !doc.at("weight_map").is_object())
        throw error(where +
                    ": expected an object with a weight_map object (tensor name -> shard file)");
    if (doc.contains("metadata") && doc.at("metadata").is_object() &&
        doc.at("metadata").contains("total_size")) {
        const JsonReader meta(doc.at("metadata"), where + ": metadata");
        c.index_total_size = meta.count_if_given("total_size");
    }
    std::map<std::string, std::string> weight_map;
    for (const auto& [name, file] : doc.at("weight_map").items()) {
        if (!file.is_string())
            throw error(where + ": weight_map['" + name + "'] must be a file name");
        weight_map.emplace(name, file.get<std::string>());
    }
    if (shards.empty()) {
        for (const auto& [name, file] : weight_map) tensors.emplace_back(name, nullptr);
    } else {  // the index and the headers must name the same tensors
        std::set<std::string> in_headers;
        for (const auto& [name, unused] : tensors) in_headers.insert(name);
        for (const auto& [name, file] : weight_map)
            if (!in_headers.count(name))
                throw error(where + ": names '" + name + "', which " + file +
                            "'s header does not hold");
        if (in_headers.size() != weight_map.size())
            for (const auto& name : in_headers)
                if (!weight_map.count(name))
                    throw error(where + ": does not name '" + name + "', which a shard holds");
    }
    c.source = "model.safetensors.index.json";
}

/// Each tensor sorted into its part, and (with the shards' headers) its dtype and layer tallied.
struct Tally {
    Tally(CheckpointCheck& check, const Architecture& model, const ParameterTable& parameters,
          std::uint64_t rows, std::uint64_t columns, const std::string& where)
        : c(check),
          m(model),
          table(parameters),
          block_rows(rows),
          block_columns(columns),
          origin(where) {}

    CheckpointCheck& c;
    const Architecture& m;
    const ParameterTable& table;
    std::uint64_t block_rows, block_columns;
    const std::string& origin;
    std::set<std::string> names;
    std::map<std::string, DtypeTally> dtypes;
    std::map<std::optional<std::uint64_t>, Count> layer_elements;  // none: outside the layers
    Count modelled_elements;
    std::vector<bool> known = std::vector<bool>(roles, true);  // each part's bytes known
    std::vector<std::int64_t> part_bytes = std::vector<std::int64_t>(roles, 0);

    void add(const std::string& name, const SafetensorsTensor* header);
    void add_from_index(const std::string& name, const Named& named);
    void parts();
    void layers();
};

void Tally::add(const std::string& name, const SafetensorsTensor* header) {
    Named named = classify(name, m);
    // An index alone says which weights are fp8: those with a weight_scale_inv beside them.
    if (named.role == modelled && ends_with(name, ".weight") && names.count(name + "_scale_inv"))
        named.role = fp8_weights;
    if (!header) {
        add_from_index(name, named);
        return;
    }
    Count elements;  // memcalc's parameters in it
    const unsigned bits = safetensors_dtype_bits(header->dtype);
    elements = header->elements;
    if (named.role == mxfp4_blocks && bits == 8) elements *= 2;  // two 4-bit values a byte
    if (named.role == modelled && bits != 8 * c.bytes_per_element)
        named.role = bits == 8 && header->dtype.rfind("F8", 0) == 0 ? fp8_weights : other_dtypes;
    DtypeTally& d = dtypes[header->dtype];
    d.dtype = header->dtype, ++d.tensors;
    d.elements = (Count(d.elements) + header->elements).value();
    d.bytes = (Count(d.bytes) + header->bytes).value();
    CheckpointPart* part = named.role == modelled ? nullptr : &c.parts[named.role];
    if (part && part->tensors++ == 0) part->first = name;
    const bool counted = named.role == modelled || (part && part->modelled);
    if (counted) {
        modelled_elements += elements;
        layer_elements[named.layer] += elements;
    }
    if (part)
        part_bytes[named.role] += signed_bytes(
            header->bytes, counted ? (elements * c.bytes_per_element).value() : 0, origin);
}

/// From the index alone: the bytes of what memcalc knows the shape of.
void Tally::add_from_index(const std::string& name, const Named& named) {
    CheckpointPart* part = named.role == modelled ? nullptr : &c.parts[named.role];
    if (part && part->tensors++ == 0) part->first = name;
    if (named.role == tied_head_copy) {
        part_bytes[named.role] +=
            signed_bytes((Count(m.vocab) * m.hidden * c.bytes_per_element).value(), 0, origin);
    } else if (named.role == fp8_weights || named.role == fp8_scales) {
        const std::string weight = named.role == fp8_scales
                                       ? name.substr(0, name.size() - 10)  // less "_scale_inv"
                                       : name;
        const auto dims = matrix_of(weight, table, named.layer);
        if (!dims) {
            known[named.role] = false;
        } else if (named.role == fp8_weights) {
            part_bytes[named.role] -= signed_bytes(
                (Count(dims->first) * dims->second * (c.bytes_per_element - 1)).value(), 0, origin);
        } else {  // one fp32 per block of the (out x in) weight
            const std::uint64_t in_blocks = (dims->first + block_columns - 1) / block_columns;
            const std::uint64_t out_blocks = (dims->second + block_rows - 1) / block_rows;
            part_bytes[named.role] +=
                signed_bytes((Count(4) * in_blocks * out_blocks).value(), 0, origin);
        }
    } else if (part) {
        known[named.role] = false;
    }
}

/// Each part's bytes, and what of the difference they explain.
void Tally::parts() {
    bool all_known = true;
    std::int64_t explained = 0;
    for (std::size_t r = 0; r < c.parts.size(); ++r) {
        if (c.parts[r].tensors == 0)
            c.parts[r].bytes = 0;
        else if (known[r])
            c.parts[r].bytes = part_bytes[r];
        if (c.parts[r].bytes)
            explained += *c.parts[r].bytes;
        else
            all_known = false;
    }
    if (c.difference) (all_known ? c.unexplained : c.left_to_unknown) = *c.difference - explained;
}

/// With the shards' headers: the dtypes, and tensor by tensor, summed a layer at a time, each
/// layer against memcalc's rows for its kind.
void Tally::layers() {
    c.modelled_elements = modelled_elements.value();
    for (auto& [unused, d] : dtypes) c.dtypes.push_back(d);
    std::uint64_t in_layers = 0;
    for (std::uint64_t layer = 0; layer < m.layers; ++layer) {
        const std::uint64_t memcalc = table.per_layer(kind_of_layer(table, layer)).value();
        in_layers += memcalc;
        const auto found = layer_elements.find(layer);
        const std::uint64_t have = found == layer_elements.end() ? 0 : found->second.value();
        if (have != memcalc) c.layer_differences.push_back({layer, have, memcalc});
    }
    const auto outside = layer_elements.find(std::nullopt);
    const std::uint64_t have = outside == layer_elements.end() ? 0 : outside->second.value();
    if (have != c.parameters - in_layers)
        c.layer_differences.push_back({std::nullopt, have, c.parameters - in_layers});
}

/// Sorts each tensor into its part, and (with the shards' headers) tallies dtypes and layers.
void tally(CheckpointCheck& c, const Architecture& m, const ParameterTable& table,
           const TensorList& tensors, std::uint64_t block_rows, std::uint64_t block_columns,
           const std::string& origin) {
    Tally t(c, m, table, block_rows, block_columns, origin);
    for (const auto& [name, unused] : tensors) t.names.insert(name);
    for (const auto& [name, header] : tensors) t.add(name, header);
    t.parts();
    if (c.from_headers) t.layers();
}

}  // namespace

CheckpointCheck check_checkpoint(const Architecture& m, const std::string& config,
                                 const std::string& index, const Shards& shards,
                                 const std::string& origin) {
    CheckpointCheck c;
    const ParameterTable table = parameter_table(m);
    c.parameters = table.total().value();
    for (const auto& row : part_rows)
        c.parts.push_back({row.key, row.label, row.modelled, 0, std::nullopt, {}});
    const auto [block_rows, block_columns] = read_config_dtype(c, config, origin);
    try {
        c.expected_bytes = (Count(c.parameters) * c.bytes_per_element).value();
    } catch (const overflow_error&) {
        throw error(origin + ": the model's bytes do not fit in 64 bits");
    }

    // Every tensor's name, and its header entry when the shards were read.
    TensorList tensors;
    std::map<std::string, std::string> shard_of;  // a tensor in two shards would be counted twice
    for (const auto& [file, list] : shards)
        for (const auto& t : list) {
            const auto [it, first] = shard_of.emplace(t.name, file);
            if (!first)
                throw error(origin + "/" + file + ": tensor '" + t.name + "' is in " + it->second +
                            " too");
            tensors.emplace_back(t.name, &t);
        }
    if (!index.empty()) read_index(c, index, shards, tensors, origin);
    c.tensors = tensors.size();
    c.from_headers = !shards.empty();
    if (c.from_headers) {
        c.source = std::to_string(shards.size()) +
                   (shards.size() == 1 ? " safetensors header" : " safetensors headers");
        Count sum;
        for (const auto& [name, t] : tensors) sum += t->bytes;
        c.bytes = sum.value();
    } else {
        c.bytes = c.index_total_size;
    }
    if (c.bytes) c.difference = signed_bytes(*c.bytes, c.expected_bytes, origin);

    try {
        tally(c, m, table, tensors, block_rows, block_columns, origin);
    } catch (const overflow_error&) {
        throw error(origin + ": the checkpoint's sizes do not fit in 64 bits");
    }
    return c;
}

ModelFile load_model_folder(const std::string& dir) {
    const fs::path folder(dir);
    const fs::path config = folder / "config.json";
    std::error_code code;
    if (!fs::is_regular_file(config, code))
        throw error(
            dir + ": no config.json in this folder (a HuggingFace model folder holds config.json)");
    const std::string config_text = read_text_file(config.string(), "config file");
    // "Llama-2-7b-hf/" names the model Llama-2-7b-hf.
    std::string name =
        (folder.filename().empty() ? folder.parent_path() : folder).filename().string();
    ModelFile file = parse_hf_config(config_text, config.string(), name.empty() ? "model" : name);

    // The shards: those the index names, else model.safetensors or every *.safetensors in the
    // folder.
    std::string index;
    std::vector<std::string> shard_files;
    const fs::path index_path = folder / "model.safetensors.index.json";
    if (fs::exists(index_path, code)) {
        index = read_text_file(index_path.string(), "index file");
        const json doc = parse_json(index, index_path.string());
        std::set<std::string> named;
        if (doc.is_object() && doc.contains("weight_map") && doc.at("weight_map").is_object())
            for (const auto& [unused, shard] : doc.at("weight_map").items())
                if (shard.is_string()) named.insert(shard.get<std::string>());
        std::vector<std::string> missing;
        for (const auto& shard : named) {
            if (shard.empty() || fs::path(shard).filename() != shard || shard == "." ||
                shard == "..")
                throw error(index_path.string() + ": weight_map names '" + shard +
                            "', not a file name in the folder");
        }
        for (const auto& shard : named)
            (fs::exists(folder / shard, code) ? shard_files : missing).push_back(shard);
        if (!shard_files.empty() && !missing.empty())
            throw error(index_path.string() + ": names " + missing.front() +
                        ", which is not in the folder (" + std::to_string(missing.size()) + " of " +
                        std::to_string(named.size()) + " shards missing: a partial download?)");
    } else {
        for (const auto& entry : fs::directory_iterator(folder, code))
            if (entry.path().extension() == ".safetensors")
                shard_files.push_back(entry.path().filename().string());
        std::sort(shard_files.begin(), shard_files.end());
    }
    if (index.empty() && shard_files.empty()) return file;
    std::vector<std::pair<std::string, std::vector<SafetensorsTensor>>> shards;
    for (const auto& shard : shard_files)
        shards.emplace_back(shard, read_safetensors_header((folder / shard).string()));
    file.checkpoint = std::make_shared<const CheckpointCheck>(
        check_checkpoint(file.architecture, config_text, index, shards, dir));
    return file;
}

}  // namespace memcalc::cli
