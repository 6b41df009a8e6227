// Google Benchmark of memcalc's JSON readers against the input's size: a config.json of many keys,
// a safetensors index of many weight_map entries and a safetensors header of many megabytes, each
// at three sizes, so linear time shows as a constant rate (bytes_per_second). Each case runs what
// the program runs on such a text (parse_hf_config, check_checkpoint, parse_safetensors_header);
// the `callback` cases run the parser memcalc 1.2.0 had (nlohmann's callback parser and a linear
// search of keys) as the baseline: quadratic, so at sizes a fraction of the others.
// Run: build/bench/memcalc_bench_parsers
#include <benchmark/benchmark.h>

#include <algorithm>
#include <string>
#include <vector>

#include "json_reader.hpp"
#include "model_folder.hpp"

namespace {

using benchmark::kMillisecond;
using nlohmann::json;

/// memcalc 1.2.0's parse_json, kept here only to measure against.
json callback_parse_json(std::string_view text, const std::string& origin) {
    std::vector<std::vector<std::string>> keys;  // the keys seen so far in each open object
    const auto refuse_duplicates = [&](int, json::parse_event_t event, json& parsed) {
        if (event == json::parse_event_t::object_start) keys.emplace_back();
        if (event == json::parse_event_t::object_end) keys.pop_back();
        if (event == json::parse_event_t::key) {
            const std::string key = parsed.get<std::string>();
            if (std::find(keys.back().begin(), keys.back().end(), key) != keys.back().end())
                throw memcalc::error(origin + ": key '" + key + "' appears twice in one object");
            keys.back().push_back(key);
        }
        return true;
    };
    return json::parse(text.begin(), text.end(), refuse_duplicates);
}

const std::string tiny_llama = R"("model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100,
    "torch_dtype": "bfloat16")";

/// A config.json of `keys` keys: a small LLaMA's and as many more as it takes.
std::string config_of(std::int64_t keys) {
    std::string text = "{" + tiny_llama;
    for (std::int64_t i = 0; i < keys; ++i)
        text += ",\n  \"extra_key_" + std::to_string(i) + "\": " + std::to_string(i);
    return text + "}";
}

/// A tensor name as DeepSeek-V3's index writes them, the i-th of a long list.
std::string tensor_name(std::int64_t i) {
    return "model.layers." + std::to_string(i / 2048) + ".mlp.experts." + std::to_string(i % 2048) +
           ".down_proj.weight";
}

/// model.safetensors.index.json with `entries` weight_map entries.
std::string index_of(std::int64_t entries) {
    std::string text = R"({"metadata": {"total_size": 1000}, "weight_map": {)";
    for (std::int64_t i = 0; i < entries; ++i)
        text += (i ? ",\n  \"" : "\n  \"") + tensor_name(i) +
                "\": \"model-00001-of-00002.safetensors\"";
    return text + "}}";
}

/// A safetensors file's start: the 8-byte length and a header of up to `bytes` bytes of BF16
/// [64, 128] tensors laid end to end; `data` is set to the bytes of data they name.
std::string header_of(std::size_t bytes, std::uint64_t& data) {
    std::string text = "{";
    data = 0;
    for (std::int64_t i = 0;; ++i, data += 16384) {
        const std::string entry = (i ? ",\"" : "\"") + tensor_name(i) +
                                  R"(":{"dtype":"BF16","shape":[64,128],"data_offsets":[)" +
                                  std::to_string(data) + "," + std::to_string(data + 16384) + "]}";
        if (text.size() + entry.size() + 1 > bytes) break;
        text += entry;
    }
    text += "}";
    std::string length(8, '\0');
    for (std::size_t i = 0; i < 8; ++i)
        length[i] = static_cast<char>(text.size() >> (8 * i) & 0xff);
    return length + text;
}

template <typename Parse>
void parse_text(benchmark::State& state, const std::string& text, Parse parse) {
    for (auto _ : state) benchmark::DoNotOptimize(parse(text));
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * text.size()));
    state.counters["MB"] = static_cast<double>(text.size()) / 1e6;
}

void config_keys(benchmark::State& state) {
    parse_text(state, config_of(state.range(0)), [](const std::string& t) {
        return memcalc::cli::parse_hf_config(t, "config.json", "bench").architecture.hidden;
    });
}
BENCHMARK(config_keys)->Arg(150'000)->Arg(300'000)->Arg(600'000)->Unit(kMillisecond);

void config_keys_callback(benchmark::State& state) {
    parse_text(state, config_of(state.range(0)),
               [](const std::string& t) { return callback_parse_json(t, "c").size(); });
}
BENCHMARK(config_keys_callback)->Arg(5'000)->Arg(10'000)->Arg(20'000)->Unit(kMillisecond);

void index_entries(benchmark::State& state) {
    const memcalc::Architecture model =
        memcalc::cli::parse_hf_config("{" + tiny_llama + "}", "c", "c").architecture;
    parse_text(state, index_of(state.range(0)), [&](const std::string& t) {
        return memcalc::cli::check_checkpoint(model, "{" + tiny_llama + "}", t, {}, "bench")
            .tensors;
    });
}
BENCHMARK(index_entries)->Arg(25'000)->Arg(50'000)->Arg(100'000)->Unit(kMillisecond);

void index_entries_callback(benchmark::State& state) {
    parse_text(state, index_of(state.range(0)),
               [](const std::string& t) { return callback_parse_json(t, "i").size(); });
}
BENCHMARK(index_entries_callback)->Arg(5'000)->Arg(10'000)->Arg(20'000)->Unit(kMillisecond);

void header_megabytes(benchmark::State& state) {
    std::uint64_t data = 0;
    const std::string head = header_of(static_cast<std::size_t>(state.range(0)) * 1'000'000, data);
    parse_text(state, head, [&](const std::string& t) {
        return memcalc::cli::parse_safetensors_header(t, t.size() + data, "bench").size();
    });
}
BENCHMARK(header_megabytes)->Arg(25)->Arg(50)->Arg(100)->Unit(kMillisecond);

void header_kilobytes_callback(benchmark::State& state) {
    std::uint64_t data = 0;
    const std::size_t bytes = static_cast<std::size_t>(state.range(0)) * 1'000;
    const std::string header = header_of(bytes, data).substr(8);  // the JSON alone
    parse_text(state, header,
               [](const std::string& t) { return callback_parse_json(t, "h").size(); });
}
BENCHMARK(header_kilobytes_callback)->Arg(250)->Arg(500)->Arg(1'000)->Unit(kMillisecond);

}  // namespace

BENCHMARK_MAIN();
