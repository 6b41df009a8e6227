#include <catch2/catch.hpp>

#include "fixtures.hpp"
#include "memcalc/finetune.hpp"
#include "memcalc/params.hpp"
#include "model_file.hpp"

using namespace memcalc;

TEST_CASE("LLaMA 7B's parameter table matches the model document row by row", "[params]") {
    const ParameterTable t = parameter_table(fixtures::llama_7b());
    CHECK(t.part(Part::embedding).value() == 131072000);
    CHECK(t.part(Part::attention).value() == 67108864);
    CHECK(t.part(Part::mlp).value() == 135266304);
    CHECK(t.part(Part::norms).value() == 8192);
    CHECK(t.per_layer().value() == 202383360);
    CHECK(t.part(Part::final_norm).value() == 4096);
    CHECK(t.part(Part::head).value() == 131072000);
    CHECK(t.total().value() == 6738415616ULL);
}

TEST_CASE("a tiny model counted by hand", "[params]") {
    // h=8, L=2, a=2, f=16, V=10, plain MLP, LayerNorm, all biases, 4 learned positions, untied
    // head: embeddings 10*8 + 4*8 = 112; per layer: norms 2*(8+8) = 32, attention 4*64 + 4*8 = 288,
    // mlp 2*8*16 + 16 + 8 = 280, so 600; final norm 16; head 80. Total 112 + 1200 + 16 + 80 = 1408.
    Architecture m;
    m.hidden = 8, m.layers = 2, m.heads = 2, m.ffn = 16, m.vocab = 10, m.max_positions = 4;
    m.mlp = Mlp::plain, m.norm = Norm::layernorm, m.bias = Bias::all,
    m.position = Position::learned;
    const ParameterTable t = parameter_table(m);
    CHECK(t.per_layer().value() == 600);
    CHECK(t.group(Group::input).value() == 112);
    CHECK(t.group(Group::head).value() == 96);
    CHECK(t.total().value() == 1408);

    SECTION("tying the head removes V h and moves the shared matrix to the head's group") {
        m.tied_embeddings = true;
        const ParameterTable tied = parameter_table(m);
        CHECK(tied.total().value() == 1408 - 80);
        CHECK(tied.group(Group::head).value() == 16 + 80);
        CHECK(tied.group(Group::input).value() == 32);
    }
    SECTION("qkv-only biases drop the output projection's and the MLP's") {
        m.bias = Bias::qkv;
        CHECK(parameter_table(m).total().value() == 1408 - 2 * (8 + 16 + 8));
    }
}

namespace {
struct ParamShape {
    const char* name;
    std::uint64_t hidden, layers, heads, kv_heads, head_dim, ffn, vocab, positions;
    Mlp mlp;
    Norm norm;
    Bias bias;
    bool tied;
    std::uint64_t experts, top_k;
    std::uint64_t published;  // the checkpoint's exact count
};
}  // namespace

TEST_CASE("published exact counts fall out of the general table", "[params]") {
    // clang-format off
    const ParamShape shape = GENERATE(values<ParamShape>({
        //  name            h     L   a   kv  hd   f      V       pos   mlp         norm            
        // bias       tied   E  k  published
        {"llama-13b",     5120,  40, 40,  0,   0, 13824,  32000,    0, Mlp::gated, Norm::rmsnorm,
              Bias::none, false, 0, 0, 13015864320ULL},
        {"llama-2-70b",   8192,  80, 64,  8,   0, 28672,  32000,    0, Mlp::gated, Norm::rmsnorm,
              Bias::none, false, 0, 0, 68976648192ULL},
        {"llama-3-8b",    4096,  32, 32,  8,   0, 14336, 128256,    0, Mlp::gated, Norm::rmsnorm,
              Bias::none, false, 0, 0,  8030261248ULL},
        {"mixtral-8x7b",  4096,  32, 32,  8,   0, 14336,  32000,    0, Mlp::gated, Norm::rmsnorm,
              Bias::none, false, 8, 2, 46702792704ULL},
        {"qwen2-7b",      3584,  28, 28,  4,   0, 18944, 152064,    0, Mlp::gated, Norm::rmsnorm,
              Bias::qkv,  false, 0, 0,  7615616512ULL},
        {"gemma-7b",      3072,  28, 16, 16, 256, 24576, 256000,    0, Mlp::gated, Norm::rmsnorm,
              Bias::none, true,  0, 0,  8537680896ULL},
        {"gpt2",           768,  12, 12,  0,   0,  3072,  50257, 1024, Mlp::plain,
            Norm::layernorm, Bias::all,  true,  0, 0,   124439808ULL},
        {"gpt2-xl",       1600,  48, 25,  0,   0,  6400,  50257, 1024, Mlp::plain,
            Norm::layernorm, Bias::all,  true,  0, 0,  1557611200ULL},
    }));
    // clang-format on
    CAPTURE(shape.name);
    Architecture m;
    m.hidden = shape.hidden, m.layers = shape.layers, m.heads = shape.heads,
    m.kv_heads = shape.kv_heads;
    m.head_dim = shape.head_dim, m.ffn = shape.ffn, m.vocab = shape.vocab,
    m.max_positions = shape.positions;
    m.mlp = shape.mlp, m.norm = shape.norm, m.bias = shape.bias, m.tied_embeddings = shape.tied;
    m.position = shape.positions > 0 ? Position::learned : Position::rotary;
    m.experts = shape.experts, m.experts_per_token = shape.top_k;
    CHECK(parameter_table(m).total().value() == shape.published);
}

TEST_CASE("a mixture-of-experts layer holds E copies of the MLP and a router", "[params]") {
    Architecture dense = fixtures::mistral_7b();
    Architecture moe = dense;
    moe.experts = 8, moe.experts_per_token = 2;
    const ParameterTable d = parameter_table(dense), e = parameter_table(moe);
    CHECK(e.part(Part::mlp).value() == 8 * d.part(Part::mlp).value());
    CHECK(e.part(Part::router).value() == 4096 * 8);
    CHECK(e.part(Part::attention) == d.part(Part::attention));
}

TEST_CASE("impossible architectures are refused with the field named", "[params]") {
    Architecture m = fixtures::llama_7b();
    SECTION("heads that do not divide the width") {
        m.heads = 30;
        CHECK_THROWS_WITH(parameter_table(m),
                          Catch::Contains("heads (30) must divide hidden (4096)"));
    }
    SECTION("unless the head width is given") {
        m.heads = 30, m.head_dim = 128;
        CHECK_NOTHROW(parameter_table(m));
    }
    SECTION("key/value heads that do not divide the heads") {
        m.kv_heads = 5;
        CHECK_THROWS_WITH(parameter_table(m),
                          Catch::Contains("kv_heads (5) must divide heads (32)"));
    }
    SECTION("a zero size") {
        m.vocab = 0;
        CHECK_THROWS_WITH(parameter_table(m), Catch::Contains("vocab must be a positive integer"));
    }
    SECTION("more routed experts than experts") {
        m.experts = 2, m.experts_per_token = 3;
        CHECK_THROWS_WITH(parameter_table(m), Catch::Contains("experts_per_token (3)"));
    }
    SECTION("more layers than a timeline should hold") {
        m.layers = 1000000;
        CHECK_THROWS_WITH(parameter_table(m), Catch::Contains("layers (1000000) exceeds"));
    }
    SECTION("a width whose square overflows") {
        m.hidden = 1ULL << 33, m.heads = 1;
        CHECK_THROWS_AS(parameter_table(m), overflow_error);
    }
}

TEST_CASE("every preset's rows carry their linear by type, named as linear_rows names it",
          "[params][finetune]") {
    // The typed identity replaced name lookups (a ".bias" suffix, linear_of): on every preset,
    // fine-tuned or not, a name and its type say the same.
    const auto ends_with = [](Text s, Text end) {
        return s.size() >= end.size() && s.substr(s.size() - end.size()) == end;
    };
    for (const auto& name : cli::preset_names()) {
        const Architecture m = cli::load_preset(name).architecture;
        FineTuning f;
        f.mode = Training::lora, f.lora.targets = {"all-linear"};
        f.lora.variant = LoraVariant::dora;
        std::vector<ParameterTable> tables{parameter_table(m),
                                           fine_tuned_table(m, parameter_table(m), f)};
        FineTuning v2;
        v2.mode = Training::adapter_v2;
        try {  // LLaMA-Adapter v2 where it is modelled: dense attention and MLP layers
            tables.push_back(fine_tuned_table(m, parameter_table(m), v2));
        } catch (const error&) {}
        for (const ParameterTable& t : tables)
            for (const ParamRow& r : t.rows) {
                CAPTURE(name, std::string(r.tensor));
                const LinearRow& l = linear_row(r.linear);
                const std::string own(r.linear == Linear::none ? "" : l.tensor);
                // A fused linear's adapter is named for the fused module.
                ParamRow as_weight = r;
                as_weight.role = ParamRole::weight;
                const auto* fused =
                    r.role > ParamRole::bias ? detail::fused_linear_of(m, as_weight) : nullptr;
                const std::string weight = fused ? fused->names.front() : own;
                switch (r.role) {
                    case ParamRole::weight:
                        if (r.linear != Linear::none) CHECK(r.tensor == weight);
                        break;
                    case ParamRole::bias:
                        CHECK(ends_with(r.tensor, ".bias"));
                        if (r.linear != Linear::none) CHECK(r.tensor == Text(l.bias));
                        break;
                    case ParamRole::lora_a: CHECK(ends_with(r.tensor, weight + ".lora_A")); break;
                    case ParamRole::lora_b: CHECK(ends_with(r.tensor, weight + ".lora_B")); break;
                    case ParamRole::magnitude:
                        CHECK(ends_with(r.tensor, weight + ".lora_magnitude_vector"));
                        break;
                    case ParamRole::scale:
                        CHECK((r.tensor == Text(own + ".adapter_scale") ||
                               r.tensor == Text(own + ".adapter_bias")));
                        break;
                }
                if (r.linear != Linear::none)  // LLaMA-Adapter's prompt and gate are no linear's
                    CHECK((r.part == Part::adapter) == (r.role > ParamRole::bias));
                CHECK(ends_with(r.tensor, ".bias") == (r.role == ParamRole::bias));
                // Every row named as a linear's weight or bias is typed so.
                for (const LinearRow& named : linear_rows) {
                    if (named.linear == Linear::none) continue;
                    if (r.tensor == Text(named.tensor)) CHECK(r.of_linear(named.linear));
                    if (r.tensor == Text(named.bias)) CHECK(r.role == ParamRole::bias);
                    if (r.tensor == Text(named.bias)) CHECK(r.linear == named.linear);
                }
            }
    }
}
