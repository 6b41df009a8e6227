// Build-time tool: reads presets/*.json with the program's own reader (parse_model_json) and writes
// a C++ source with one function per preset that builds its ModelFile field by field, so the
// program parses no JSON at start-up. The JSON files stay the only source of truth; a preset the
// reader refuses fails the build with the reader's message.
//
//   memcalc_preset_compiler OUTPUT.cpp PRESET.json...
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "memcalc/activation_functions.hpp"
#include "memcalc/error.hpp"
#include "memcalc/program_facts.hpp"
#include "model_file.hpp"

namespace {

using namespace memcalc;

/// `text` as a C++ string literal: printable ASCII as is, every other byte as a three-digit octal
/// escape.
std::string literal(const std::string& text) {
    std::string out = "\"";
    for (const unsigned char c : text) {
        if (c == '"' || c == '\\') {
            out += '\\', out += static_cast<char>(c);
        } else if (c >= 0x20 && c < 0x7f) {
            out += static_cast<char>(c);
        } else {
            char escaped[5];
            std::snprintf(escaped, sizeof escaped, "\\%03o", c);
            out += escaped;
        }
    }
    return out + "\"";
}

std::string number(std::uint64_t n) { return std::to_string(n) + "u"; }

/// A double that reads back as the same value.
std::string number(double x) {
    std::ostringstream out;
    out.precision(std::numeric_limits<double>::max_digits10);
    out << x;
    return out.str();
}

std::string optional_number(const std::optional<std::uint64_t>& n) {
    return n ? "std::uint64_t{" + number(*n) + "}" : "std::nullopt";
}

const char* boolean(bool b) { return b ? "true" : "false"; }

const char* mlp(Mlp m) { return m == Mlp::gated ? "Mlp::gated" : "Mlp::plain"; }
const char* norm(Norm n) { return n == Norm::rmsnorm ? "Norm::rmsnorm" : "Norm::layernorm"; }
const char* bias(Bias b) {
    switch (b) {
        case Bias::none: return "Bias::none";
        case Bias::qkv: return "Bias::qkv";
        case Bias::attention: return "Bias::attention";
        case Bias::all: return "Bias::all";
    }
    throw std::logic_error("a bias the compiler does not know");
}
const char* position(Position p) {
    switch (p) {
        case Position::rotary: return "Position::rotary";
        case Position::learned: return "Position::learned";
        case Position::none: return "Position::none";
    }
    throw std::logic_error("a position the compiler does not know");
}
std::string activation(Activation a) {
    return "Activation::" + std::string(activation_function(a).name);
}

/// Every program fact of `m` that is not the default, as a value of its row (program_facts.hpp):
/// the member is named as the key.
void write_program_facts(std::ostream& out, const Architecture& m) {
    const Architecture defaults;
    std::size_t index = 0;
    for_each_program_fact([&](const auto& row) {
        for (std::size_t v = 0; v < row.values.size(); ++v)
            if (m.*row.member == row.values[v] && !(defaults.*row.member == row.values[v]))
                out << "    m." << row.key << " = std::get<" << index << ">(program_facts).values["
                    << v << "];\n";
        ++index;
    });
}

/// The statements that set every field of the architecture `m` but its layer kinds.
void write_architecture(std::ostream& out, const Architecture& m) {
    out << "    m.name = " << literal(m.name) << ";\n"
        << "    m.hidden = " << number(m.hidden) << ", m.layers = " << number(m.layers)
        << ", m.heads = " << number(m.heads) << ";\n"
        << "    m.kv_heads = " << number(m.kv_heads) << ", m.head_dim = " << number(m.head_dim)
        << ", m.ffn = " << number(m.ffn) << ", m.vocab = " << number(m.vocab) << ";\n"
        << "    m.max_positions = " << number(m.max_positions)
        << ", m.position_rows = " << number(m.position_rows)
        << ", m.embedding_rows = " << number(m.embedding_rows) << ";\n"
        << "    m.mlp = " << mlp(m.mlp) << ", m.norm = " << norm(m.norm)
        << ", m.bias = " << bias(m.bias) << ", m.position = " << position(m.position) << ";\n"
        << "    m.tied_embeddings = " << boolean(m.tied_embeddings)
        << ", m.head_bias = " << boolean(m.head_bias) << ";\n"
        << "    m.experts = " << number(m.experts)
        << ", m.experts_per_token = " << number(m.experts_per_token) << ";\n"
        << "    m.activation = " << activation(m.activation)
        << ", m.norms_per_layer = " << number(m.norms_per_layer) << ";\n"
        << "    m.parallel_attention = " << boolean(m.parallel_attention)
        << ", m.embedding_norm = " << boolean(m.embedding_norm) << ";\n"
        << "    m.attention_dropout = " << number(m.attention_dropout)
        << ", m.hidden_dropout = " << number(m.hidden_dropout)
        << ", m.mlp_dropout = " << number(m.mlp_dropout) << ";\n"
        << "    m.qk_norm = QkNorm::" << qk_norm_name(m.qk_norm)
        << ", m.norm_position = NormPosition::" << norm_position_name(m.norm_position) << ";\n"
        << "    m.attention_sinks = " << boolean(m.attention_sinks)
        << ", m.window = " << number(m.window) << ";\n"
        << "    m.attention_output_gate = " << boolean(m.attention_output_gate) << ";\n"
        << "    m.attention_chunk = " << number(m.attention_chunk)
        << ", m.attention_temperature = " << boolean(m.attention_temperature) << ";\n"
        << "    m.router = Router::" << router_name(m.router)
        << ", m.input_jitter = " << number(m.input_jitter) << ";\n"
        << "    m.mtp_layers = " << number(m.mtp_layers) << ";\n"
        << "    m.shared_ffn = " << number(m.shared_ffn)
        << ", m.shared_expert_gate = " << boolean(m.shared_expert_gate) << ";\n"
        << "    m.router_bias = RouterBias::" << router_bias_name(m.router_bias)
        << ", m.renormalize_topk = " << boolean(m.renormalize_topk) << ";\n"
        << "    m.expert_imbalance = " << m.expert_imbalance << ";\n"
        << "    m.mla = {" << number(m.mla.q_lora_rank) << ", " << number(m.mla.kv_lora_rank)
        << ", " << number(m.mla.qk_nope_head_dim) << ", " << number(m.mla.qk_rope_head_dim) << ", "
        << number(m.mla.v_head_dim) << ", " << number(m.mla.index_heads) << ", "
        << number(m.mla.index_head_dim) << ", " << number(m.mla.index_topk) << "};\n";
    write_program_facts(out, m);
    if (m.mixer != Mixer::attention || m.ssm.enabled())
        out << "    m.mixer = Mixer::" << mixer_name(m.mixer) << ";\n"
            << "    m.ssm = {" << number(m.ssm.d_inner) << ", " << number(m.ssm.d_state) << ", "
            << number(m.ssm.d_conv) << ", " << number(m.ssm.dt_rank) << ", "
            << boolean(m.ssm.conv_bias) << ", " << boolean(m.ssm.proj_bias) << ", "
            << boolean(m.ssm.inner_norms) << ", " << boolean(m.ssm.kernels) << ", "
            << boolean(m.ssm.gated_norm) << ", " << number(m.ssm.heads) << ", "
            << number(m.ssm.groups) << ", " << number(m.ssm.chunk) << "};\n";
}

/// The statements that add the layer kinds of `m`, and its pattern of them.
void write_layer_kinds(std::ostream& out, const Architecture& m) {
    for (const LayerKind& k : m.layer_kinds) {
        out << "    m.layer_kinds.push_back({" << literal(k.name) << ", " << optional_number(k.ffn)
            << ", " << optional_number(k.experts) << ", " << optional_number(k.experts_per_token)
            << ", " << optional_number(k.shared_ffn) << "});\n";
        if (k.shared_expert_gate)
            out << "    m.layer_kinds.back().shared_expert_gate = "
                << boolean(*k.shared_expert_gate) << ";\n";
        if (k.window) out << "    m.layer_kinds.back().window = " << number(*k.window) << ";\n";
        if (k.attention_chunk)
            out << "    m.layer_kinds.back().attention_chunk = " << number(*k.attention_chunk)
                << ";\n";
        if (k.position)
            out << "    m.layer_kinds.back().position = " << position(*k.position) << ";\n";
        if (k.qk_norm)
            out << "    m.layer_kinds.back().qk_norm = QkNorm::" << qk_norm_name(*k.qk_norm)
                << ";\n";
        if (k.mixer)
            out << "    m.layer_kinds.back().mixer = Mixer::" << mixer_name(*k.mixer) << ";\n";
        if (k.has_mlp)
            out << "    m.layer_kinds.back().has_mlp = " << (*k.has_mlp ? "true" : "false")
                << ";\n";
        if (k.router_bias)
            out << "    m.layer_kinds.back().router_bias = RouterBias::"
                << router_bias_name(*k.router_bias) << ";\n";
    }
    for (const LayerRun& run : m.layer_pattern)
        out << "    m.layer_pattern.push_back({" << run.kind << ", " << number(run.count)
            << "});\n";
}

/// The statements that set a vision tower's fields, where the model has one (their members are
/// named as their keys).
void write_vision(std::ostream& out, const VisionTower& v) {
    if (!v.enabled()) return;
    for (const auto& f : vision_counts)
        out << "    m.vision." << f.key << " = " << number(v.*f.member) << ";\n";
    for (const auto& f : vision_flags)
        out << "    m.vision." << f.key << " = " << boolean(v.*f.member) << ";\n";
}

/// The body of a function that returns `file`: every field the reader sets, defaults included.
std::string builder(const cli::ModelFile& file) {
    std::ostringstream out;
    out << "    ModelFile file;\n"
        << "    Architecture& m = file.architecture;\n";
    write_architecture(out, file.architecture);
    write_layer_kinds(out, file.architecture);
    write_vision(out, file.architecture.vision);
    out << "    file.description = " << literal(file.description) << ";\n"
        << "    file.source = " << literal(file.source) << ";\n";
    if (file.published_parameters)
        out << "    file.published_parameters = " << number(*file.published_parameters) << ";\n";
    out << "    return file;\n";
    return out.str();
}

std::string stem(const std::string& path) {
    const std::size_t slash = path.find_last_of("/\\");
    std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
    const std::size_t dot = name.rfind('.');
    return dot == std::string::npos ? name : name.substr(0, dot);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::cerr << "usage: memcalc_preset_compiler OUTPUT.cpp PRESET.json...\n";
        return 2;
    }
    try {
        std::ostringstream out;
        out << "// Generated by memcalc_preset_compiler (src/preset_compiler.cpp) from "
               "presets/*.json; edit those\n"
               "// files, not this one.\n"
               "#include <cstdint>\n#include <optional>\n#include <tuple>\n\n#include "
               "\"memcalc/program_facts.hpp\"\n"
               "#include \"presets_data.hpp\"\n\n"
               "namespace memcalc::cli {\nnamespace {\n\n";
        std::vector<std::string> names;
        for (int i = 2; i < argc; ++i) {
            const std::string name = stem(argv[i]);
            // As the program named a preset when it parsed one at run time, so messages read the
            // same.
            const cli::ModelFile file = cli::parse_model_json(
                cli::read_text_file(argv[i], "preset file"), "preset " + name, name);
            out << "ModelFile preset_" << names.size() << "() {  // " << name << "\n"
                << builder(file) << "}\n\n";
            names.push_back(name);
        }
        out << "}  // namespace\n\nconst std::array<CompiledPreset, " << names.size()
            << "> compiled_presets{{\n";
        for (std::size_t i = 0; i < names.size(); ++i)
            out << "    {" << literal(names[i]) << ", preset_" << i << "},\n";
        out << "}};\n\n}  // namespace memcalc::cli\n";
        // Written only when it changes, so an untouched preset rebuilds nothing.
        std::string previous;
        if (std::ifstream in{argv[1], std::ios::binary})
            previous.assign(std::istreambuf_iterator<char>(in), {});
        if (previous != out.str()) {
            std::ofstream file(argv[1], std::ios::binary | std::ios::trunc);
            file << out.str();
            if (!file.flush()) throw memcalc::error(std::string("cannot write ") + argv[1]);
        }
    } catch (const std::exception& e) {
        std::cerr << "memcalc_preset_compiler: " << e.what() << "\n";
        return 1;
    }
    return 0;
}
