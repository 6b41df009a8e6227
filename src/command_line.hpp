#pragma once
// The whole memcalc program, callable: what main() runs, and what the Python module and the web
// page run.
#include <iosfwd>

namespace memcalc::cli {

/// Parses `argv`, runs the command, prints its result on stdout (or into --output) and any error as
/// one line on stderr. Returns the exit status: 0, 1 for bad input, 2 for a bad command line.
int run_command_line(int argc, const char* const* argv);

/// The same, printing into `out` and `err` instead of stdout and stderr (--output still writes its
/// file).
int run_command_line(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace memcalc::cli
