#pragma once
// The files a run writes (--output, --plot): all of them or none, each complete or absent.
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace memcalc::cli {

/// A run's output as it is made: in memory, then past 16 MiB in an unnamed temporary file, so a sweep
/// of any length holds a bounded amount of memory and still prints nothing until it has succeeded.
class Spool {
public:
    Spool() = default;
    Spool(const Spool&) = delete;
    Spool& operator=(const Spool&) = delete;
    ~Spool();

    void append(std::string_view text);
    /// Hands every byte, in order, to `sink` (chunks of at most 1 MiB); false when a read fails.
    template <class Sink>
    bool each_chunk(Sink&& sink) const {
        if (file_ != nullptr) {
            std::rewind(file_);
            std::string chunk(1 << 20, '\0');
            for (std::size_t n; (n = std::fread(chunk.data(), 1, chunk.size(), file_)) > 0;)
                sink(std::string_view(chunk.data(), n));
            if (std::ferror(file_) != 0) return false;
        }
        if (!memory_.empty()) sink(std::string_view(memory_));  // all of it, or what follows the file's
        return true;
    }

private:
    std::string memory_;  ///< the whole output; once spooling, what is not in the file yet (under 1 MiB)
    std::FILE* file_ = nullptr;
};

struct PendingFile {
    std::string option;  ///< "--output", "--plot": named in errors
    std::string path;
    std::string text;
    const Spool* spool = nullptr;  ///< when set, the text comes from here
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
