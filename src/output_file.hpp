#pragma once
// The files a run writes (--output, --plot): all of them or none, each complete or absent.
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace memcalc::cli {

/// A run's output as it is made: in memory, then past 16 MiB in an unnamed temporary file, so a
/// sweep of any length holds a bounded amount of memory and still prints nothing until it has
/// succeeded.
class Spool {
public:
    Spool() = default;
    Spool(const Spool&) = delete;
    Spool& operator=(const Spool&) = delete;
    ~Spool();

    void append(std::string_view text);
    /// `write(text)` appends to the output's text in place (a row at a time, bounded).
    template <class Write>
    void append_with(Write&& write) {
        write(memory_);
        settle();
    }
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
        if (!memory_.empty())
            sink(std::string_view(memory_));  // all of it, or what follows the file's
        return true;
    }

    /// Writes every byte, in order, to `fd`: the file's part copied in the kernel (sendfile(2))
    /// where it can be, else read and written a megabyte at a time. false (errno set) when a
    /// read or a write fails.
    bool write_to(int fd) const;

private:
    /// Past 16 MiB, the text so far goes to the file, and then every megabyte.
    void settle();

    std::string
        memory_;  ///< the whole output; once spooling, what is not in the file yet (under 1 MiB)
    std::FILE* file_ = nullptr;
};

struct PendingFile {
    std::string option;  ///< "--output", "--plot": named in errors; empty for the report on stdout
    std::string path;    ///< "-", /dev/stdout, /dev/fd/1 and /proc/self/fd/1: standard output
    std::string text;
    const Spool* spool = nullptr;  ///< when set, the text comes from here

    /// Hands every byte to `sink`, from the spool or the text; false when the spool cannot be read.
    template <class Sink>
    bool each_chunk(Sink&& sink) const {
        if (spool != nullptr) return spool->each_chunk(sink);
        sink(std::string_view(text));
        return true;
    }
};

/// Resolves every path as open(2) would, a link at a time under the kernel's protected_symlinks
/// rule (another user's link in a sticky world-writable folder such as /tmp is refused), and
/// refuses a path that is a file this run read (inputs_read()) or that another output names.
/// A regular file, new or not, is written through a temporary of its own (mkstemp, a short fixed
/// name) in its folder, flushed to disk, then renamed into place, so concurrent writers never
/// splice and a failure leaves no partial file; it keeps its permissions, a new one gets 0666 less
/// the umask. A character device or FIFO is opened and written as it is, never replaced (a FIFO
/// waits for its reader); a folder, block device or socket is refused. Temporaries are removed on
/// every failure path, and on SIGINT, SIGTERM and SIGHUP before the signal takes its course.
/// Returns the one file that names standard output, for the caller to print (nullptr: none).
/// Throws memcalc::error, or usage_error for a path that is an input or named twice.
const PendingFile* write_files(const std::vector<PendingFile>& files);

/// Writes all of `f` to `fd`; false (errno set) when a read or a write fails.
bool write_whole(int fd, const PendingFile& f);

}  // namespace memcalc::cli
