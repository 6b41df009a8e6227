#pragma once
// The files a run writes (--output, --plot): all of them or none, each complete or absent.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace memcalc::cli {

/// A temporary file beside an output, not yet renamed into place: removed on every failure path,
/// and on SIGINT, SIGTERM and SIGHUP (its path kept where the signal handler reads it).
struct Temporary {
    std::string path;
    std::size_t slot = 0;  ///< the handler's
    bool live = false;

    void forget();  ///< renamed into place: no longer the handler's to remove
    void remove();
};

/// fdatasync(2) of a file on a thread of its own, one at a time: a long output's earlier megabytes
/// reach the disk while its later ones are made, so the fsync that ends it has little left to wait
/// for (a 200 MB sweep on this project's machines: 0.1 s of a 0.4 s run, hidden).
class BackgroundFlush {
public:
    BackgroundFlush() = default;
    BackgroundFlush(const BackgroundFlush&) = delete;
    BackgroundFlush& operator=(const BackgroundFlush&) = delete;
    ~BackgroundFlush() { wait(); }
    /// Starts one unless one is running; none where no thread can start (fsync still flushes).
    void start(int fd);
    void wait();  ///< until the running one ends

private:
    std::thread thread_;
    std::atomic<bool> running_{false};
};

/// A run's output as it is made: in memory, then past 1 MiB in a temporary file, so a sweep of
/// any length holds a bounded amount of memory and still prints nothing until it has succeeded.
/// The file is unnamed, or, for a regular --output, a temporary beside it (spool_beside) that the
/// kernel starts writing to disk as it grows and that is renamed into place, not copied.
class Spool {
public:
    Spool() = default;
    Spool(const Spool&) = delete;
    Spool& operator=(const Spool&) = delete;
    ~Spool();

    /// Spools into a temporary in `folder` (an --output's), or unnamed where it cannot make one.
    void spool_beside(std::string folder) { folder_ = std::move(folder); }

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
        std::string chunk(fd_ >= 0 ? 1u << 20 : 0, '\0');
        for (std::uint64_t at = 0; at < written_;) {
            const long n = read_at(chunk, at);
            if (n <= 0) return false;
            sink(std::string_view(chunk.data(), static_cast<std::size_t>(n)));
            at += static_cast<std::uint64_t>(n);
        }
        if (!memory_.empty())
            sink(std::string_view(memory_));  // all of it, or what follows the file's
        return true;
    }

    /// Writes every byte, in order, to `fd`: the file's part copied in the kernel (sendfile(2))
    /// where it can be, else read and written a megabyte at a time. false (errno set) when a
    /// read or a write fails.
    bool write_to(int fd) const;

    /// Whether the whole output is, or will be, in a temporary in `folder`.
    bool spooled_in(const std::string& folder) const { return named_.live && folder == folder_; }
    /// That temporary, the rest of the output written, permissions `mode`, flushed to disk and
    /// closed, into `done` for the caller to rename. false (errno set, the temporary removed)
    /// where a step fails.
    bool finish(unsigned mode, Temporary& done);

private:
    static constexpr std::size_t in_memory = 1u << 20, write_batch = 1u << 20;
    /// Past 1 MiB, the text so far goes to the file, and then every megabyte. Not more in
    /// memory: each page a buffer first touches is a fault, which costs most in a virtual machine.
    void settle();
    void open_file();
    void spool_out(std::string_view text);  ///< to the file, whole
    long read_at(std::string& chunk, std::uint64_t at) const;

    std::string
        memory_;  ///< the whole output; once spooling, what is not in the file yet (under 1 MiB)
    int fd_ = -1;
    std::string folder_;  ///< where a named temporary goes; empty: unnamed
    Temporary named_;
    std::uint64_t written_ = 0;                  ///< bytes in the file
    [[maybe_unused]] std::uint64_t handed_ = 0;  ///< those handed to the disk (Linux only)
    BackgroundFlush flush_;                      ///< of a named temporary's pages so far
};

struct PendingFile {
    std::string option;  ///< "--output", "--plot": named in errors; empty for the report on stdout
    std::string path;    ///< "-", /dev/stdout, /dev/fd/1 and /proc/self/fd/1: standard output
    std::string text;
    Spool* spool = nullptr;  ///< when set, the text comes from here

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
/// the umask; an output spooled beside its target (Spool::spool_beside) is that temporary already.
/// A character device or FIFO is opened and written as it is, never replaced (a FIFO
/// waits for its reader); a folder, block device or socket is refused. Temporaries are removed on
/// every failure path, and on SIGINT, SIGTERM and SIGHUP before the signal takes its course.
/// Returns the one file that names standard output, for the caller to print (nullptr: none).
/// Throws memcalc::error, or usage_error for a path that is an input or named twice.
const PendingFile* write_files(const std::vector<PendingFile>& files);

/// The folder of `f`'s target where it is a regular file (Spool::spool_beside), else empty;
/// empty too where the path cannot be resolved yet (write_files names the error).
std::string regular_output_folder(const PendingFile& f);

/// Writes all of `f` to `fd`; false (errno set) when a read or a write fails.
bool write_whole(int fd, const PendingFile& f);

}  // namespace memcalc::cli
