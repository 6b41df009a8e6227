#pragma once
// memcalc's commands as rows of one table (command_table.cpp): each row names a command, gives its
// help, registers its options and runs it. command_line.cpp builds the program from the rows,
// parses, and runs the one the command line names. Adding a command is adding a row.
#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

#include "output_file.hpp"

namespace memcalc::cli {

/// The command line as the rows see it while they register their options.
struct CommandLine {
    int argc = 0;
    const char* const* argv = nullptr;
    std::vector<std::string> tokens;  ///< each option name it gives ("--seq"), up to an "="
    /// Build every command and option: --help, or an option the default command does not know
    /// (set by the default command's row, which registers first).
    bool every = false;

    /// Whether an argument is `word` (a command's name).
    bool mentions(const char* word) const;
};

/// The option names a command line gives: each "-x" or "--name" token, up to an "=".
std::vector<std::string> option_tokens(int argc, const char* const* argv);

/// A command's options, registered on its CLI::App and filled in as it parses; and what runs it.
class ParsedCommand {
public:
    virtual ~ParsedCommand() = default;
    /// Runs the command: its result into `out` (stdout, or --output), any other file it writes
    /// (--plot) into `files`, written only once the whole run has succeeded.
    virtual void run(Spool& out, std::vector<PendingFile>& files) const = 0;
    /// --output: the file the result goes to instead of stdout (empty: stdout).
    virtual std::string output_file() const = 0;
};

/// One command.
struct CommandRow {
    /// Its name; nullptr for the default command (the estimate), whose options are the program's
    /// own and which runs when the command line names no other.
    const char* name;
    /// Its line in the program's --help (the default command's: the program's description).
    const char* summary;
    /// What its --help says after the options: what it does, and examples (nullptr: nothing).
    const char* footer;
    /// Registers its options on `app` (the program itself for the default command) and returns
    /// where they land, and what runs them.
    std::unique_ptr<ParsedCommand> (*add)(CLI::App& app, CommandLine& line);
};

/// The commands, in --help's order; the first is the default command.
const std::vector<CommandRow>& command_table();

}  // namespace memcalc::cli
