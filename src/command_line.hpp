#pragma once
// The whole memcalc program, callable: what main() runs, and what the Python module and the web
// page run.
#include <functional>
#include <iosfwd>

namespace CLI {
class App;
}

namespace memcalc::cli {

/// Parses `argv`, runs the command, prints its result on stdout (or into --output) and any error as
/// one line on stderr. Returns the exit status: 0, 1 for bad input, 2 for a bad command line.
int run_command_line(int argc, const char* const* argv);

/// The same, printing into `out` and `err` instead of stdout and stderr (--output still writes its
/// file).
int run_command_line(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

/// Calls `visit` with the whole program's command line as --help builds it: every command and
/// option, with its help. The man page and the shell completions are made from it
/// (src/program_docs.cpp), so they list what the program takes.
void visit_program(const std::function<void(const CLI::App&)>& visit);

}  // namespace memcalc::cli
