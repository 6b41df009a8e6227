// memcalc: the command-line program (src/command_line.cpp does the work).
#include "command_line.hpp"

int main(int argc, char** argv) { return memcalc::cli::run_command_line(argc, argv); }
