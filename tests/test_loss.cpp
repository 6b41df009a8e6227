// The loss and the logits as training programs compute and keep them: an fp32 loss over a copy of
// the logits, one in the compute dtype, a fused kernel writing its gradient over the logits; a loop
// that holds the logits through backward or drops them once the loss is made. Hand sums on several
// shapes.
#include <algorithm>
#include <catch2/catch.hpp>

#include "fixtures.hpp"
#include "step_named.hpp"
#include "memcalc/estimate.hpp"
#include "run_program.hpp"

using namespace memcalc;

namespace {
Settings settings(ActivationModel model, LossKernel loss, LogitsLife logits,
                  std::uint64_t microbatches = 1, const char* recipe = "mixed-adam") {
    Settings s;
    s.seq = 256, s.micro_batch = 2, s.activations = model, s.recipe = builtin_recipe(recipe);
    s.framework.loss = loss, s.framework.logits = logits, s.parallel.microbatches = microbatches;
    return s;
}
using fixtures::step_named;
std::uint64_t at(const Report& r, const std::string& step) {
    return step_named(r, step).bytes.total().value();
}
}  // namespace

TEST_CASE(
    "a loop that drops its logits holds them in no backward step, nor beside the next forward",
    "[loss][logits]") {
    const Architecture m =
        GENERATE(fixtures::llama_7b(), fixtures::gpt2_small(), fixtures::mistral_7b());
    const ActivationModel model =
        GENERATE(ActivationModel::korthikanti, ActivationModel::architecture);
    CAPTURE(m.name, activation_model_name(model));
    const Report held = estimate(m, settings(model, LossKernel::fp32, LogitsLife::held, 2));
    const Report freed = estimate(m, settings(model, LossKernel::fp32, LogitsLife::freed, 2));
    const std::uint64_t logits = 256 * 2 * m.vocab * 2;  // s b V, bf16
    const std::string L = std::to_string(m.layers);
    for (const std::string& step :
         std::vector<std::string>{"backward " + L, "backward 1", "optimizer",
                                  "forward 1 of micro-batch 2", "backward 1 of micro-batch 2"})
        CHECK(at(held, step) - at(freed, step) == logits);
    CHECK(at(held, "forward 1") == at(freed, "forward 1"));
    if (model == ActivationModel::korthikanti) {
        CHECK(at(held, "loss") ==
              at(freed, "loss"));  // the formula's loss step holds them throughout
    } else {
        // Dropped when the forward returns, they are gone before the loss's backward, which holds
        // two fp32 gradients of the vocabulary's width: more than the logits and their fp32 copy
        // (measured).
        CHECK(at(held, "loss") - at(freed, "loss") == logits);
    }
}

TEST_CASE(
    "the loss's dtype sizes its log-probabilities and its gradients; a fused kernel keeps neither",
    "[loss]") {
    const Architecture m = GENERATE(fixtures::llama_7b(), fixtures::gpt2_small());
    CAPTURE(m.name);
    const std::uint64_t sbV = 256 * 2 * m.vocab;
    const auto head = [&](LossKernel loss) {
        return saved_bytes(
                   estimate(m, settings(ActivationModel::architecture, loss, LogitsLife::held))
                       .head)
            .value();
    };
    CHECK(head(LossKernel::fp32) - head(LossKernel::bf16) ==
          sbV * 2);  // fp32 log-probabilities, not bf16
    CHECK(head(LossKernel::bf16) - head(LossKernel::fused) == sbV * 2);

    // The loss step, architecture model: fp32 adds an fp32 copy in forward, or the two fp32
    // gradients in backward, whichever is larger; bf16 the two bf16 gradients; fused nothing of the
    // vocabulary's width. It ends with the final norm's backward, beside the head's gradient, the
    // head's rows freed.
    const auto loss_step = [&](LossKernel loss) {
        const Report r =
            estimate(m, settings(ActivationModel::architecture, loss, LogitsLife::held));
        const Step& s = step_named(r, "loss");
        return std::make_pair((s.bytes.workspace + s.bytes.gradients).value(),
                              s.bytes.logits.value());
    };
    const std::uint64_t sb = 256 * 2, sbh = sb * m.hidden;
    const auto final_norm = [&](std::uint64_t l) -> std::uint64_t {
        const std::uint64_t freed = l * sbV + 8 * sb + 2 * sbh;  // log-probs, ids, head's input
        // RMSNorm: pow(x, 2)'s five fp32 sbh, x_norm and 1/rms freed too; LayerNorm: the incoming
        // gradient and its input's. Then the head's and the norm's weight gradients.
        const std::uint64_t work = m.norm == Norm::rmsnorm ? 20 * sbh : 4 * sbh,
                            gone = freed + (m.norm == Norm::rmsnorm ? 2 * sbh + 4 * sb : 0);
        return (work > gone ? work - gone : 0) + 2 * (m.vocab * m.hidden + m.hidden) +
               (m.norm == Norm::layernorm ? 2 * m.hidden : 0);
    };
    const auto [fp32_work, fp32_logits] = loss_step(LossKernel::fp32);
    const auto [bf16_work, bf16_logits] = loss_step(LossKernel::bf16);
    const auto [fused_work, fused_logits] = loss_step(LossKernel::fused);
    const std::uint64_t mask =
        256 * 256 * 2 * 2;  // the causal mask, still alive in the loss's forward
    CHECK(fp32_work == std::max({sbV * 4 + mask, sbV * 8, final_norm(4)}));
    CHECK(bf16_work == std::max({mask, sbV * 4, final_norm(2)}));
    CHECK(fused_work == std::max(mask, final_norm(0)));
    CHECK(fp32_logits - bf16_logits == sbV * 2);  // the head's saved log-probabilities
    CHECK(bf16_logits - fused_logits == sbV * 2);
}

TEST_CASE("an fp32 loss over fp32 logits makes no copy of them", "[loss]") {
    const Architecture m = fixtures::gpt2_small();
    const std::uint64_t sbV = 256 * 2 * m.vocab;
    const Report r = estimate(m, settings(ActivationModel::architecture, LossKernel::fp32,
                                          LogitsLife::held, 1, "fp32-adam"));
    const std::uint64_t mask = 256 * 256 * 2 * 4;
    CHECK(step_named(r, "loss").bytes.workspace.value() == std::max(mask, sbV * 8));
    // ... and a bf16 loss under an fp32 recipe is the fp32 one: the compute dtype is fp32.
    const Report bf16 = estimate(m, settings(ActivationModel::architecture, LossKernel::bf16,
                                             LogitsLife::held, 1, "fp32-adam"));
    CHECK(bf16.peak_step().bytes.total() == r.peak_step().bytes.total());
}

TEST_CASE(
    "the formula model's loss: a copy in the loss's dtype and the logits' gradient, none when "
    "fused",
    "[loss]") {
    const Architecture m = fixtures::llama_7b();
    const std::uint64_t sbV = 256 * 2 * m.vocab;
    const auto loss = [&](LossKernel k) {
        return step_named(estimate(m, settings(ActivationModel::korthikanti, k, LogitsLife::held)),
                          "loss")
            .bytes.logits.value();
    };
    CHECK(loss(LossKernel::fp32) ==
          sbV * (2 + 4 + 2));  // the logits, the fp32 softmax, the logits' gradient
    CHECK(loss(LossKernel::bf16) == sbV * (2 + 2 + 2));
    CHECK(loss(LossKernel::fused) == sbV * 2);  // the gradient is written over the logits
}

TEST_CASE(
    "the loss and logits options: every bad value gets one line naming it, and nothing on stdout",
    "[loss][cli]") {
    using Case = std::pair<std::string, std::string>;  // arguments, what the message says
    auto [args, message] = GENERATE(table<std::string, std::string>({
        Case{"--loss bf61",
             "--loss must be fp32, bf16, fused, fp32-inplace, chunked, fused-linear, "
             "chunked-bf16 or chunked-compiled (got 'bf61') "
             "(did you mean 'bf16'?)"},
        Case{"--loss-chunks 4",
             "--loss-chunks 4: only --loss chunked or chunked-compiled splits the loss so"},
        Case{"--loss chunked --loss-chunks 0",
             "--loss-chunks must be a positive integer (got '0')"},
        Case{"--loss fused-linear --activations korthikanti",
             "--loss fused-linear needs --activations architecture: Korthikanti's formula has "
             "the whole logits and their fp32 copy at once"},
        Case{"--logits kept", "--logits must be held or freed (got 'kept')"},
        Case{"--loss ''", "--loss needs a value (got '')"},
    }));
    CAPTURE(args);
    const auto run = testing::memcalc("--preset llama-7b --seq 4096 " + args);
    CHECK(run.status == 2);
    CHECK(run.out.empty());
    CHECK(run.err == "memcalc: " + message + "\n");
    // Given well, the table's header names each setting that is not the chapter's.
    const auto good = testing::memcalc(
        "--preset llama-7b --seq 4096 --loss bf16 --logits freed --recipe bf16-adam");
    CHECK(good.status == 0);
    CHECK_THAT(good.out, Catch::StartsWith("memcalc ") &&
                             Catch::Contains("recipe bf16-adam, loss bf16, logits freed\n"));
}

TEST_CASE("Megatron's in-place fp32 loss keeps one fp32 copy and writes its gradient over it",
          "[loss]") {
    const Architecture m = GENERATE(fixtures::llama_7b(), fixtures::gpt2_small());
    const LogitsLife logits = GENERATE(LogitsLife::held, LogitsLife::freed);
    CAPTURE(m.name, logits_life_name(logits));
    // Long enough that the loss's backward outgrows the head's gradient after it (the final norm's
    // moment, which both share).
    const std::uint64_t seq = m.max_positions, sbV = seq * 4 * m.vocab;
    const auto run = [&](LossKernel loss) {
        Settings s = settings(ActivationModel::architecture, loss, logits);
        s.seq = seq, s.micro_batch = 4;
        s.framework.attention =
            Attention::flash;  // no causal mask beside the loss: the sums stay clean
        return estimate(m, s);
    };
    const Report fp32 = run(LossKernel::fp32), in_place = run(LossKernel::fp32_inplace);
    // The same fp32 tensor of the vocabulary's width is kept (log-probabilities, or the softmax
    // itself).
    CHECK(saved_bytes(fp32.head) == saved_bytes(in_place.head));
    // The loss step: fp32's backward holds two fp32 gradients (8 sbV); in place only the logits'
    // bf16 gradient (2 sbV), and its forward made no copy beside the one it keeps.
    CHECK(at(fp32, "loss") - at(in_place, "loss") == 6 * sbV);
    CHECK(at(fp32, "forward 1") == at(in_place, "forward 1"));
}

namespace {
/// A long sequence under a fused attention kernel: no causal mask beside the loss, and the loss's
/// backward outgrows the final norm's moment.
Report long_run(const Architecture& m, LossKernel loss, LogitsLife logits,
                std::uint64_t chunks = 8) {
    Settings s = settings(ActivationModel::architecture, loss, logits);
    s.seq = m.max_positions, s.micro_batch = 8, s.framework.loss_chunks = chunks;
    s.framework.attention = Attention::flash;
    return estimate(m, s);
}
}  // namespace

TEST_CASE(
    "torchtune's chunked loss: a chunk's fp32 copy and gradients at a time, every chunk's "
    "log-probabilities kept",
    "[loss]") {
    const Architecture m = GENERATE(fixtures::llama_7b(), fixtures::gpt2_small());
    const std::uint64_t chunks = GENERATE(1, 2, 8, 7);
    CAPTURE(m.name, chunks);
    const std::uint64_t sbV = m.max_positions * 8 * m.vocab;
    const Report fp32 = long_run(m, LossKernel::fp32, LogitsLife::held);
    const Report chunked = long_run(m, LossKernel::chunked, LogitsLife::held, chunks);
    // Eager log-softmax saves each chunk's fp32 output, so the head keeps what fp32's keeps.
    CHECK(saved_bytes(fp32.head) == saved_bytes(chunked.head));
    // The loss's backward: two fp32 gradients of one chunk, not of all the logits.
    const std::uint64_t chunk = (sbV + chunks - 1) / chunks;
    CHECK(at(fp32, "loss") - at(chunked, "loss") == 8 * sbV - 8 * chunk);
    for (const char* step : {"forward 1", "backward 1", "optimizer"})
        CHECK(at(fp32, step) == at(chunked, step));
}

TEST_CASE(
    "Liger's fused linear cross-entropy: no logits, a chunk of them at a time, the two "
    "gradients made in forward",
    "[loss]") {
    const Architecture m = GENERATE(fixtures::llama_7b(), fixtures::gpt2_small());
    CAPTURE(m.name);
    const Report held = long_run(m, LossKernel::fused_linear, LogitsLife::held);
    const Report freed = long_run(m, LossKernel::fused_linear, LogitsLife::freed);
    for (const Step& s : held.timeline())
        CHECK(s.bytes.logits == step_named(freed, s.name()).bytes.logits);
    // What the head keeps: the final norm's rows and the hidden states' gradient, nothing of the
    // vocabulary's width.
    const Report fp32 = long_run(m, LossKernel::fp32, LogitsLife::held);
    const std::uint64_t long_tokens = m.max_positions * 8, V = m.vocab, h = m.hidden;
    CHECK(saved_bytes(fp32.head).value() - saved_bytes(held.head).value() ==
          long_tokens * V * 4 + 8 * long_tokens);
    CHECK(step_named(held, "loss").bytes.logits == saved_bytes(held.head));
    CHECK(at(fp32, "forward 1") == at(held, "forward 1"));

    // 400 tokens. Liger's chunk: the next power of two of tokens / ceil(V / h): LLaMA's 50 and
    // GPT-2's 7 round up to 64 and 8.
    Settings s =
        settings(ActivationModel::architecture, LossKernel::fused_linear, LogitsLife::held);
    s.seq = 200, s.framework.attention = Attention::flash;
    const std::uint64_t tokens = 400, chunk = m.vocab == 32000 ? 64 : 8, sbh = tokens * h;
    // Forward: the head weight's gradient (bf16), one chunk's logits, a loss and a mask per token.
    const std::uint64_t forward = 2 * V * h + chunk * V * 2 + tokens * 5;
    // Then the final norm's backward, the hidden states' gradient handed on (RMSNorm: x^2's five
    // fp32 tensors, x_norm and 1/rms gone too; LayerNorm: two), beside the head's gradient.
    const bool rms = m.norm == Norm::rmsnorm;
    const std::uint64_t work = rms ? 20 * sbh : 4 * sbh,
                        gone = 2 * sbh + (rms ? 2 * sbh + 4 * tokens : 0);
    const std::uint64_t final_norm =
        (work > gone ? work - gone : 0) + 2 * (V * h + h) + (rms ? 0 : 2 * h);
    const Report short_run = estimate(m, s);
    const Step& loss = step_named(short_run, "loss");
    CHECK((loss.bytes.workspace + loss.bytes.gradients).value() == std::max(forward, final_norm));
    CHECK((forward > final_norm) == !rms);  // both moments are seen
}

TEST_CASE(
    "torchtune's compiled chunked loss: the logits live into the head's backward, no fp32 kept",
    "[loss][compile]") {
    // Every chunk's loss backward runs before the head's: the logits, each turning into its
    // gradient, live on; a chunk's loss beside its gradient alone (no fp32 work: measured); the
    // head's beside its weight's gradient, twice from the second chunk on (autograd adds the next
    // in). A frozen head (LoRA's) makes none: the loss's moment is then the peak.
    struct Case {
        std::string preset, train;
        std::uint64_t vocab, hidden, head_params;  // the head's trained group: matrix, final norm
    };
    const Case c = GENERATE(Case{"gpt2", "", 50257, 768, 50257 * 768 + 2 * 768},
                            Case{"llama-7b", "", 32000, 4096, 32000 * 4096 + 4096},
                            Case{"gpt2", " --train lora --lora-dtype bf16", 50257, 768, 0});
    const std::uint64_t chunks = GENERATE(2, 4), s = 256, b = 2;
    CAPTURE(c.preset, c.train, chunks);
    const testing::Run run = testing::memcalc(
        "--preset " + c.preset + " --seq 256 -b 2 --loss chunked-compiled --loss-chunks " +
        std::to_string(chunks) +
        " --logits freed --activations architecture --recipe bf16-adam --attention flash "
        "--format json" +
        c.train);
    REQUIRE(run.status == 0);
    const nlohmann::json j = nlohmann::json::parse(run.out);
    const std::uint64_t sbV = s * b * c.vocab, part = (sbV + chunks - 1) / chunks,
                        gradient = 2 * c.head_params;
    const std::uint64_t expected =
        std::max({2 * (sbV + part), 2 * sbV + gradient, 2 * (sbV - part) + 2 * gradient});
    for (const auto& step : j["timeline"])
        if (step["step"] == "loss") CHECK(step["by_category"]["workspace"] == expected);
    CHECK(j["settings"]["loss"] == "chunked-compiled");
    CHECK(j["settings"]["loss_chunks"] == chunks);
    // Nothing of the vocabulary's width kept for backward: the eager loss keeps fp32
    // log-probabilities, 4 B a logit.
    const testing::Run eager = testing::memcalc(
        "--preset " + c.preset + " --seq 256 -b 2 --loss chunked --loss-chunks " +
        std::to_string(chunks) +
        " --logits freed --activations architecture --recipe bf16-adam --attention flash "
        "--format json" +
        c.train);
    const nlohmann::json e = nlohmann::json::parse(eager.out);
    for (const auto& step : e["timeline"])
        if (step["step"] == "loss")
            for (const auto& mine : j["timeline"])
                if (mine["step"] == "loss")
                    CHECK(step["by_category"]["logits"].get<std::uint64_t>() -
                              mine["by_category"]["logits"].get<std::uint64_t>() ==
                          4 * sbV - 8 * s * b);
}
