// lit-gpt's code as program facts (validation/third_party/litgpt_run.py measures it): a merged
// LoRA over a fused q/k/v linear's parts, v's view keeping the fused output, RMSNorm in the
// compute dtype, and its chunked loss over fp32 logits. Hand sums on several shapes.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "fixtures.hpp"
#include "model_file.hpp"
#include "run_program.hpp"
#include "step_named.hpp"
#include "workspace_named.hpp"
#include "memcalc/bitsandbytes.hpp"
#include "memcalc/estimate.hpp"
#include "memcalc/finetune.hpp"

using namespace memcalc;

namespace {
FineTuning merged(std::uint64_t rank, std::vector<std::string> targets) {
    FineTuning f;
    f.mode = Training::lora, f.lora.rank = rank, f.lora.targets = std::move(targets);
    f.lora.variant = LoraVariant::merged, f.lora.fp32 = false;
    return f;
}

/// The bytes of `layer`'s rows whose op contains `op` and tensor contains `tensor`.
std::uint64_t bytes_of_rows(const LayerActivations& layer, const std::string& op,
                            const std::string& tensor = "") {
    std::uint64_t sum = 0;
    for (const SavedTensor& row : layer.rows)
        if (std::string(row.op).find(op) != std::string::npos &&
            std::string(row.tensor).find(tensor) != std::string::npos)
            sum += row.bytes.value();
    return sum;
}

LayerActivations layer_of(const Architecture& m, std::uint64_t s, std::uint64_t b,
                          Attention attention, const LayerTuning& tuning = {},
                          TorchVersion torch = TorchVersion::v2_2) {
    return architecture_layer(m, s, b, DType::bf16, attention, Runtime{Platform::cuda, torch}, {},
                              tuning);
}
}  // namespace

TEST_CASE("A merged adapter on a fused q/k/v: A r rows a part, B each part's width",
          "[finetune][litgpt]") {
    Architecture m = GENERATE(fixtures::llama_7b(), fixtures::mistral_7b(), fixtures::gpt2_small());
    m.fused_qkv = true;
    CAPTURE(m.name);
    const std::uint64_t r = GENERATE(8, 16), h = m.hidden, L = m.layers;
    const std::uint64_t q = m.heads * m.head_size(), kv = m.key_value_heads() * m.head_size();
    const ParameterTable qv =
        fine_tuned_table(m, parameter_table(m), merged(r, {"q_proj", "v_proj"}));
    CHECK(trainable_parameters(qv) == Count(L) * r * (2 * h + q + kv));
    const ParameterTable v = fine_tuned_table(m, parameter_table(m), merged(r, {"v_proj"}));
    CHECK(trainable_parameters(v) == Count(L) * r * (h + kv));
    // All three parts by the fused name: A of 3r rows (peft's one adapter has r).
    const ParameterTable all = fine_tuned_table(m, parameter_table(m), merged(r, {"qkv_proj"}));
    CHECK(trainable_parameters(all) == Count(L) * r * (3 * h + q + 2 * kv));
    CHECK(layer_tuning(qv, merged(r, {"q_proj", "v_proj"}), 0).adapted == bit(Linear::q));
    CHECK(layer_tuning(v, merged(r, {"v_proj"}), 0).adapted == bit(Linear::v));
    // peft's LoRA still refuses a fused linear's parts.
    FineTuning peft = merged(r, {"q_proj"});
    peft.lora.variant = LoraVariant::lora;
    CHECK_THROWS_WITH(fine_tuned_table(m, parameter_table(m), peft),
                      Catch::Contains("or its parts with --lora-variant merged"));
}

TEST_CASE("lit-gpt's models train LoRA with the parameters its scripts print",
          "[finetune][litgpt]") {
    // finetune/lora.py @8641822: rank 8 on the query and value parts (resource-tables.md's column).
    const auto [name, trainable] =
        GENERATE(table<std::string, std::uint64_t>({{"litgpt-llama-2-7b", 4194304},
                                                    {"litgpt-llama-2-13b", 6553600},
                                                    {"litgpt-phi-1_5", 1572864},
                                                    {"litgpt-stablelm-base-alpha-3b", 2097152}}));
    CAPTURE(name);
    const Architecture m = cli::load_model_file(std::string(MEMCALC_SOURCE_DIR) +
                                                "/validation/published/models/" + name + ".json")
                               .architecture;
    const ParameterTable t =
        fine_tuned_table(m, parameter_table(m), merged(8, {"q_proj", "v_proj"}));
    CHECK(trainable_parameters(t) == Count(trainable));
}

TEST_CASE("A merged adapter keeps one dropout, A's parts-wide output and index_copy's source",
          "[finetune][litgpt]") {
    Architecture m = GENERATE(fixtures::llama_7b(), fixtures::mistral_7b());
    m.fused_qkv = true;
    const std::uint64_t s = GENERATE(64, 300), b = GENERATE(1, 2), r = 8, T = s * b, d = 2;
    CAPTURE(m.name, s, b);
    const std::uint64_t q = m.heads * m.head_size(), kv = m.key_value_heads() * m.head_size();
    const FineTuning f = merged(r, {"q_proj", "v_proj"});
    const ParameterTable t = fine_tuned_table(m, parameter_table(m), f);
    const LayerActivations layer = layer_of(m, s, b, Attention::flash, layer_tuning(t, f, 0));
    CHECK(bytes_of_rows(layer, "LoRA dropout") == T * m.hidden);  // one bool mask
    CHECK(bytes_of_rows(layer, "LoRA B") == T * 2 * r * d);
    CHECK(bytes_of_rows(layer, "zero padding", "source") == T * (q + kv) * d);
    CHECK(bytes_of_rows(layer, "zero padding", "index") == (q + kv) * 8);
    // Every part adapted: nothing padded.
    const FineTuning whole = merged(r, {"qkv_proj"});
    const ParameterTable w = fine_tuned_table(m, parameter_table(m), whole);
    CHECK(bytes_of_rows(layer_of(m, s, b, Attention::flash, layer_tuning(w, whole, 0)),
                        "zero padding") == 0);
}

TEST_CASE("v, a view of a fused q/k/v output, keeps all of it where rotary copied q and k",
          "[attention][litgpt]") {
    Architecture m = GENERATE(fixtures::llama_7b(), fixtures::mistral_7b());
    const std::uint64_t s = GENERATE(128, 300), d = 2;
    CAPTURE(m.name, s);
    const std::uint64_t q = m.heads * m.head_size(), kv = m.key_value_heads() * m.head_size();
    m.repeat_kv = false;
    const std::uint64_t apart = saved_bytes(layer_of(m, s, 2, Attention::flash).rows).value();
    m.fused_qkv = true;
    const std::uint64_t fused = saved_bytes(layer_of(m, s, 2, Attention::flash).rows).value();
    CHECK(fused - apart == 2 * s * (q + kv) * d);  // q's and k's parts beside v's
    // Eager attention copies v for its product when b > 1, keeping nothing of the fused output;
    // at b = 1 the view is what it keeps.
    Architecture unfused = m;
    unfused.fused_qkv = false;
    CHECK(saved_bytes(layer_of(m, s, 2, Attention::eager).rows) ==
          saved_bytes(layer_of(unfused, s, 2, Attention::eager).rows));
    if (m.key_value_heads() == m.heads)  // grouped heads are repeated, a copy: no view kept
        CHECK(bytes_of_rows(layer_of(m, s, 1, Attention::eager), "attention over V", "part") ==
              s * (q + kv) * d);
    // Without rotary q and k are views too: the three rows are the whole output already.
    m.position = Position::learned;
    CHECK(bytes_of_rows(layer_of(m, s, 2, Attention::flash), "attention over V", "part") == 0);
}

TEST_CASE("RMSNorm in the input's dtype keeps x itself, x^2 before torch 2.2 and 1/rms in it",
          "[norm][litgpt]") {
    Architecture m = GENERATE(fixtures::llama_7b(), fixtures::mistral_7b());
    m.rmsnorm_kernel = RmsnormKernel::torch_input_dtype;
    const std::uint64_t s = GENERATE(64, 300), b = 2, T = s * b, h = m.hidden, d = 2;
    CAPTURE(m.name, s);
    const LayerActivations v22 = layer_of(m, s, b, Attention::flash);
    const LayerActivations v113 = layer_of(m, s, b, Attention::flash, {}, TorchVersion::v1_13);
    // Two norms: x (bf16), 1/rms (bf16), x_norm (bf16, the weight trains); x^2 before torch 2.2.
    CHECK(bytes_of_rows(v22, "(RMSNorm)") == 2 * (T * h * d + T * d + T * h * d));
    CHECK(bytes_of_rows(v113, "(RMSNorm)") - bytes_of_rows(v22, "(RMSNorm)") == 2 * T * h * d);
    // Its backward's steps in bf16: x * rsqrt's three, pow's five.
    CHECK(fixtures::workspace_named(v22, "attention norm (RMSNorm) backward: pow(x, 2)")
              .bytes.value() == 5 * T * h * d);
    // transformers' upcasts: the same rows in fp32.
    m.rmsnorm_kernel = RmsnormKernel::torch;
    CHECK(bytes_of_rows(layer_of(m, s, b, Attention::flash), "(RMSNorm)") ==
          2 * (T * h * 4 + T * 4 + T * h * d));
}

TEST_CASE("lit-gpt's chunked loss: chunks of N tokens, in the logits' dtype, fp32 logits fp32",
          "[loss][litgpt]") {
    // GPT-2's final LayerNorm: its backward stays below the loss's, which makes the step's top.
    Architecture m = fixtures::gpt2_small();
    m.vocab = GENERATE(50257, 128256);
    const std::uint64_t chunk = GENERATE(128, 1000), b = 8, seq = m.max_positions;
    CAPTURE(m.vocab, chunk);
    // A long sequence under a fused kernel, so that the loss's backward makes the loss step's top.
    Settings s;
    s.seq = seq, s.micro_batch = b, s.activations = ActivationModel::architecture;
    s.recipe = builtin_recipe("bf16-adam"), s.framework.attention = Attention::flash;
    s.framework.loss = LossKernel::bf16;
    const Report whole = estimate(m, s);
    s.framework.loss = LossKernel::chunked_bf16, s.framework.loss_chunk_tokens = chunk;
    const Report chunked = estimate(m, s);
    const std::uint64_t sbV = seq * b * m.vocab, part = std::min(chunk, seq) * b * m.vocab;
    const auto loss = [](const Report& r) {
        return fixtures::step_named(r, "loss").bytes.total().value();
    };
    // The same saved rows; the backward's two gradients a chunk's, bf16.
    CHECK(saved_bytes(whole.head) == saved_bytes(chunked.head));
    CHECK(loss(whole) - loss(chunked) == 4 * sbV - 4 * part);
    // Logits the model returns in fp32: log-probabilities in fp32, and the logits themselves.
    Architecture wide = m;
    wide.logits_fp32 = true;
    const Report fp32 = estimate(wide, s);
    CHECK(saved_bytes(fp32.head).value() - saved_bytes(chunked.head).value() == 2 * sbV);
    CHECK(loss(fp32) - loss(chunked) == 2 * sbV + 2 * sbV + 4 * part);
}

TEST_CASE("memcalc --loss chunked-bf16 --loss-chunk-tokens: spellings, JSON and errors",
          "[loss][cli][litgpt]") {
    const std::string base = "--preset llama-7b --seq 300 --activations architecture ";
    const testing::Run ok =
        testing::memcalc(base + "--loss chunked-bf16 --loss-chunk-tokens 128 --format json");
    REQUIRE(ok.status == 0);
    const nlohmann::json j = nlohmann::json::parse(ok.out);
    CHECK(j["settings"]["loss"] == "chunked-bf16");
    CHECK(j["settings"]["loss_chunk_tokens"] == 128);
    CHECK(j["settings"]["loss_chunks"].is_null());
    const auto refused = [&](const std::string& args, const std::string& message) {
        const testing::Run run = testing::memcalc(base + args);
        CAPTURE(args);
        CHECK(run.status != 0);
        CHECK(run.out.empty());
        CHECK(run.err == "memcalc: " + message + "\n");
    };
    refused("--loss bf16 --loss-chunk-tokens 128",
            "--loss-chunk-tokens 128: only --loss chunked, chunked-bf16 or chunked-compiled splits "
            "the loss");
    refused("--loss chunked --loss-chunks 4 --loss-chunk-tokens 128",
            "--loss-chunk-tokens 128: give it or --loss-chunks, not both");
    refused("--loss chunked-bf16 --loss-chunk-tokens 0",
            "--loss-chunk-tokens must be a positive integer (got '0')");
}

namespace {
Report lora_step(Architecture m, bool require_grads, Recompute mode = Recompute::none) {
    m.input_require_grads = require_grads;
    Settings s;
    s.seq = 256, s.micro_batch = 2, s.activations = ActivationModel::architecture;
    s.recipe = builtin_recipe("bf16-adam"), s.framework.attention = Attention::flash;
    s.recompute = mode;
    s.tuning.mode = Training::lora, s.tuning.lora.fp32 = false;
    return estimate(m, s);
}
}  // namespace

TEST_CASE("Under adapters, a frozen embedding's first layer keeps nothing before its first adapter",
          "[finetune][litgpt]") {
    // The first layer's norm keeps nothing, nor its adapters' dropout masks (their input needs no
    // gradient); a sequential MLP reads the attention's sum, which needs one.
    const Architecture m = GENERATE(fixtures::llama_7b(), fixtures::mistral_7b());
    CAPTURE(m.name);
    const std::uint64_t T = 256 * 2, h = m.hidden;
    const Report hooked = lora_step(m, true), plain = lora_step(m, false);
    const std::uint64_t norm = T * h * 4 + T * 4;  // transformers' RMSNorm: x in fp32 and 1/rms
    const std::uint64_t masks = 2 * T * h;         // q_proj's and v_proj's dropouts, bool
    const std::string L = std::to_string(m.layers);
    for (const std::string& step :
         std::vector<std::string>{"forward 2", "forward " + L, "loss", "backward 1"}) {
        CAPTURE(step);
        CHECK(fixtures::step_named(hooked, step).bytes.kept_activations.value() -
                  fixtures::step_named(plain, step).bytes.kept_activations.value() ==
              norm + masks);
    }
    // Recomputation keeps its checkpoints as before.
    CHECK(lora_step(m, true, Recompute::full).peak_step().bytes.total() ==
          lora_step(m, false, Recompute::full).peak_step().bytes.total());
}

TEST_CASE("A parallel layer's MLP without an adapter keeps nothing in the first layer",
          "[finetune][litgpt]") {
    Architecture m = cli::load_preset("pythia-1b").architecture;  // LayerNorms, parallel attention
    const std::uint64_t T = 256 * 2, h = m.hidden, f = m.ffn, d = 2;
    const Report hooked = lora_step(m, true), plain = lora_step(m, false);
    // Two LayerNorms (x, one row for both; each its fp32 mean and 1/std), the two dropout masks
    // (bool), and the MLP: GELU's input; its frozen projections keep nothing more.
    const std::uint64_t norms = T * h * d + 2 * (2 * T * 4), masks = 2 * T * h;
    const std::uint64_t mlp = fixtures::step_named(hooked, "loss").bytes.kept_activations.value() -
                              fixtures::step_named(plain, "loss").bytes.kept_activations.value() -
                              norms - masks;
    CHECK(mlp == T * f * d);  // GELU's input
}

TEST_CASE("lit-gpt's rotary cache: fp32 buffers shared by every layer, whatever the compute dtype",
          "[litgpt]") {
    Architecture m = GENERATE(fixtures::llama_7b(), fixtures::mistral_7b());
    const std::uint64_t s = GENERATE(300, 1304);
    CAPTURE(m.name, s);
    const Precision bf16 = builtin_recipe("bf16-adam").precision();
    const auto tables = [&](RotaryEmbedding r) {
        m.rotary_embedding = r;
        std::uint64_t sum = 0;
        for (const SavedTensor& row : input_side_saved(m, s, 1, bf16))
            if (std::string(row.op) == "rotary embedding") sum += row.bytes.value();
        return sum;
    };
    CHECK(tables(RotaryEmbedding::shared) == 2 * s * m.head_size() * 2);
    CHECK(tables(RotaryEmbedding::shared_fp32) == 2 * s * m.head_size() * 4);
}

TEST_CASE("A merged adapter on linears apart is peft's LoRA", "[finetune][litgpt]") {
    const Architecture m = GENERATE(fixtures::llama_7b(), fixtures::mistral_7b());
    CAPTURE(m.name);
    const FineTuning merged_qv = merged(8, {"q_proj", "v_proj"});
    FineTuning peft = merged_qv;
    peft.lora.variant = LoraVariant::lora;
    const ParameterTable a = fine_tuned_table(m, parameter_table(m), merged_qv);
    const ParameterTable b = fine_tuned_table(m, parameter_table(m), peft);
    CHECK(trainable_parameters(a) == trainable_parameters(b));
    const auto layer = [&](const ParameterTable& t, const FineTuning& f) {
        return saved_bytes(layer_of(m, 256, 2, Attention::flash, layer_tuning(t, f, 0)).rows);
    };
    CHECK(layer(a, merged_qv) == layer(b, peft));
}

TEST_CASE("A heads-first q: a kernel writing its output in q's layout has it copied for o_proj",
          "[litgpt][attention]") {
    Architecture m = GENERATE(fixtures::llama_7b(), fixtures::mistral_7b(), fixtures::gpt2_small());
    const std::uint64_t s = GENERATE(100, 1000), b = GENERATE(1, 2);
    CAPTURE(m.name, s, b);
    const Count out = Count(s * b * m.heads * m.value_head_size() * 2);
    const auto run = [&](bool heads_first, AttentionKernel kernel, const LayerTuning& tuning) {
        m.q_heads_first = heads_first;
        return architecture_layer(m, s, b, DType::bf16, Attention::flash,
                                  Runtime{Platform::cuda, TorchVersion::v2_2, true, kernel}, {},
                                  tuning);
    };
    const auto backward = [](const LayerActivations& layer) {
        return fixtures::workspace_named(layer, "flash attention backward").bytes;
    };
    const LayerTuning full{};
    const LayerActivations plain = run(false, AttentionKernel::flash_attention_2, full);
    for (const AttentionKernel kernel :
         {AttentionKernel::flash_attention_2, AttentionKernel::cudnn}) {
        CAPTURE(attention_kernel_name(kernel));
        const LayerActivations copied = run(true, kernel, full);
        // A trained o_proj keeps the copy, the kernel its own; backward copies it batch-first.
        CHECK(copied.total() == plain.total() + out);
        CHECK(bytes_of_rows(copied, "output projection", "copied token-major") == out.value());
        CHECK(backward(copied) == backward(plain) + out);
    }
    // FlashAttention-3 writes batch-first whatever q's layout: nothing copied.
    CHECK(run(true, AttentionKernel::flash_attention_3, full).total() ==
          run(false, AttentionKernel::flash_attention_3, full).total());
    // A frozen o_proj keeps no input; bitsandbytes' old 4-bit one keeps the copy (graph-held).
    FineTuning qlora = merged(8, {"q_proj", "v_proj"});
    qlora.mode = Training::qlora, qlora.quantized.quantizer = Quantizer::lightning;
    qlora.quantized.bitsandbytes = *bitsandbytes_version_of("0.41.1");
    const ParameterTable table = fine_tuned_table(m, parameter_table(m), qlora);
    const LayerTuning four_bit = layer_tuning(table, qlora, 0);
    qlora.quantized.bitsandbytes = *bitsandbytes_version_of("0.43.2");
    const LayerTuning fixed = layer_tuning(table, qlora, 0);
    const auto kept = [&](const LayerTuning& tuning) {
        return run(true, AttentionKernel::flash_attention_2, tuning).total().value() -
               run(false, AttentionKernel::flash_attention_2, tuning).total().value();
    };
    CHECK(kept(fixed) == 0);
    CHECK(kept(four_bit) == out.value());
    CHECK(bytes_of_rows(run(true, AttentionKernel::flash_attention_2, four_bit),
                        "output projection", "token-major) (kept by bitsandbytes") == out.value());
}
