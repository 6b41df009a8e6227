// memcalc(1): the man page, written from the program's own commands and options
// (program_docs.hpp), so it documents every one the program takes and no other.
#include <algorithm>
#include <cctype>
#include <ostream>
#include <string>
#include <string_view>

#include "memcalc/version.hpp"
#include "program_docs.hpp"

namespace memcalc::cli {
namespace {

/// Text for groff: backslashes and dashes escaped (a dash is a minus, as options need), a line's
/// leading dot or quote made text.
std::string roff(std::string_view text) {
    std::string out;
    for (char c : text) {
        if (c == '\\')
            out += "\\e";
        else if (c == '-')
            out += "\\-";
        else
            out += c;
    }
    if (!out.empty() && (out[0] == '.' || out[0] == '\'')) out.insert(0, "\\&");
    return out;
}

std::string trimmed(std::string_view text) {
    const std::size_t first = text.find_first_not_of(' ');
    if (first == std::string_view::npos) return "";
    return std::string(text.substr(first, text.find_last_not_of(' ') + 1 - first));
}

/// A command's --help footer in its parts: what it explains, its examples, its exit status.
struct Footer {
    std::string prose;
    Words examples;
    std::string exit_status;
};

Footer split_footer(const std::string& footer) {
    Footer parts;
    enum { prose, examples, exit_status } part = prose;
    for (std::size_t from = 0; from < footer.size();) {
        const std::size_t end = std::min(footer.find('\n', from), footer.size());
        const std::string line = footer.substr(from, end - from);
        from = end + 1;
        if (line == "Examples:") {
            part = examples;
        } else if (line.rfind("Exit status:", 0) == 0) {
            part = exit_status;
            parts.exit_status = trimmed(line.substr(12));
        } else if (part == examples && line.rfind("  ", 0) == 0) {
            parts.examples.push_back(trimmed(line));
        } else if (part == exit_status) {
            parts.exit_status += " " + trimmed(line);
        } else if (part == prose) {
            parts.prose += line + "\n";
        }
    }
    return parts;
}

/// Whether an indented line of --help's prose starts an item of a list ("  1. the estimated ...").
bool starts_item(const std::string& line) {
    const std::string text = trimmed(line);
    return line[0] != ' ' ||
           (text.size() > 1 && std::isdigit(static_cast<unsigned char>(text[0])) && text[1] == '.');
}

/// --help's prose, filled by groff: a blank line starts a paragraph, a list's item a line of its
/// own; the terminal's line breaks go ("micro-\nbatches" is one word).
void write_prose(std::ostream& out, const std::string& text) {
    std::string line_so_far;
    const auto flush = [&] {
        if (!line_so_far.empty()) out << roff(line_so_far) << "\n";
        line_so_far.clear();
    };
    for (std::size_t from = 0; from < text.size();) {
        const std::size_t end = std::min(text.find('\n', from), text.size());
        const std::string line = text.substr(from, end - from);
        from = end + 1;
        if (trimmed(line).empty()) {
            flush();
            out << ".PP\n";
        } else if (line[0] == ' ' && starts_item(line)) {
            flush();
            out << ".br\n";
            line_so_far = trimmed(line);
        } else {
            const bool split_word = !line_so_far.empty() && line_so_far.back() == '-' &&
                                    std::islower(static_cast<unsigned char>(trimmed(line)[0]));
            line_so_far += (line_so_far.empty() || split_word ? "" : " ") + trimmed(line);
        }
    }
    flush();
}

std::string option_names(const OptionDoc& option) {
    std::string out;
    for (const std::string& name : option.names)
        out += (out.empty() ? "\\fB" : ", \\fB") + roff(name) + "\\fR";
    if (!option.value.empty()) out += " \\fI" + roff(option.value) + "\\fR";
    return out;
}

/// The options, under their --help headings; those `shared` already lists only by name.
void write_options(std::ostream& out, const CommandDoc& command, const CommandDoc* shared) {
    Words groups, same;
    for (const OptionDoc& option : command.options) {
        const auto match = [&](const OptionDoc& o) {
            return o.names == option.names && o.help == option.help;
        };
        if (shared != nullptr && std::any_of(shared->options.begin(), shared->options.end(), match))
            same.push_back(option.names.back());
        else if (std::find(groups.begin(), groups.end(), option.group) == groups.end())
            groups.push_back(option.group);
    }
    for (const std::string& group : groups) {
        if (groups.size() > 1 || shared == nullptr) out << ".SS \"" << roff(group) << "\"\n";
        for (const OptionDoc& option : command.options)
            if (option.group == group &&
                std::find(same.begin(), same.end(), option.names.back()) == same.end())
                out << ".TP\n" << option_names(option) << "\n" << roff(option.help) << "\n";
    }
    if (same.empty()) return;
    out << ".PP\nAnd as the estimate takes them (see OPTIONS):";
    for (std::size_t i = 0; i < same.size(); ++i)
        out << (i == 0 ? "\n" : ",\n") << "\\fB" << roff(same[i]) << "\\fR";
    out << ".\n";
}

void write_commands(std::ostream& out, const std::vector<CommandDoc>& commands) {
    out << ".SH COMMANDS\n";
    for (std::size_t i = 1; i < commands.size(); ++i) {
        const CommandDoc& command = commands[i];
        out << ".SS \"memcalc " << roff(command.name) << " [OPTION...]\"\n"
            << roff(command.summary) << ".\n";
        const Footer footer = split_footer(command.footer);
        if (!trimmed(footer.prose).empty()) out << ".PP\n", write_prose(out, footer.prose);
        out << ".PP\n";
        write_options(out, command, &commands.front());
    }
}

void write_examples(std::ostream& out, const std::vector<CommandDoc>& commands) {
    out << ".SH EXAMPLES\n";
    for (const CommandDoc& command : commands)
        for (const std::string& example : split_footer(command.footer).examples)
            out << ".PP\n.nf\n" << roff(example) << "\n.fi\n";
}

}  // namespace

void write_man_page(std::ostream& out, const std::vector<CommandDoc>& commands) {
    const CommandDoc& estimate = commands.front();
    out << ".\\\" memcalc(1): generated from the program's options by memcalc_docs; do not edit.\n"
        << ".TH MEMCALC 1 \"\" \"memcalc " << version << "\" \"User Commands\"\n"
        << ".SH NAME\nmemcalc \\- how much device memory one training step of a transformer "
           "language model takes\n"
        << ".SH SYNOPSIS\n.B memcalc\n[\\fIOPTION\\fR...]\n.br\n.B memcalc\n\\fICOMMAND\\fR "
           "[\\fIOPTION\\fR...]\n"
        << ".SH DESCRIPTION\n";
    write_prose(out, estimate.summary);
    out << ".PP\nWithout a \\fICOMMAND\\fR, memcalc estimates one training step, with the options "
           "under OPTIONS; each command under COMMANDS answers another question.\n"
        << ".SH OPTIONS\n";
    write_options(out, estimate, nullptr);
    write_commands(out, commands);
    write_examples(out, commands);
    out << ".SH EXIT STATUS\n" << roff(split_footer(estimate.footer).exit_status) << "\n";
    out << ".SH SEE ALSO\n\\fBmemcalc \\-\\-help\\fR and \\fBmemcalc \\fICOMMAND\\fB "
           "\\-\\-help\\fR print the same options; \\fBmemcalc presets\\fR lists the built-in "
           "models, whose JSON files are installed in \\fIshare/memcalc/presets\\fR beside "
           "this page's \\fIshare/man\\fR, a start for \\fB\\-\\-model\\-file\\fR.\n";
}

}  // namespace memcalc::cli
