#pragma once
/// Serving memory: the weights in an inference engine's storage format, the KV cache in paged
/// blocks, and the activations of one chunk of prefill, per tensor-parallel rank. An estimate of
/// what the engine allocates for the model, not of the engine's own reserves (CUDA graphs, NCCL and
/// cuBLAS workspaces), which the caller leaves room for with a reserve.
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memcalc/dtype.hpp"
#include "memcalc/error.hpp"
#include "memcalc/model.hpp"
#include "memcalc/parallel.hpp"
#include "memcalc/params.hpp"
#include "memcalc/serve_forward.hpp"
#include "memcalc/units.hpp"

namespace memcalc {

/// How an inference checkpoint stores each linear layer's matrix (in x out): its values, and per
/// group of `group` input rows (0: per output channel, the whole input) one scale per output column
/// and, for asymmetric formats, a zero point. Embeddings, norms, routers, biases and
/// the head stay bf16, as GPTQ, AWQ and vLLM's fp8 and int8 checkpoints keep them.
struct WeightFormat {
    std::string_view name;
    DType values;
    std::uint32_t group;        ///< input rows sharing a scale; 0: one scale per output column
    DType scale;                ///< the scales' dtype
    std::optional<DType> zero;  ///< a zero point per scale, packed; none: symmetric
    bool per_tensor;            ///< one scale for the whole matrix instead
    std::string_view source;

    /// Exact bytes of one in x out matrix.
    Count matrix_bytes(std::uint64_t in, std::uint64_t out) const {
        const Count values_bytes = Storage{this->values}.bytes(Count(in) * out);
        if (this->values == DType::bf16) return values_bytes;
        if (per_tensor) return values_bytes + Count(bytes_per_element(scale));
        const std::uint64_t groups = group == 0 ? 1 : (in + group - 1) / group;
        const Count scales = Count(groups) * out;
        return values_bytes + scales * bytes_per_element(scale) +
               (zero ? Storage{*zero}.bytes(scales) : Count(0));
    }
};

inline constexpr std::array<WeightFormat, 4> weight_formats{{
    {"bf16", DType::bf16, 0, DType::bf16, std::nullopt, false, "the checkpoint as trained"},
    {"fp8", DType::fp8_e4m3, 0, DType::fp32, std::nullopt, true,
     "vLLM's Fp8LinearMethod: e4m3 values and one fp32 weight_scale per matrix"},
    {"int8", DType::int8, 0, DType::fp32, std::nullopt, false,
     "W8A8 (compressed-tensors, SmoothQuant): int8 values, one fp32 scale per output channel"},
    {"int4", DType::int4, 128, DType::fp16, DType::int4, false,
     "AWQ / GPTQ 4-bit, group 128: packed int4 values, per group of 128 input rows an fp16 scale "
     "and a "
     "4-bit zero point per output column (GPTQ's g_idx, in int32 per input row, not counted)"},
}};

/// nullptr for an unknown name.
inline const WeightFormat* weight_format(std::string_view name) {
    for (const auto& f : weight_formats)
        if (f.name == name) return &f;
    return nullptr;
}

struct ServeSettings {
    std::uint64_t context = 0;  ///< tokens per sequence: prompt and generated
    std::uint64_t batch = 1;    ///< sequences at once
    DType kv_dtype = DType::bf16;
    const WeightFormat* weights = &weight_formats[0];
    std::uint64_t block_size = 16;       ///< tokens per KV-cache block (vLLM's default)
    std::uint64_t prefill_chunk = 8192;  ///< tokens one forward takes at most (chunked prefill)
    std::uint64_t tp = 1;
    bool cuda_graphs = true;  ///< the engine captures CUDA graphs (false: --enforce-eager)
    /// vLLM's LoRA slots (--max-loras; 0: LoRA off) at --max-lora-rank, in the model's dtype.
    std::uint64_t max_loras = 0;
    std::uint64_t max_lora_rank = 16;
    /// A speculative-decoding draft model (none: no speculation), served beside the model in bf16
    /// at the same tp (vLLM quantizes a draft only by its own config), and the tokens it proposes.
    const Architecture* draft = nullptr;
    std::uint64_t num_speculative_tokens = 0;
    /// Images a prompt may hold (vLLM's --limit-mm-per-prompt), each at most width x height: the
    /// vision tower's encoder pass before a prefill. None: a text-only engine.
    ImageInput images;
    /// An engine's pool (vLLM's blocks, SGLang's token slots) gives a token room in every attention
    /// layer: mllama's cross-attention layers hold theirs with or without images, and a sequence's
    /// image tokens take slots as its text does. false: transformers' cache, each layer its own.
    bool engine_pool = false;
    /// transformers' generate() (v4.53, SDPA): every prompt of the batch in one forward, no
    /// chunks, and each attention layer's k and v repeated to every query head (repeat_kv). A
    /// decode step's repeat over the whole context, with DynamicCache's torch.cat making a
    /// layer's k and v anew, is no larger than that prefill's attention: the prefill is the peak.
    bool hf_generate = false;
};

/// What one tensor-parallel rank holds.
struct ServeReport {
    Count weights;     ///< bytes
    Count parameters;  ///< this rank's share
    std::uint64_t kv_heads_per_rank = 0;
    bool kv_replicated = false;  ///< fewer key/value heads than ranks: each rank keeps a whole head
    bool kv_latent = false;      ///< latent attention: the compressed latent and k's rotary part
    std::uint64_t indexer_key_bytes = 0;    ///< a token's sparse-attention indexer key, a layer
    std::uint64_t windowed_layers = 0;      ///< layers whose sliding window caps their cache
    Count kv_bytes_per_token;               ///< over every layer, while no window caps them
    std::uint64_t blocks_per_sequence = 0;  ///< the most any layer keeps a sequence
    Count kv_cache;  ///< batch x blocks x block size x bytes per token, by kind of layer
    std::uint64_t prefill_tokens = 0;
    Count activations;  ///< prefill's largest forward temporaries and the last tokens' logits
    /// A prefill's images (ServeSettings::images): how many the encoder takes at once, the tokens
    /// each makes, and their outputs' bytes, cached through the language model's forward.
    std::uint64_t encoder_items = 0, encoder_tokens_per_item = 0;
    Count encoder_outputs;
    std::uint64_t cache_layers = 0;  ///< the attention layers, which keep a KV cache
    /// mllama's cross-attention layers, and the image tokens each caches a sequence (a layer's own
    /// cache; in an engine's pool the tokens take slots in every layer, counted in the blocks).
    std::uint64_t cross_layers = 0, cross_tokens = 0;
    /// Mamba layers keep no cache but a state per sequence, whatever its length: the convolution's
    /// last d_conv inputs (bf16) and the scan's d_inner x d_state state (fp32), d_inner split
    /// across ranks.
    std::uint64_t state_layers = 0;
    Count state_bytes_per_sequence;  ///< over every Mamba layer
    Count ssm_state;                 ///< batch x state_bytes_per_sequence
    /// The tensors of each part in the order an engine makes them: every weight; each layer's
    /// cache (vLLM allocates a tensor a layer) or state; a prefill's temporaries, freed after it.
    /// vLLM's LoRA buffers, made with the weights (in weight_tensors, after them): every wrapped
    /// linear's stacked A and B for max_loras slots at max_lora_rank.
    Count lora;
    std::uint64_t lora_linears = 0;  ///< the linears wrapped, over every layer
    std::vector<TensorRun> weight_tensors, cache_tensors, prefill_tensors;
    /// A draft model's weights and KV cache (its tensors after the model's in the runs above).
    Count draft_weights, draft_parameters, draft_kv_bytes_per_token, draft_kv_cache;
    std::uint64_t draft_cache_layers = 0;
    /// Bytes a token over the model's and the draft's layers: the engine's one pool serves both.
    Count cache_bytes_per_token() const { return kv_bytes_per_token + draft_kv_bytes_per_token; }
    Count all_kv_cache() const { return kv_cache + draft_kv_cache; }
    Count peak() const {
        return weights + draft_weights + lora + all_kv_cache() + ssm_state + activations;
    }
};

namespace detail {
/// A row of the parameter table that the weight format stores: a layer's matrix, not a bias, norm
/// or router (stacked experts' biases are matrices too).
inline bool quantised(const ParamRow& r) {
    // Of no linear: a Mamba mixer's convolution taps and A stay in bf16, as vLLM's MambaMixer
    // keeps them.
    return r.group == Group::layer && (r.part == Part::attention || r.part == Part::mlp) &&
           r.dims.size() >= 2 && r.linear != Linear::none;
}
}  // namespace detail

inline void validate(const ServeSettings& s, const Architecture& m) {
    detail::require_positive("context", s.context);
    detail::require_positive("batch", s.batch);
    detail::require_positive("block size", s.block_size);
    detail::require_positive("prefill chunk", s.prefill_chunk);
    detail::require_positive("tp", s.tp);
    if (m.position == Position::learned && s.context > m.learned_positions())
        throw error("context (" + std::to_string(s.context) + ") exceeds the model's " +
                    std::to_string(m.learned_positions()) + " learned positions");
    const std::uint64_t kv = m.key_value_heads();
    if (kv % s.tp != 0 && s.tp % kv != 0)
        throw error("tp (" + std::to_string(s.tp) + ") must divide the " + std::to_string(kv) +
                    " key/value heads or be a multiple of them");
    if (m.heads % s.tp != 0)
        throw error("tp (" + std::to_string(s.tp) + ") must divide the " + std::to_string(m.heads) +
                    " query heads");
    const auto mamba = [](const Architecture& a) {  // any mixer with a state per sequence
        return a.any_kind([](const Architecture& v) { return state_space(v.mixer); });
    };
    if (mamba(m) && m.ssm.d_inner % s.tp != 0)
        throw error("tp (" + std::to_string(s.tp) + ") must divide the Mamba layers' " +
                    std::to_string(m.ssm.d_inner) + " inner channels");
    if (bytes_per_element(s.kv_dtype) == 0)
        throw error(std::string("kv dtype ") + dtype_name(s.kv_dtype) + " is not a cache dtype");
    if (s.max_loras > 0 && (m.any_moe() || mamba(m)))
        throw error("LoRA adapters are modelled on dense attention and MLP layers: " + m.name +
                    " has " + (m.any_moe() ? "experts" : "Mamba layers"));
    if (s.max_loras > 0) detail::require_positive("max lora rank", s.max_lora_rank);
    check_images(m, s.images);  // the largest image's size, where the tower takes any
    if (!s.draft) return;
    // vLLM's SpeculativeConfig refuses a draft of another vocabulary (out-of-bounds token ids).
    if (mamba(*s.draft))
        throw error("a draft with Mamba layers (" + s.draft->name + ") is not modelled");
    if (s.draft->vocab != m.vocab)
        throw error("the draft's vocabulary (" + std::to_string(s.draft->vocab) +
                    ") differs from the model's (" + std::to_string(m.vocab) + ")");
    detail::require_positive("num speculative tokens", s.num_speculative_tokens);
}

namespace detail {
/// `count()`, or past 64 bits an overflow_error naming what overflowed, `what()`: the inputs it
/// multiplies (serve_fit's search reads any overflow as a batch too large to fit).
template <class Counting, class What>
auto named_overflow(Counting count, What what) {
    try {
        return count();
    } catch (const overflow_error&) {
        throw overflow_error(what());
    }
}

/// The weights one rank holds, in s.weights' format.
inline void serve_weights(const Architecture& m, const ServeSettings& s, ServeReport& r) {
    const ParameterTable table = parameter_table(m);
    const std::uint64_t tp = s.tp;
    for (const ParamRow& row : table.rows) {
        const Count layers =
            row.group == Group::layer ? Count(table.kind_layers[row.kind]) : Count(1);
        // A tensor-parallel rank holds its slice of split tensors (vocabulary rows rounded up).
        const std::uint64_t n = row.dims.size();
        const std::uint64_t in = n >= 2 ? row.dims.begin()[n - 2] : 1,
                            out = row.dims.begin()[n - 1];
        const std::uint64_t stacked = n == 3 ? row.dims.begin()[0] : 1;
        Count elements = row.count, bytes;
        // k and v with fewer key/value heads than ranks: each rank keeps a whole head (vLLM's
        // QKVParallelLinear replicates them), not a slice of one.
        const std::uint64_t kv = m.key_value_heads();
        const bool whole_head =
            !m.mla.enabled() && kv < tp && (row.linear == Linear::k || row.linear == Linear::v);
        if (row.split == ParamSplit::vocab)
            elements = ceil_div(Count(row.dims.begin()[0]), tp) *
                       (row.count.value() / row.dims.begin()[0]);
        else if (whole_head)
            elements = Count(row.count.value() / kv);
        else if (row.split == ParamSplit::tensor)
            elements = ceil_div(row.count, tp);
        if (detail::quantised(row)) {
            // Each rank's matrix is in x out / tp: column-parallel ones (reading the model's width)
            // split their outputs, row-parallel ones their inputs, along which the groups run.
            const bool column = in == m.hidden;
            const std::uint64_t out_rank = whole_head ? out / kv : ceil_div(Count(out), tp).value();
            bytes = Count(stacked) *
                    s.weights->matrix_bytes(column ? in : ceil_div(Count(in), tp).value(),
                                            column ? out_rank : out);
        } else {
            bytes = elements * dtype::bf16;
        }
        r.parameters += layers * elements;
        r.weights += layers * bytes;
        r.weight_tensors.push_back({bytes, layers.value()});
    }
}

/// vLLM's LoRA buffers on one rank (lora/layers/base_linear.py create_lora_weights): each linear
/// of a layer keeps A of max_loras x rank x its input and B of max_loras x its output x rank, in
/// the model's dtype; a fused q/k/v or gate/up keeps a pair a slice, the same bytes as the
/// separate linears here. Column-parallel linears split B's output, row-parallel ones A's input.
inline void serve_adapters(const Architecture& m, const ServeSettings& s, ServeReport& r) {
    if (s.max_loras == 0) return;
    const ParameterTable table = parameter_table(m);
    const std::uint64_t tp = s.tp, kv = m.key_value_heads();
    for (const ParamRow& row : table.rows) {
        if (!detail::quantised(row)) continue;
        const std::uint64_t in = row.dims.begin()[0], out = row.dims.begin()[1];
        const bool split = row.split == ParamSplit::tensor;
        const bool by_input = split && linear_row(row.linear).row_parallel;
        // k and v with fewer heads than ranks: each rank keeps a whole head (QKVParallelLinear).
        const bool kv_row = row.linear == Linear::k || row.linear == Linear::v;
        const std::uint64_t out_rank = !split || by_input  ? out
                                       : kv_row && kv < tp ? out / kv
                                                           : ceil_div(Count(out), tp).value();
        const std::uint64_t in_rank = by_input ? ceil_div(Count(in), tp).value() : in;
        const Count slots = Count(s.max_loras) * s.max_lora_rank * dtype::bf16;
        const std::uint64_t layers = table.kind_layers[row.kind];
        r.weight_tensors.push_back({slots * in_rank, layers});
        r.weight_tensors.push_back({slots * out_rank, layers});
        r.lora += Count(layers) * (slots * in_rank + slots * out_rank);
        r.lora_linears += layers;
    }
}

/// DeepSeek-V3.2's indexer keys a token, whatever the cache's dtype: fp8 values and an fp32 scale
/// per 128 (vLLM's DeepseekV32IndexerCache: 132 bytes at index_head_dim 128).
inline std::uint64_t indexer_key_bytes(const LatentAttention& a) {
    constexpr Storage key{DType::fp8_e4m3, 128, DType::fp32};
    return a.indexed() ? key.bytes(Count(a.index_head_dim)).value() : 0;
}

/// The blocks a sequence keeps in a layer (a kind's view) of `full` blocks a sequence: a
/// cross-attention layer's own cache its images' tokens alone; a sliding-window layer its window's
/// tokens and one block more (the block the window's start falls in).
inline std::uint64_t layer_blocks(const Architecture& v, const ServeSettings& s,
                                  std::uint64_t full) {
    const std::uint64_t own = v.mixer == Mixer::cross_attention && !s.engine_pool
                                  ? ceil_div(Count(v.cross_attention_tokens), s.block_size).value()
                                  : full;
    if (v.window == 0) return own;
    return std::min(own, ceil_div(Count(v.window), s.block_size).value() + 1);
}

/// The KV cache (and Mamba state) of s.batch sequences of s.context tokens, on one rank.
inline void serve_cache(const Architecture& m, const ServeSettings& s, ServeReport& r) {
    const std::uint64_t tp = s.tp;
    // The cache, a kind of layer at a time: k and v of its key/value heads on this rank (whole
    // heads when fewer than ranks), or latent attention's compressed latent and k's rotary part
    // (one per token, whole on every rank, as vLLM keeps it).
    const std::uint64_t kv = m.key_value_heads();
    r.kv_replicated = !m.mla.enabled() && kv < tp;
    r.kv_heads_per_rank = m.mla.enabled() ? 1 : r.kv_replicated ? 1 : kv / tp;
    r.kv_latent = m.mla.enabled();
    r.indexer_key_bytes = indexer_key_bytes(m.mla);
    r.blocks_per_sequence = 0;
    const std::uint64_t cache = bytes_per_element(s.kv_dtype);
    // In an engine's pool a sequence's image tokens (mllama's) take slots beside its text.
    const Count pooled = Count(s.context) + (s.engine_pool ? m.cross_attention_tokens : 0);
    const std::uint64_t blocks_full = ceil_div(pooled, s.block_size).value();
    r.cross_tokens = m.cross_attention_tokens;
    for (std::size_t k = 0; k < m.kind_count(); ++k) {
        const std::uint64_t layers = m.layers_of_kind(k);
        if (layers == 0) continue;
        const Architecture v = m.kind_view(k);
        // An MLP's layer caches nothing, nor in a cache of its own a cross-attention layer
        // without images.
        if (v.mixer == Mixer::none || (!s.engine_pool && !v.runs_in_step())) continue;
        if (v.mixer == Mixer::cross_attention) r.cross_layers += layers;
        if (state_space(v.mixer)) {  // no cache: a state per sequence (transformers'
                                     // conv_states, ssm_states)
            const std::uint64_t channels = v.ssm.d_inner / tp;
            // Mamba-2's convolution also runs over B and C (its conv_states' conv_dim), a Gated
            // DeltaNet's over q and k; its recurrent state, H x N x d_v, is d_i N as Mamba-2's.
            const std::uint64_t conv = v.mixer != Mixer::mamba
                                           ? channels + 2 * v.ssm.groups * v.ssm.d_state / tp
                                           : channels;
            r.state_layers += layers;
            const Count per_layer = Count(conv) * v.ssm.d_conv * dtype::bf16 +
                                    Count(channels) * v.ssm.d_state * dtype::fp32;
            r.state_bytes_per_sequence += Count(layers) * per_layer;
            r.cache_tensors.push_back({Count(s.batch) * per_layer, layers});
            if (!attends(v.mixer)) continue;  // Falcon-H1's layers cache k and v beside it
        }
        r.cache_layers += layers;
        const Count per_token =
            Count(layers) * (cache * (v.mla.enabled() ? v.mla.kv_lora_rank + v.mla.qk_rope_head_dim
                                                      : 2 * r.kv_heads_per_rank * v.head_size()) +
                             indexer_key_bytes(v.mla));
        const std::uint64_t blocks = layer_blocks(v, s, blocks_full);
        r.kv_bytes_per_token += per_token;
        const Count kind_cache = Count(s.batch) * blocks * s.block_size * per_token;
        r.kv_cache += kind_cache;
        r.cache_tensors.push_back({Count(kind_cache.value() / layers), layers});
        r.blocks_per_sequence = std::max(r.blocks_per_sequence, blocks);
        if (v.window != 0 && blocks < blocks_full) r.windowed_layers += layers;
    }
    r.ssm_state = Count(s.batch) * r.state_bytes_per_sequence;
}

/// A prefill chunk's temporaries: a batch whose tokens pass a chunk fills it (the product is not
/// formed, so never wraps); with images, the encoder's pass of the chunk's before it.
inline void serve_activations(const Architecture& m, const ServeSettings& s, ServeReport& r) {
    const std::uint64_t chunk = s.hf_generate ? ~std::uint64_t{0} : s.prefill_chunk;
    r.prefill_tokens = s.batch > chunk / s.context ? chunk : s.batch * s.context;
    r.prefill_tensors = forward_temporaries(m, r.prefill_tokens, s.batch, s.tp, s.hf_generate);
    if (s.images.any()) {
        EncoderPass e;
        if (m.vision.tiled()) {  // mllama's: the chunk's sequences' images, all of them
            const std::uint64_t sequences = ceil_div(Count(r.prefill_tokens), s.context).value();
            e = tiled_encoder_pass(m, s.images, std::min(sequences, s.batch));
            r.prefill_tensors =
                with_cross_attention(std::move(r.prefill_tensors), m, Count(r.prefill_tokens),
                                     std::min(sequences, s.batch));
        } else {
            e = encoder_pass(m, s.images, chunk, s.batch);
        }
        r.encoder_items = e.items, r.encoder_tokens_per_item = e.tokens_per_item;
        r.encoder_outputs = e.outputs;
        r.prefill_tensors = after_encoder(std::move(r.prefill_tensors), e);
    }
    r.activations = total_bytes(r.prefill_tensors);
}
}  // namespace detail

inline ServeReport serve(const Architecture& m, const ServeSettings& s);

namespace detail {
/// The draft's weights (bf16) and KV cache at the same tp, batch and context, added to `r`.
inline void serve_draft(const ServeSettings& s, ServeReport& r) {
    ServeSettings d = s;
    d.draft = nullptr, d.weights = &weight_formats[0], d.max_loras = 0;
    const ServeReport dr = serve(*s.draft, d);
    r.draft_weights = dr.weights, r.draft_parameters = dr.parameters;
    r.draft_kv_bytes_per_token = dr.kv_bytes_per_token, r.draft_kv_cache = dr.kv_cache;
    r.draft_cache_layers = dr.cache_layers;
    r.weight_tensors.insert(r.weight_tensors.end(), dr.weight_tensors.begin(),
                            dr.weight_tensors.end());
    r.cache_tensors.insert(r.cache_tensors.end(), dr.cache_tensors.begin(), dr.cache_tensors.end());
}
}  // namespace detail

/// `m` with the image tokens each sequence's cross-attention layers read (mllama's: every image
/// padded to max_num_tiles tiles), as a step's model carries them.
inline Architecture serving_model(const Architecture& m, const ServeSettings& s) {
    Architecture served = m;
    served.cross_attention_tokens = cross_attention_tokens(m.vision, s.images, 1);
    return served;
}

/// The weights, KV cache and prefill activations of serving `m` as `s` says, on one rank; a count
/// past 64 bits names the inputs that made it.
inline ServeReport serve(const Architecture& model, const ServeSettings& s) {
    validate(model);
    validate(s, model);
    const Architecture m = serving_model(model, s);
    const auto n = [](std::uint64_t v) { return std::to_string(v); };
    ServeReport r;
    detail::named_overflow([&] { detail::serve_weights(m, s, r); },
                           [&] { return detail::parameter_overflow(m); });
    detail::named_overflow([&] { detail::serve_adapters(m, s, r); },
                           [&] {
                               return "the LoRA buffers of max loras (" + n(s.max_loras) +
                                      ") x max lora rank (" + n(s.max_lora_rank) +
                                      ") overflow 64 bits";
                           });
    detail::named_overflow([&] { detail::serve_cache(m, s, r); },
                           [&] {
                               return "the KV cache of batch (" + n(s.batch) + ") x context (" +
                                      n(s.context) + ", in blocks of " + n(s.block_size) +
                                      " tokens) overflows 64 bits";
                           });
    detail::named_overflow(
        [&] { detail::serve_activations(m, s, r); },
        [&] {
            return "the activations of a prefill of " +
                   (s.hf_generate
                        ? "batch (" + n(s.batch) + ") x context (" + n(s.context) + ") tokens"
                        : n(r.prefill_tokens) + " tokens (prefill chunk " + n(s.prefill_chunk) +
                              ")") +
                   " and the logits of batch (" + n(s.batch) + ") overflow 64 bits";
        });
    if (s.draft) detail::serve_draft(s, r);
    return r;
}

/// What a device of `capacity` bytes (its memory less a reserve) holds when serving as `s` says.
struct ServeFit {
    bool fits = false;  ///< the peak at s.batch fits
    Count
        kv_capacity_tokens;  ///< cache tokens left beside the weights and activations, whole blocks
    std::uint64_t max_batch = 0;        ///< the most sequences of s.context that fit (0: none)
    std::optional<ServeReport> at_max;  ///< the report at max_batch
};

/// A report's own peak: what serve_fit weighs by default.
struct ServePeak {
    Count operator()(const ServeReport& r, const ServeSettings&) const { return r.peak(); }
};

/// The largest batch whose figure `weigh(report, settings)` fits (it grows with the batch), by
/// doubling then bisecting. The cache's capacity counts what `weigh` adds to the report's peak
/// at s.batch as fixed.
template <class Weigh = ServePeak>
ServeFit serve_fit(const Architecture& m, ServeSettings s, Count capacity, Weigh weigh = {}) {
    ServeFit f;
    const ServeReport here = serve(m, s);
    const Count weighed = weigh(here, s);
    f.fits = weighed <= capacity;
    // What weigh adds (never below zero: the report's peak is within its figure).
    const Count added(weighed.value() - std::min(weighed, here.peak()).value());
    const Count fixed =
        here.weights + here.draft_weights + here.lora + here.ssm_state + here.activations + added;
    if (capacity > fixed && here.cache_bytes_per_token() > Count(0)) {
        const std::uint64_t tokens =
            (capacity.value() - fixed.value()) / here.cache_bytes_per_token().value();
        f.kv_capacity_tokens = Count(tokens / s.block_size * s.block_size);
    }
    const auto fits = [&](std::uint64_t batch) {
        s.batch = batch;
        try {
            return weigh(serve(m, s), s) <= capacity;
        } catch (const overflow_error&) {  // a peak past 2^64 bytes: far over any device
            return false;
        }
    };
    if (!fits(1)) return f;
    // Doubling to the largest batch 64 bits hold (where the peak has long since overflowed).
    constexpr std::uint64_t most = std::numeric_limits<std::uint64_t>::max();
    std::uint64_t lo = 1, hi = 2;  // lo fits; hi is to be tried
    while (lo < most && fits(hi)) lo = hi, hi = hi > most / 2 ? most : 2 * hi;
    while (hi - lo > 1) {
        const std::uint64_t mid = lo + (hi - lo) / 2;
        (fits(mid) ? lo : hi) = mid;
    }
    f.max_batch = lo;
    s.batch = lo;
    f.at_max = serve(m, s);
    return f;
}

}  // namespace memcalc
