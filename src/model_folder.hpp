#pragma once
// A downloaded HuggingFace model folder (--config DIR): its config.json, and its checkpoint's index
// or safetensors headers checked against memcalc's parameter count.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model_file.hpp"
#include "safetensors_header.hpp"

namespace memcalc::cli {

/// One reason a checkpoint's bytes differ from memcalc's parameters x bytes per element.
struct CheckpointPart {
    const char* key;    ///< the JSON key: "rotary_inv_freq"
    const char* label;  ///< the table's words
    bool modelled;      ///< its elements are parameters memcalc counts, stored in another format
    std::uint64_t tensors = 0;
    std::optional<std::int64_t>
        bytes;  ///< the checkpoint's bytes minus memcalc's for them; unknown from an index alone
    std::string first;  ///< the first tensor's name, as an example
};

/// A dtype's share of the shards (their headers only).
struct DtypeTally {
    std::string dtype;
    std::uint64_t tensors = 0, elements = 0, bytes = 0;
};

/// A layer (or the tensors outside the layers) whose checkpoint elements differ from memcalc's
/// rows.
struct LayerDifference {
    std::optional<std::uint64_t> layer;  ///< none: embeddings, final norm and head
    std::uint64_t checkpoint = 0, memcalc = 0;
};

struct CheckpointCheck {
    std::string source;         ///< "model.safetensors.index.json", or the shards' headers
    bool from_headers = false;  ///< exact per tensor (the shards' headers were read)
    std::uint64_t tensors = 0;
    std::optional<std::uint64_t>
        bytes;  ///< the checkpoint's: the index's total_size, or the headers' sum
    std::optional<std::uint64_t> index_total_size;  ///< when it and the headers' sum are both known
    std::string dtype;                              ///< config.json's torch_dtype (or dtype)
    std::uint64_t bytes_per_element = 0;
    std::uint64_t parameters = 0,
                  expected_bytes = 0;         ///< memcalc's count, and it times bytes_per_element
    std::optional<std::int64_t> difference;   ///< bytes - expected_bytes
    std::vector<CheckpointPart> parts;        ///< every reason, in a fixed order, zero or not
    std::optional<std::int64_t> unexplained;  ///< difference less the parts; unknown when a part is
    std::optional<std::int64_t>
        left_to_unknown;  ///< else the difference less the parts known: what the others hold
    std::optional<std::uint64_t>
        modelled_elements;  ///< the elements of the tensors memcalc has rows for
    std::vector<DtypeTally> dtypes;
    std::vector<LayerDifference> layer_differences;
};

/// The checkpoint's tensors against the architecture: `config` is config.json's text, `index` the
/// index's (empty: none), `shards` the headers read (empty: none). Errors name `origin`.
CheckpointCheck check_checkpoint(
    const Architecture& m, const std::string& config, const std::string& index,
    const std::vector<std::pair<std::string, std::vector<SafetensorsTensor>>>& shards,
    const std::string& origin);

/// Reads DIR/config.json as --config FILE does (the model named after the folder), and checks the
/// checkpoint beside it when there is one (ModelFile::checkpoint).
ModelFile load_model_folder(const std::string& dir);

/// The check as the table shows it, after the estimate; and as JSON (exact integers, every part's
/// key).
std::string checkpoint_table(const CheckpointCheck& c);
nlohmann::json checkpoint_json(const CheckpointCheck& c);

}  // namespace memcalc::cli
