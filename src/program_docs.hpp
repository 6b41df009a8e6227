#pragma once
// The program's command line as documents see it: each command with its options, and the values
// each option's choices are (program_docs.cpp). The man page and the bash and zsh completions are
// written from it (memcalc_docs, src/program_docs_main.cpp), so they list what the program takes.
#include <ostream>
#include <string>
#include <vector>

namespace memcalc::cli {

using Words = std::vector<std::string>;

/// One option of a command.
struct OptionDoc {
    Words names;        ///< "-b", "--micro-batch"
    std::string value;  ///< its value's name in --help ("S[,S...]"); empty for a flag
    std::string help;   ///< its --help text, on one line
    std::string group;  ///< its heading in --help
    Words choices;      ///< the values it takes, where they are a known set; else empty
    bool file = false;  ///< its value is a path
    bool list = false;  ///< its value may be a comma list
};

/// One command: the default one (the estimate, name "") or a subcommand.
struct CommandDoc {
    std::string name;
    std::string summary;  ///< its line in the program's --help (the estimate's: the description)
    std::string footer;   ///< what its --help says after the options
    std::vector<OptionDoc> options;
};

/// Every command, the default one first, as the program builds them for --help.
std::vector<CommandDoc> program_commands();

/// The man page memcalc(1), in groff's man macros.
void write_man_page(std::ostream& out, const std::vector<CommandDoc>& commands);
/// The bash completion (share/bash-completion/completions/memcalc).
void write_bash_completion(std::ostream& out, const std::vector<CommandDoc>& commands);
/// The zsh completion (share/zsh/site-functions/_memcalc).
void write_zsh_completion(std::ostream& out, const std::vector<CommandDoc>& commands);

}  // namespace memcalc::cli
