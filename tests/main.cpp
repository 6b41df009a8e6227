#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "memcalc/workload.hpp"

// Every workload the suite builds checks its layers' tapes against 1.2's table rules
// (memcalc::detail::check_against_table): the whole test grid proves the sweep equal.
int main(int argc, char* argv[]) {
    memcalc::detail::check_tapes() = true;
    return Catch::Session().run(argc, argv);
}
