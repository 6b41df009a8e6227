#pragma once
// Reading a model description (a preset or a user's --model-file) from JSON.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memcalc/model.hpp"

namespace memcalc::cli {

struct CheckpointCheck;  // model_folder.hpp

struct ModelFile {
    Architecture architecture;
    std::string description;
    std::string source;
    std::vector<std::string>
        notes;  ///< what an import could not model or count, said beside its estimate
    std::optional<std::uint64_t>
        published_parameters;  ///< the model's published exact count, when known
    std::shared_ptr<const CheckpointCheck>
        checkpoint;  ///< --config DIR: its checkpoint against the count
};

/// Parses and validates one model description; `origin` (a file name) prefixes every error message.
/// `default_name` names the model when the file has no "name".
ModelFile parse_model_json(std::string_view text, const std::string& origin,
                           const std::string& default_name);

/// Reads a file and parses it; the name defaults to the file's stem.
ModelFile load_model_file(const std::string& path);

/// Builds a model from a HuggingFace config.json (a model_type of supported_model_types()); the
/// count matches the checkpoint's num_parameters().
ModelFile parse_hf_config(std::string_view text, const std::string& origin,
                          const std::string& default_name);
ModelFile load_hf_config(const std::string& path);
std::vector<std::string> supported_model_types();

/// A whole file's text; `what` names the kind of file in the error ("cannot read model file 'x'").
/// The largest model file or config.json memcalc reads: real configs are a few kB.
inline constexpr std::uintmax_t max_input_bytes = 16u << 20;

/// A regular file's whole text, at most max_input_bytes; `what` names it in errors ("model file").
std::string read_text_file(const std::string& path, const std::string& what);

/// A file this run read, which no output of the run may replace (compared by device and inode).
struct InputFile {
    std::string path;
    std::uint64_t device = 0, inode = 0;
};
/// Records `path` as read: read_text_file does, and so must every other reader of a user's file.
void remember_input(const std::string& path);
/// The files recorded since forget_inputs(); each run of the command line starts with none.
const std::vector<InputFile>& inputs_read();
void forget_inputs();

/// The presets compiled into the program, by name.
std::vector<std::string> preset_names();
ModelFile load_preset(const std::string& name);

}  // namespace memcalc::cli
