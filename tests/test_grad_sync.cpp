// When sharded gradients are reduced (--grad-sync) and what one covers (--grad-units): FSDP's
// no_sync holds every layer's gradient unsharded in the micro-batches before the last; FSDP1's
// flat parameter gives a layer with any trained tensor one gradient over all of its weights. Each
// by hand from the parameter table, on LoRA (frozen weights beside trained ones) and full training.
#include <catch2/catch.hpp>

#include "fixtures.hpp"
#include "run_program.hpp"
#include "step_named.hpp"
#include "memcalc/estimate.hpp"
#include "memcalc/finetune.hpp"

using namespace memcalc;

namespace {
Settings sharded(Training mode, GradSync sync, GradUnits units, std::uint64_t microbatches) {
    Settings s;
    s.seq = 256, s.micro_batch = 1, s.activations = ActivationModel::architecture;
    s.recipe = builtin_recipe("bf16-adam");
    s.framework.attention = Attention::flash;
    s.framework.grad_sync = sync, s.framework.grad_units = units;
    s.parallel.dp = 2, s.parallel.zero = 3, s.parallel.microbatches = microbatches;
    s.tuning.mode = mode;
    s.tuning.lora.targets = {"q_proj", "v_proj"};
    return s;
}

/// Parameters of one layer: the trained ones, or all of them.
Count layer_parameters(const Architecture& m, const FineTuning& f, bool trained_only) {
    const ParameterTable t = fine_tuned_table(m, parameter_table(m), f);
    Count n;
    for (const ParamRow& r : t.rows)
        if (r.group == Group::layer && (r.trainable || !trained_only)) n += r.count;
    return n;
}
}  // namespace

TEST_CASE("Held gradients: sharded or not, of the trained tensors or of whole layers",
          "[parallel][finetune]") {
    const Architecture m = GENERATE(fixtures::llama_7b(), fixtures::gpt2_small());
    const Training mode = GENERATE(Training::lora, Training::full);
    CAPTURE(m.name, training_name(mode));
    const auto held = [&](GradSync sync, GradUnits units) {
        const Report r = Estimator(m).estimate(sharded(mode, sync, units, 4));
        return fixtures::step_named(r, "forward 1 of micro-batch 2").bytes.gradients;
    };
    FineTuning f;
    f.mode = mode, f.lora.targets = {"q_proj", "v_proj"};
    const Count trained = layer_parameters(m, f, true), all = layer_parameters(m, f, false);
    const auto layers = [&](Count per_layer) { return Count(m.layers) * per_layer * 2; };  // bf16
    const Count sharded_trained = held(GradSync::every_microbatch, GradUnits::tensor);
    const Count unsharded_trained = held(GradSync::last_microbatch, GradUnits::tensor);
    const Count unsharded_all = held(GradSync::last_microbatch, GradUnits::flat);
    // Unsharded, the layers' trained tensors' whole gradients (beside the head's and the input's),
    // or every weight of a layer once any trains.
    CHECK(unsharded_trained >= layers(trained));
    CHECK(unsharded_trained.value() - layers(trained).value() ==
          unsharded_all.value() - layers(all).value());
    CHECK(sharded_trained.value() * 2 <= unsharded_trained.value() + 2 * 2 * m.layers);
    // Full training: every layer's tensors train, so flat units change nothing.
    if (mode == Training::full) CHECK(unsharded_all == unsharded_trained);
    if (mode == Training::lora) CHECK(unsharded_all.value() > 10 * unsharded_trained.value());
    // One micro-batch is the last: it reduces after its backward whatever the switch says.
    const auto single = [&](GradSync sync) {
        return Estimator(m).estimate(sharded(mode, sync, GradUnits::tensor, 1)).peak_step().bytes;
    };
    CHECK(single(GradSync::last_microbatch).total() == single(GradSync::every_microbatch).total());
}

TEST_CASE("memcalc --grad-sync and --grad-units: spellings and errors", "[parallel][cli]") {
    const std::string base = "--preset llama-7b --seq 512 --dp 2 --zero 3 --microbatches 4 ";
    const auto peak = [&](const std::string& args) {
        const auto run = testing::memcalc(base + args + " --format json");
        REQUIRE(run.status == 0);
        return run.out;
    };
    CHECK(peak("--grad-sync last-microbatch --grad-units flat").find("\"grad_sync\"") !=
          std::string::npos);
    for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
             {"--grad-sync last", "--grad-sync"}, {"--grad-units flats", "--grad-units"}}) {
        CAPTURE(args);
        const auto bad = testing::memcalc(base + args);
        CHECK(bad.status == 2);
        CHECK(bad.out.empty());
        CHECK(bad.err.find(message) != std::string::npos);
    }
    // no_sync beside an offloaded step: where it keeps the unsharded gradients is not modelled,
    // so it is refused rather than counted sharded (leaning low).
    const auto offloaded =
        testing::memcalc(base + "--grad-sync last-microbatch --offload optimizer");
    CHECK(offloaded.status == 1);
    CHECK(offloaded.out.empty());
    CHECK(offloaded.err.find("grad_sync last-microbatch with offload optimizer") !=
          std::string::npos);
    CHECK(testing::memcalc(base + "--offload optimizer").status == 0);
}
