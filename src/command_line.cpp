// memcalc's command line: the program built from the command table (command_table.hpp), parsing,
// the dispatch to the command named, and the output. Every error is caught here once and printed
// as one line on stderr. src/main.cpp only calls it, so a fuzz target can run the whole program in
// process (fuzz/fuzz_command_line.cpp).
#include "command_line.hpp"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "arguments.hpp"
#include "command_table.hpp"
#include "commands.hpp"
#include "memcalc/memcalc.hpp"
#include "output_file.hpp"
#include "printable.hpp"

namespace {

using namespace memcalc;
using namespace memcalc::cli;

constexpr int exit_input_error = 1;
constexpr int exit_usage_error = 2;

/// A command as built on the program: its CLI::App (the program's own for the default command)
/// and its options.
struct BuiltCommand {
    CLI::App* app;
    std::unique_ptr<ParsedCommand> command;
};

/// A description's line breaks are where its source wrapped it, so each is a space, but a blank
/// line's and the one before its model-file key, which stays a line of its own.
inline std::string reflowed(const std::string& text) {
    std::string out = text;
    for (std::size_t i = 0; i < out.size(); ++i) {
        if (out[i] != '\n') continue;
        const bool paragraph = (i > 0 && text[i - 1] == '\n') || text[i + 1] == '\n';
        if (!paragraph && text.compare(i + 1, 15, "(model-file key") != 0) out[i] = ' ';
    }
    return out;
}

/// --help with each option's description wrapped at a word to fit 120 columns beside the option's
/// 30 (reflowed). Footers are not wrapped: their example commands stay whole, to be copied.
class WrappedHelp : public CLI::Formatter {
public:
    std::string make_option_desc(const CLI::Option* option) const override {
        constexpr std::size_t width = 90;
        const std::string text = reflowed(option->get_description());
        std::string wrapped;
        for (std::size_t start = 0;;) {
            const std::size_t end = std::min(text.find('\n', start), text.size());
            std::string_view line(text.data() + start, end - start);
            while (line.size() > width) {
                const std::size_t cut = line.rfind(' ', width);
                if (cut == std::string_view::npos || cut == 0) break;  // one long word: as it is
                wrapped.append(line.substr(0, cut)).push_back('\n');
                line.remove_prefix(cut + 1);
            }
            wrapped.append(line);
            if (end == text.size()) return wrapped;
            wrapped.push_back('\n');
            start = end + 1;
        }
    }
};

/// Registers every row's command on `app`: the default command's options on the program itself,
/// each other command as a subcommand, made only when the command line names it (or when every
/// option is built: --help, or an option the default command does not know).
std::vector<BuiltCommand> add_commands(CLI::App& app, CommandLine& line) {
    std::vector<BuiltCommand> built;
    for (const CommandRow& row : command_table()) {
        if (row.name == nullptr) {
            built.push_back({&app, row.add(app, line)});
            continue;
        }
        if (!line.every && !line.mentions(row.name)) continue;
        CLI::App* sub = app.add_subcommand(row.name, row.summary);
        built.push_back({sub, row.add(*sub, line)});
        if (row.footer != nullptr) sub->footer(row.footer);
    }
    return built;
}

/// Builds the program on `app` (made with the program's summary): its version flag and footer, and
/// the commands and options `line` needs.
std::vector<BuiltCommand> build_program(CLI::App& app, CommandLine& line) {
    app.formatter(std::make_shared<WrappedHelp>());  // before the subcommands, which take it
    app.set_version_flag("--version", std::string("memcalc ") + memcalc::version);
    app.footer(command_table().front().footer);
    app.require_subcommand(0, 1);
    return add_commands(app, line);
}

/// Parses the command line; an exit status when that ends the run (help, the version, an error).
std::optional<int> parse_arguments(CLI::App& app, int argc, const char* const* argv,
                                   std::ostream& out, std::ostream& err) {
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e, out, err);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e, out, err);
    } catch (const CLI::CallForVersion& e) {
        return app.exit(e, out, err);
    } catch (const CLI::ParseError& e) {
        err << "memcalc: " << printable(e.what()) << " (see memcalc --help)\n";
        return exit_usage_error;
    }
    return std::nullopt;
}

/// Refuses what CLI11 lets through: an empty value ("--seq ''") is a mistake, not the option's
/// absence; and options of the default command given before another command would be silently
/// ignored. Returns the command the command line names.
const ParsedCommand& chosen_command(const CLI::App& app, const std::vector<BuiltCommand>& built) {
    for (const BuiltCommand& each : built)
        for (const CLI::Option* option : each.app->get_options())
            if (option->count() > 0 && option->get_type_size() != 0)
                for (const std::string& value : option->results())
                    if (value.empty())
                        throw usage_error(
                            fmt::format("{} needs a value (got '')", option->get_name()));
    const BuiltCommand* chosen = &built.front();  // the default command
    for (const BuiltCommand& each : built) {
        if (each.app == &app || !each.app->parsed()) continue;
        for (const CLI::Option* option : app.get_options())
            if (option->count() > 0)
                throw usage_error(fmt::format(
                    "{} comes before '{}', which does not see it: put it after the subcommand",
                    option->get_name(), each.app->get_name()));
        if (chosen == &built.front()) chosen = &each;
    }
    return *chosen->command;
}

/// Runs the command and writes its result: the whole output is built before any of it is
/// printed, so a failure prints nothing on stdout and writes no file.
int run_and_write(const ParsedCommand& command, std::ostream& out_stream, std::ostream& err) {
    std::vector<PendingFile> files;
    Spool out;
    const std::string output = command.output_file();
    PendingFile report = output.empty() ? PendingFile{"", "-", "", &out}  // on stdout
                                        : PendingFile{"--output", output, "", &out};
    out.spool_beside(regular_output_folder(report));  // renamed into place, not copied
    command.run(out, files);
    files.push_back(std::move(report));
    const PendingFile* printed = write_files(files);  // the one for stdout, if any
    std::vector<std::string> said;
    for (const std::string& note : pending_notes())
        if (std::find(said.begin(), said.end(), note) == said.end())
            err << "memcalc: " << note << "\n", said.push_back(note);
    if (printed == nullptr) return 0;
    if (&out_stream ==
        &std::cout) {  // the process's own: its file descriptor, copied in the kernel
        out_stream.flush();
        if (out_stream && write_whole(STDOUT_FILENO, *printed)) return 0;
        err << "memcalc: cannot write to standard output: " << std::strerror(errno) << "\n";
        return exit_input_error;
    }
    const bool read = printed->each_chunk([&out_stream](std::string_view chunk) {
        out_stream.write(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    });
    out_stream.flush();
    if (!read) throw error("cannot read back the spooled output");
    if (!out_stream) {
        err << "memcalc: cannot write to standard output: " << std::strerror(errno) << "\n";
        return exit_input_error;
    }
    return 0;
}

}  // namespace

int memcalc::cli::run_command_line(int argc, const char* const* argv) {
    return run_command_line(argc, argv, std::cout, std::cerr);
}

int memcalc::cli::run_command_line(int argc, const char* const* argv, std::ostream& out_stream,
                                   std::ostream& err_stream) {
    forget_inputs();  // the files an earlier run in this process read are no concern of this one
    CLI::App app{command_table().front().summary, "memcalc"};
    CommandLine line{argc, argv, option_tokens(argc, argv), false};
    const std::vector<BuiltCommand> built = build_program(app, line);
    if (const std::optional<int> status = parse_arguments(app, argc, argv, out_stream, err_stream))
        return *status;
    try {
        return run_and_write(chosen_command(app, built), out_stream, err_stream);
    } catch (const usage_error& e) {  // messages quote the user's values: printed escaped
        err_stream << "memcalc: " << printable(e.what()) << "\n";
        return exit_usage_error;
    } catch (const memcalc::error& e) {
        err_stream << "memcalc: " << printable(e.what()) << "\n";
        return exit_input_error;
    } catch (const std::exception& e) {
        err_stream << "memcalc: internal error: " << printable(e.what()) << "\n";
        return exit_input_error;
    }
}

void memcalc::cli::visit_program(const std::function<void(const CLI::App&)>& visit) {
    const char* const argv[] = {"memcalc", "--help"};  // as --help builds it: every option
    CLI::App app{command_table().front().summary, "memcalc"};
    CommandLine line{2, argv, option_tokens(2, argv), false};
    const std::vector<BuiltCommand> built = build_program(app, line);  // the options' storage
    visit(app);
}
