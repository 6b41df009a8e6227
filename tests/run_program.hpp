#pragma once
// Runs the built memcalc program through the shell and captures its exit status, stdout and stderr.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace testing {

struct Run {
    int status = -1;
    std::string out, err;
};

/// `command` is shell text in which `memcalc` names the program under test.
inline Run shell(const std::string& command) {
    char err_path[] = "/tmp/memcalc_test_stderr_XXXXXX";
    const int fd = mkstemp(err_path);
    if (fd >= 0) close(fd);
    const std::string binary = MEMCALC_BINARY;
    const std::string dir = binary.substr(0, binary.rfind('/'));
    const std::string full =
        "PATH='" + dir + "':\"$PATH\"; export PATH; (" + command + ") 2>" + err_path;
    Run run;
    if (FILE* pipe = popen(full.c_str(), "r")) {
        char buffer[4096];
        std::size_t n;
        while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) run.out.append(buffer, n);
        const int status = pclose(pipe);
        run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::ifstream err(err_path);
    std::stringstream text;
    text << err.rdbuf();
    run.err = text.str();
    std::remove(err_path);
    return run;
}

inline Run memcalc(const std::string& args) { return shell("memcalc " + args); }

/// The recipes listing's row `name` (null where the listing has none), written to `path`: a recipe
/// file, which the listing's rows are.
inline nlohmann::json listed_recipe(const std::string& name, const std::string& path) {
    const Run listing = memcalc("recipes --format json");
    if (listing.status != 0) return nullptr;
    for (const auto& row : nlohmann::json::parse(listing.out))
        if (row["name"] == name) {
            std::ofstream(path) << row.dump();
            return row;
        }
    return nullptr;
}

}  // namespace testing
