#pragma once
// The files a run writes (--output, --plot): all of them or none, each complete or absent.
#include <string>
#include <vector>

namespace memcalc::cli {

struct PendingFile {
    std::string option;  ///< "--output", "--plot": named in errors
    std::string path;
    std::string text;
};

/// Writes every file through a temporary of its own (mkstemp) in the target's folder, flushed to disk,
/// then renamed into place, so concurrent writers never splice and a failure leaves no partial file.
/// A symbolic link is written through (its target is replaced, the link stays); a file that exists
/// keeps its permissions, a new one gets 0666 less the umask. A temporary is removed on every failure
/// path, and on SIGINT, SIGTERM and SIGHUP before the signal takes its course. Throws memcalc::error.
void write_files(const std::vector<PendingFile>& files);

/// Throws a usage error when `output` is the same file as one of `inputs` (a model file, a config).
void refuse_overwriting_inputs(const PendingFile& output, const std::vector<std::string>& inputs);

}  // namespace memcalc::cli
