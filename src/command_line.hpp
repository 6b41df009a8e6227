#pragma once
// The whole memcalc program, callable: what main() runs.

namespace memcalc::cli {

/// Parses `argv`, runs the command, prints its result on stdout (or into --output) and any error as
/// one line on stderr. Returns the exit status: 0, 1 for bad input, 2 for a bad command line.
int run_command_line(int argc, const char* const* argv);

}  // namespace memcalc::cli
