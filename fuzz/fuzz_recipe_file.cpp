// libFuzzer target: a recipe file (--recipe-file); one that reads is estimated, fitted and planned
// with through the program, in process.
#include "in_process.hpp"
#include "recipe_file.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    enter_scratch_folder();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    run_with_file(data, size, memcalc::cli::parse_recipe_json, "recipe.json",
                  {"--preset gpt2 --seq 64 -b 1,2 --activations architecture "
                   "--recipe-file recipe.json --format json",
                   "--preset mixtral-8x7b --seq 128 --dp 8 --zero 3 --recipe-file recipe.json",
                   "fit --preset gpt2 --device-memory 24GB --seq 256 --activations architecture "
                   "--recompute selective --recipe-file recipe.json",
                   "plan --preset gpt2 --gpus 8 --device-memory 24GB --seq 64 --global-batch 16 "
                   "--recipe-file recipe.json"});
    return 0;
}
