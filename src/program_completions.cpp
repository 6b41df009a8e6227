// memcalc's bash and zsh completions, written from the program's own commands and options and the
// values each takes (program_docs.hpp): commands, options, and an option's values where they are a
// known set (presets, recipes, GPUs, profiles, recomputation modes, ...), or file names.
#include <algorithm>
#include <cctype>
#include <map>
#include <ostream>
#include <string>
#include <string_view>

#include "program_docs.hpp"

namespace memcalc::cli {
namespace {

std::string joined(const Words& words, const char* between = " ") {
    std::string out;
    for (const std::string& w : words) out += (out.empty() ? "" : between) + w;
    return out;
}

/// What bash completes after an option: "v VALUES" (one of them), "l VALUES" (a comma list of
/// them), "f" (a file), "a" (any value).
std::string bash_spec(const OptionDoc& option) {
    if (option.file) return "f";
    if (option.choices.empty()) return "a";
    return (option.list ? "l " : "v ") + joined(option.choices);
}

void write_bash_options(std::ostream& out, const std::vector<CommandDoc>& commands) {
    out << "_memcalc_options() {  # the options of command $1 ('' for the estimate)\n"
        << "    case $1 in\n";
    for (const CommandDoc& command : commands) {
        Words names;
        for (const OptionDoc& option : command.options)
            names.insert(names.end(), option.names.begin(), option.names.end());
        out << "        '" << command.name << "') echo '" << joined(names) << "' ;;\n";
    }
    out << "    esac\n}\n\n";
}

/// Options that take a value, by what is completed after them: one case arm each.
void write_bash_values(std::ostream& out, const std::vector<CommandDoc>& commands) {
    std::map<std::string, Words> by_spec;
    for (const CommandDoc& command : commands)
        for (const OptionDoc& option : command.options)
            if (!option.value.empty())
                for (const std::string& name : option.names)
                    by_spec[bash_spec(option)].push_back("'" + command.name + " " + name + "'");
    out << "_memcalc_option() {  # what follows option $2 of command $1: see below; 1: no value\n"
        << "    case \"$1 $2\" in\n";
    for (const auto& [spec, keys] : by_spec)
        out << "        " << joined(keys, "|\\\n        ") << ")\n            echo '" << spec
            << "' ;;\n";
    out << "        *) return 1 ;;\n    esac\n}\n\n";
}

const char* const bash_main = R"bash(_memcalc() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev='' command='' spec head=''
    (( COMP_CWORD > 0 )) && prev=${COMP_WORDS[COMP_CWORD-1]}
    if [[ $cur == = ]]; then  # --option=, split at the '=' (COMP_WORDBREAKS)
        cur=''
    elif [[ $prev == = && COMP_CWORD -gt 1 ]]; then
        prev=${COMP_WORDS[COMP_CWORD-2]}
    fi
    if (( COMP_CWORD > 1 )); then
        case ${COMP_WORDS[1]} in
            @COMMANDS@) command=${COMP_WORDS[1]} ;;
        esac
    fi
    if [[ $prev == -* ]] && spec=$(_memcalc_option "$command" "$prev"); then
        case $spec in
            f) compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- "$cur")) ;;
            l\ *) [[ $cur == *,* ]] && head=${cur%,*},
                  COMPREPLY=($(compgen -P "$head" -W "${spec#l }" -- "${cur##*,}")) ;;
            v\ *) COMPREPLY=($(compgen -W "${spec#v }" -- "$cur")) ;;
            *) COMPREPLY=() ;;
        esac
        return 0
    fi
    if [[ -z $command && COMP_CWORD -eq 1 && $cur != -* ]]; then
        COMPREPLY=($(compgen -W '@NAMES@' -- "$cur"))
    else
        COMPREPLY=($(compgen -W "$(_memcalc_options "$command")" -- "$cur"))
    fi
}
complete -F _memcalc memcalc
)bash";

std::string replaced(std::string text, const std::string& from, const std::string& to) {
    for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at))
        text.replace(at, from.size(), to), at += to.size();
    return text;
}

Words command_names(const std::vector<CommandDoc>& commands) {
    Words names;
    for (std::size_t i = 1; i < commands.size(); ++i) names.push_back(commands[i].name);
    return names;
}

/// Text for a zsh _arguments spec inside single quotes: no quotes, brackets or colons.
std::string zsh_text(std::string text, std::size_t most) {
    const std::size_t stop = text.find(". ");
    if (stop != std::string::npos) text.resize(stop);
    if (text.size() > most) text = text.substr(0, most - 3) + "...";
    for (char& c : text)
        if (std::string_view("'\"[]:\\`$").find(c) != std::string_view::npos) c = ' ';
    return text;
}

std::string zsh_spec(const OptionDoc& option, const std::string& name) {
    std::string spec = "'" + name + "[" + zsh_text(option.help, 70) + "]";
    if (option.value.empty()) return spec + "'";
    // "MODE[,MODE...]", "PATH|DIR": "mode", "path" (one word: _values reads it as the description)
    std::string message = zsh_text(option.value.substr(0, option.value.find_first_of("[|")), 30);
    std::transform(message.begin(), message.end(), message.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    spec += ":" + message + ":";
    if (option.file)
        spec += "_files";
    else if (!option.choices.empty() && option.list)
        spec += "_values -s , " + message + " " + joined(option.choices);
    else if (!option.choices.empty())
        spec += "(" + joined(option.choices) + ")";
    else
        spec += " ";
    return spec + "'";
}

}  // namespace

void write_bash_completion(std::ostream& out, const std::vector<CommandDoc>& commands) {
    out << "# memcalc's bash completion: generated from the program's options by memcalc_docs\n"
        << "# (src/program_completions.cpp); do not edit.\n\n";
    write_bash_options(out, commands);
    write_bash_values(out, commands);
    const Words names = command_names(commands);
    out << replaced(replaced(bash_main, "@COMMANDS@", joined(names, "|")), "@NAMES@",
                    joined(names));
}

void write_zsh_completion(std::ostream& out, const std::vector<CommandDoc>& commands) {
    out << "#compdef memcalc\n"
        << "# memcalc's zsh completion: generated from the program's options by memcalc_docs\n"
        << "# (src/program_completions.cpp); do not edit.\n\n"
        << "_memcalc() {\n  local command=''\n  local -a specs\n"
        << "  (( CURRENT > 2 )) && case $words[2] in\n    (" << joined(command_names(commands), "|")
        << ") command=$words[2] ;;\n  esac\n  case $command in\n";
    for (const CommandDoc& command : commands) {
        out << "    ('" << command.name << "')\n      specs=(\n";
        for (const OptionDoc& option : command.options)
            for (const std::string& name : option.names)
                out << "        " << zsh_spec(option, name) << "\n";
        out << "      ) ;;\n";
    }
    out << "  esac\n  if [[ -n $command ]]; then\n    shift words\n    (( CURRENT-- ))\n"
        << "  elif (( CURRENT == 2 )); then\n    specs+=('1:command:((";
    for (std::size_t i = 1; i < commands.size(); ++i)
        out << (i == 1 ? "" : " ") << commands[i].name << "\\:\""
            << zsh_text(commands[i].summary, 60) << "\"";
    out << "))')\n  fi\n  _arguments -S : $specs\n}\n\n_memcalc \"$@\"\n";
}

}  // namespace memcalc::cli
