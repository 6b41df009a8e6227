// memcalc._memcalc: the memcalc program, run in-process. One function, run(args) -> (status, out,
// err), which is what the command line `memcalc ARGS...` exits with and prints on stdout and
// stderr. memcalc/__init__.py builds the arguments and reads the JSON; nothing here computes
// anything itself.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <csignal>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "command_line.hpp"

namespace py = pybind11;

namespace {

/// The program's signal handlers, which --output and --plot install to remove half-written files,
/// would replace Python's (Ctrl-C would then kill the interpreter): each run puts Python's back.
class SignalHandlersKept {
public:
    SignalHandlersKept() {
        for (std::size_t i = 0; i < signals.size(); ++i) sigaction(signals[i], nullptr, &saved_[i]);
    }
    ~SignalHandlersKept() {
        for (std::size_t i = 0; i < signals.size(); ++i) sigaction(signals[i], &saved_[i], nullptr);
    }
    SignalHandlersKept(const SignalHandlersKept&) = delete;
    SignalHandlersKept& operator=(const SignalHandlersKept&) = delete;

private:
    static constexpr std::array<int, 3> signals{SIGINT, SIGTERM, SIGHUP};
    std::array<struct sigaction, 3> saved_{};
};

/// One run at a time: the program keeps process-wide state for its output files.
std::mutex one_run;

std::tuple<int, std::string, std::string> run(const std::vector<std::string>& args) {
    std::vector<const char*> argv{"memcalc"};
    for (const auto& a : args) argv.push_back(a.c_str());
    argv.push_back(nullptr);
    std::ostringstream out;
    std::ostringstream err;
    int status = 0;
    {
        py::gil_scoped_release unlocked;  // other Python threads run meanwhile
        const std::lock_guard<std::mutex> lock(one_run);
        const SignalHandlersKept kept;
        status = memcalc::cli::run_command_line(static_cast<int>(argv.size() - 1), argv.data(), out,
                                                err);
    }
    return {status, out.str(), err.str()};
}

}  // namespace

PYBIND11_MODULE(_memcalc, m) {
    m.doc() =
        "The memcalc program, run in-process (see the memcalc package for the Python interface).";
    m.def("run", &run, py::arg("args"),
          "run(args: list[str]) -> (status, out, err)\n\n"
          "Runs `memcalc ARGS...` in-process: its exit status (0, 1 bad input, 2 bad command line) "
          "and what it\n"
          "prints on stdout and stderr.");
}
