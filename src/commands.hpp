#pragma once
// The subcommands, a file each (command_estimate.cpp, command_fit.cpp, command_plan.cpp,
// command_serve.cpp, command_catalogues.cpp), and what they share; command_line.cpp parses and dispatches.
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "arguments.hpp"
#include "model_file.hpp"
#include "output_file.hpp"
#include "render.hpp"

namespace memcalc::cli {

/// A progress line on stderr, only when stderr is a terminal and the work has run past a second.
class Progress {
public:
    /// `every`: how many items between looks at the clock.
    Progress(const char* what, std::size_t every) : what_(what), every_(every), terminal_(isatty(fileno(stderr)) != 0) {}
    ~Progress() {
        if (shown_) std::cerr << "\r\033[K" << std::flush;
    }
    void operator()(std::size_t done) {
        if (!terminal_ || done % every_ != 0) return;
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        if (seconds < 1) return;
        shown_ = true;
        std::cerr << "\r" << what_ << ": " << done << " evaluated (" << static_cast<long long>(done / seconds) << "/s)"
                  << std::flush;
    }

private:
    const char* what_;
    std::size_t every_;
    bool terminal_, shown_ = false;
    std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

/// Checks the options every estimating command shares, before any model is read.
void check_run_options(const Request& q);

/// The model a command names (preset, model file or config.json), its name made printable.
ModelFile load_model(const Request& q);

ActivationModel activation_model(const Request& q);

/// The settings every estimating command reads the same way: the recipe, the activation model and
/// the framework (the profile's values, each flag given overriding one).
/// Fit and plan take one --attention; the estimate sweeps a list and sets it per configuration.
Settings settings_from(const Request& q);
/// A device's memory and the option that gave it ("--gpu h100-sxm"), for messages.
struct DeviceMemory {
    Count bytes;
    std::string given_by;
    std::optional<Gpu> gpu;  ///< the GPU named, with its speeds; none for --device-memory
};
/// --device-memory, or the memory of --gpu or --gpu-file; none when no option gives one.
std::optional<DeviceMemory> device_memory(const Request& q);

/// The attention kernels to estimate: --attention's list, or the profile's one.
std::vector<Attention> attentions_from(const Request& q, const Settings& settings);
Attention single_attention(const Request& q, const Settings& settings, const char* command);

/// One rendering in the format asked for (--format): only that format's renderer runs.
template <class Json, class Csv, class Table>
std::string in_format(const std::string& format, Json&& json, Csv&& csv, Table&& table) {
    switch (parse_format(format)) {
        case Format::json: return json().dump(2) + "\n";
        case Format::csv: return csv();
        case Format::table: return table();
    }
    return {};
}

inline Unit unit_of(const Request& q) { return q.units == "gib" ? Unit::gib : Unit::gb; }

/// The estimate (and its sweeps): `out` is what goes to stdout or --output, `files` a plot asked for.
void run_estimate(const Request& q, Spool& out, std::vector<PendingFile>& files);
std::string run_fit(const Request& q);
std::string run_plan(const Request& q);
std::string run_serve(const Request& q);
std::string run_presets(const std::string& format);
std::string run_recipes(const std::string& format);
std::string run_profiles(const std::string& format);
std::string run_gpus(const std::string& format);
std::string run_activation_functions(const std::string& format);

}  // namespace memcalc::cli
