// memcalc_docs: writes the man page and the shell completions from the program's own options
// (program_docs.hpp). Run at build time: memcalc_docs FOLDER writes FOLDER/memcalc.1,
// FOLDER/memcalc.bash and FOLDER/_memcalc.
#include <fstream>
#include <iostream>
#include <string>

#include "program_docs.hpp"

int main(int argc, char** argv) {
    using namespace memcalc::cli;
    if (argc != 2) {
        std::cerr << "usage: memcalc_docs FOLDER\n";
        return 2;
    }
    const std::vector<CommandDoc> commands = program_commands();
    const std::string folder = argv[1];
    for (const auto& [file, write] : {std::pair{"/memcalc.1", &write_man_page},
                                      std::pair{"/memcalc.bash", &write_bash_completion},
                                      std::pair{"/_memcalc", &write_zsh_completion}}) {
        std::ofstream out(folder + file);
        write(out, commands);
        if (!out.flush()) {
            std::cerr << "memcalc_docs: cannot write " << folder << file << "\n";
            return 1;
        }
    }
    return 0;
}
