// Prints LLaMA 7B's selective-recomputation peak at s = 4096 through the installed headers alone.
#include <memcalc/memcalc.hpp>

#include <iostream>

int main() {
    memcalc::Architecture m;
    m.name = "llama-7b";
    m.hidden = 4096, m.layers = 32, m.heads = 32, m.ffn = 11008, m.vocab = 32000;
    memcalc::Settings settings;
    settings.seq = 4096, settings.recompute = memcalc::Recompute::selective;
    const memcalc::Report r = memcalc::estimate(m, settings);
    std::cout << r.peak_step().name() << " " << r.peak_step().bytes.total().value() << "\n";
}
