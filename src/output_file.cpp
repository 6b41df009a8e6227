#include "output_file.hpp"

#include <fcntl.h>
#if defined(__linux__)
#include <sys/sendfile.h>
#endif
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <array>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <system_error>
#include <utility>

#include "arguments.hpp"
#include "memcalc/error.hpp"
#include "model_file.hpp"

namespace memcalc::cli {
namespace {

// Temporaries not yet renamed, for the signal handler: fixed buffers, since it may only call
// async-signal-safe functions (unlink, signal, raise).
constexpr std::size_t max_pending = 8;
std::array<std::array<char, PATH_MAX + 1>, max_pending> pending_paths{};
volatile std::sig_atomic_t pending_count = 0;

extern "C" void remove_temporaries(int signal_number) {
    for (std::sig_atomic_t i = 0; i < pending_count; ++i)
        if (pending_paths[static_cast<std::size_t>(i)][0] != '\0')
            unlink(pending_paths[static_cast<std::size_t>(i)].data());
    std::signal(signal_number, SIG_DFL);
    std::raise(signal_number);
}

void install_handlers() {
    static bool installed = false;
    if (installed) return;
    installed = true;
    for (int s : {SIGINT, SIGTERM, SIGHUP}) std::signal(s, remove_temporaries);
}

std::string reason() { return std::strerror(errno); }

/// An output as errors name it: "--output 'x'", or the report that goes to stdout unasked.
std::string output_named(const PendingFile& f) {
    if (f.option.empty()) return "the report on standard output";
    return f.option + " '" + f.path + "'";
}

std::string cannot_write(const PendingFile& f, const std::string& why) {
    const std::string option = f.option.empty() ? "standard output" : f.option;
    return option + ": cannot write '" + f.path + "': " + why;
}

std::string folder_of(const std::string& path) {
    const auto slash = path.rfind('/');
    return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

bool same_file(const struct stat& a, const struct stat& b) {
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// ---- Resolving a path as open(2) does, a link at a time.

constexpr int max_links = 40;  // the kernel's own limit before ELOOP

std::deque<std::string> path_components(const std::string& path) {
    std::deque<std::string> parts;
    std::size_t start = 0;
    for (std::size_t slash; (slash = path.find('/', start)) != std::string::npos; start = slash + 1)
        parts.push_back(path.substr(start, slash - start));
    parts.push_back(path.substr(start));
    return parts;
}

bool names_standard_output(const std::string& path) {
    return path == "-" || path == "/dev/stdout" || path == "/dev/fd/1" || path == "/proc/self/fd/1";
}

/// The folders walked so far, none of them a symbolic link: ".." is then the parent as written.
class WalkedPath {
public:
    explicit WalkedPath(bool absolute) : absolute_(absolute) {}

    std::string str() const {
        std::string s = absolute_ ? "/" : "";
        for (std::size_t i = 0; i < parts_.size(); ++i) s += (i > 0 ? "/" : "") + parts_[i];
        return s.empty() ? "." : s;
    }
    std::string child(const std::string& name) const {
        if (parts_.empty()) return (absolute_ ? "/" : "") + name;
        return str() + "/" + name;
    }
    void enter(const std::string& name) { parts_.push_back(name); }
    void leave() {
        if (!parts_.empty() && parts_.back() != "..")
            parts_.pop_back();
        else if (!absolute_)
            parts_.push_back("..");
    }
    /// Whether `name` here is /proc/PID/fd/N (or a thread's) of this process: file descriptor N.
    bool is_own_descriptor(const std::string& name, int fd) const {
        const std::size_t n = parts_.size();
        const bool in_fd_folder = n == 3 || (n == 5 && parts_[2] == "task");
        return absolute_ && in_fd_folder && name == std::to_string(fd) && parts_[0] == "proc" &&
               parts_[1] == std::to_string(getpid()) && parts_.back() == "fd";
    }

private:
    bool absolute_;
    std::vector<std::string> parts_;
};

/// Follows the links of one output's path hop by hop, as open(2) would (no realpath shortcut).
class LinkWalk {
public:
    explicit LinkWalk(const PendingFile& f)
        : f_(f), walked_(!f.path.empty() && f.path[0] == '/'), todo_(path_components(f.path)) {}

    /// The path with every link followed; empty when it leads to standard output.
    std::string resolve() {
        while (!todo_.empty()) {
            const std::string name = std::move(todo_.front());
            todo_.pop_front();
            if (name.empty() || name == ".") continue;
            if (name == "..")
                walked_.leave();
            else if (!step(name))
                break;
        }
        if (to_standard_output_) return "";
        for (const std::string& rest : todo_) walked_.enter(rest);  // as written: open(2) will fail
        return walked_.str();
    }

private:
    /// Steps into `name`, following it when it is a link; false where the walk ends.
    bool step(const std::string& name) {
        const std::string here = walked_.child(name);
        struct stat link {};
        if (lstat(here.c_str(), &link) != 0 || !S_ISLNK(link.st_mode)) {
            walked_.enter(name);
            return S_ISDIR(link.st_mode);  // else it is missing or a file: nothing to walk past it
        }
        if (++links_ > max_links)
            throw error(fmt::format("{}: more than {} symbolic links (a loop?)", output_named(f_),
                                    max_links));
        refuse_planted_link(here, link);
        if (todo_.empty() && walked_.is_own_descriptor(name, STDOUT_FILENO)) {
            to_standard_output_ = true;
            return false;
        }
        const std::string to = link_text(here);
        if (!kernel_agrees(here, to)) {  // a /proc link to an open file, which no path names
            walked_.enter(name);
            return false;
        }
        if (to[0] == '/') walked_ = WalkedPath(true);
        const auto parts = path_components(to);
        todo_.insert(todo_.begin(), parts.begin(), parts.end());
        return true;
    }

    /// fs.protected_symlinks: in a sticky world-writable folder, only the follower's own links and
    /// the folder owner's are followed, so another user cannot point a /tmp name at one's files.
    void refuse_planted_link(const std::string& here, const struct stat& link) const {
        struct stat folder {};
        const std::string where = walked_.str();
        if (stat(where.c_str(), &folder) != 0) return;
        const bool shared = (folder.st_mode & S_ISVTX) != 0 && (folder.st_mode & S_IWOTH) != 0;
        if (!shared || link.st_uid == geteuid() || link.st_uid == folder.st_uid) return;
        throw error(
            fmt::format("{}: the symbolic link '{}' in the sticky world-writable folder "
                        "'{}' belongs to uid {}, neither yours nor the folder's owner: "
                        "refusing to follow it",
                        output_named(f_), here, where, link.st_uid));
    }

    std::string link_text(const std::string& here) const {
        std::string text(PATH_MAX, '\0');
        const ssize_t n = readlink(here.c_str(), text.data(), text.size());
        if (n < 0 || static_cast<std::size_t>(n) >= text.size())
            throw error(cannot_write(f_, "cannot read the symbolic link '" + here + "'"));
        text.resize(static_cast<std::size_t>(n));
        return text.empty() ? "." : text;
    }

    /// Whether the kernel follows `here` to the file its text names; it does not for /proc/PID/fd's
    /// links ("pipe:[123]"). A dangling link agrees: open(2) creates the file it names.
    bool kernel_agrees(const std::string& here, const std::string& to) const {
        struct stat followed {
        }, named{};
        if (stat(here.c_str(), &followed) != 0) return true;
        const std::string path = to[0] == '/' ? to : walked_.child(to);
        return stat(path.c_str(), &named) == 0 && same_file(followed, named);
    }

    const PendingFile& f_;
    WalkedPath walked_;
    std::deque<std::string> todo_;
    int links_ = 0;
    bool to_standard_output_ = false;
};

/// Where an output goes, its path resolved.
struct Target {
    enum class Kind { standard_output, regular, direct } kind = Kind::regular;
    std::string path;                 ///< every link followed (bar a /proc one the kernel follows)
    std::optional<struct stat> file;  ///< the file there now; none for a new one
};

Target target_of(const PendingFile& f) {
    if (names_standard_output(f.path)) return {Target::Kind::standard_output, f.path, std::nullopt};
    Target t{Target::Kind::regular, LinkWalk(f).resolve(), std::nullopt};
    if (t.path.empty()) return {Target::Kind::standard_output, f.path, std::nullopt};
    struct stat st {};
    if (stat(t.path.c_str(), &st) != 0) return t;  // a new file, or an error the write will name
    t.file = st;
    if (S_ISREG(st.st_mode)) return t;
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
        t.kind = Target::Kind::direct;
        return t;
    }
    const char* what = S_ISDIR(st.st_mode)    ? "a folder"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a file";
    throw error(fmt::format("{} is {}{}: memcalc writes regular files, character devices and FIFOs",
                            output_named(f), what, t.path == f.path ? "" : " ('" + t.path + "')"));
}

/// What two outputs are compared by: a file's device and inode, a new one's folder's and its name.
struct OutputIdentity {
    dev_t device = 0;
    ino_t inode = 0;
    std::string name;  ///< empty for a file that exists; all three empty for standard output
    bool operator==(const OutputIdentity& o) const {
        return device == o.device && inode == o.inode && name == o.name;
    }
};

OutputIdentity identity_of(const Target& t) {
    if (t.kind == Target::Kind::standard_output) return {};
    if (t.file) return {t.file->st_dev, t.file->st_ino, ""};
    struct stat folder {};
    const std::string name = t.path.substr(t.path.rfind('/') + 1);  // npos + 1: the whole path
    if (stat(folder_of(t.path).c_str(), &folder) == 0) return {folder.st_dev, folder.st_ino, name};
    return {0, 0, t.path};
}

/// No output may replace a file the run read, nor name the file another output names.
void refuse_clashes(const std::vector<PendingFile>& files, const std::vector<Target>& targets) {
    for (std::size_t i = 0; i < files.size(); ++i) {
        for (const InputFile& input : inputs_read())
            if (targets[i].file && targets[i].file->st_dev == input.device &&
                targets[i].file->st_ino == input.inode)
                throw usage_error(files[i].option + " '" + files[i].path + "' is the input '" +
                                  input.path + "': refusing to overwrite it");
        for (std::size_t j = 0; j < i; ++j)
            if (identity_of(targets[i]) == identity_of(targets[j]))
                throw usage_error(output_named(files[i]) + " and " + output_named(files[j]) +
                                  " name the same file: refusing to write it twice");
    }
}

/// Writes all of `text` to `fd`; false (errno set) when a write fails.
bool write_text(int fd, std::string_view text) {
    for (std::size_t done = 0; done < text.size();) {
        const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        done += static_cast<std::size_t>(n);
    }
    return true;
}

/// Copies `in`'s bytes from `offset` to its end to `out`, in the kernel where it can (sendfile:
/// no read back into memory and write out again), else through a buffer.
bool copy_file(int in, int out, off_t offset) {
    const off_t size = lseek(in, 0, SEEK_END);
    if (size < 0) return false;
#if defined(__linux__)
    while (offset < size) {
        const ssize_t n = sendfile(out, in, &offset, static_cast<std::size_t>(size - offset));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EINVAL || errno == ENOSYS)) break;  // not to this kind of file
        if (n <= 0) return false;
    }
#endif
    std::string chunk(offset < size ? 1u << 20 : 0, '\0');
    while (offset < size) {
        const ssize_t n = pread(in, chunk.data(), chunk.size(), offset);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0 || !write_text(out, std::string_view(chunk.data(), std::size_t(n))))
            return false;
        offset += n;
    }
    return true;
}

/// mkstemp of `pattern` (ending XXXXXX) into `t`, in the next of the signal handler's slots; its
/// descriptor, or -1 with errno set. The caller checks there is a slot and the pattern fits one.
int make_temporary(const std::string& pattern, Temporary& t) {
    t.slot = static_cast<std::size_t>(pending_count);
    std::memcpy(pending_paths[t.slot].data(), pattern.c_str(), pattern.size() + 1);
    const int fd = mkstemp(pending_paths[t.slot].data());
    if (fd < 0) {
        pending_paths[t.slot][0] = '\0';
        return -1;
    }
    t.path = pending_paths[t.slot].data();
    t.live = true;
    pending_count = pending_count + 1;
    return fd;
}

/// A temporary's name beside `target`: short and fixed, as the target's own may take all of
/// NAME_MAX's 255 bytes.
std::string temporary_pattern(const std::string& folder) { return folder + "/.memcalc-XXXXXX"; }

/// What the file will be: an existing file's permissions, else what a plain create would give.
mode_t file_mode(const Target& target) {
    if (target.file) return target.file->st_mode & 07777;
    const mode_t mask = umask(0);
    umask(mask);
    return 0666 & ~mask;
}

/// Writes one regular file's temporary, flushed to disk; the caller renames it. An output spooled
/// beside its target already is its own temporary.
Temporary write_temporary(const PendingFile& f, const Target& target) {
    Temporary t;
    if (f.spool != nullptr && f.spool->spooled_in(folder_of(target.path))) {
        if (!f.spool->finish(file_mode(target), t)) throw error(cannot_write(f, reason()));
        return t;
    }
    if (pending_count >= static_cast<std::sig_atomic_t>(max_pending))
        throw error("too many output files");
    const std::string pattern = temporary_pattern(folder_of(target.path));
    if (pattern.size() > PATH_MAX)
        throw error(f.option + ": the path '" + f.path + "' is too long");
    const int fd = make_temporary(pattern, t);
    if (fd < 0) throw error(cannot_write(f, reason()));
    bool ok = fchmod(fd, file_mode(target)) == 0 && write_whole(fd, f) && fsync(fd) == 0;
    const std::string why = ok ? "" : reason();
    ok = close(fd) == 0 && ok;
    if (!ok) {
        t.remove();
        throw error(cannot_write(f, why.empty() ? reason() : why));
    }
    return t;
}

/// A device or FIFO opened for writing, as the shell's `>` opens it: never replaced.
class DirectFile {
public:
    DirectFile(const PendingFile& f, const Target& target) : f_(&f) {
        // Neither created nor truncated; a FIFO waits here for its reader, as the shell's would.
        fd_ = open(target.path.c_str(), O_WRONLY | O_NOCTTY | O_CLOEXEC);
        if (fd_ < 0) throw error(cannot_write(f, reason()));
        struct stat st {};
        if (fstat(fd_, &st) != 0 || S_ISREG(st.st_mode)) {  // replaced since it was looked at
            close(fd_);
            throw error(cannot_write(f, "it changed while being opened"));
        }
    }
    DirectFile(DirectFile&& o) noexcept : f_(o.f_), fd_(std::exchange(o.fd_, -1)) {}
    DirectFile(const DirectFile&) = delete;
    DirectFile& operator=(const DirectFile&) = delete;
    DirectFile& operator=(DirectFile&&) = delete;
    ~DirectFile() {
        if (fd_ >= 0) close(fd_);
    }

    void write() {
        // A reader that goes away is an error to report (and temporaries to remove), not a death.
        const auto previous = std::signal(SIGPIPE, SIG_IGN);
        bool ok = write_whole(fd_, *f_);
        const std::string why = ok ? "" : reason();
        std::signal(SIGPIPE, previous);
        ok = close(std::exchange(fd_, -1)) == 0 && ok;
        if (!ok) throw error(cannot_write(*f_, why.empty() ? reason() : why));
    }

private:
    const PendingFile* f_;
    int fd_ = -1;
};

}  // namespace

void Temporary::forget() {
    if (!live) return;
    pending_paths[slot][0] = '\0';
    live = false;
}

void Temporary::remove() {
    if (!live) return;
    unlink(path.c_str());
    forget();
}

void BackgroundFlush::start(int fd) {
    if (running_) return;
    wait();
    running_ = true;
    try {
        thread_ = std::thread([this, fd] {
#if defined(__linux__)
            fdatasync(fd);  // the data alone: the final fsync writes the metadata once
#else
            fsync(fd);
#endif
            running_ = false;
        });
    } catch (const std::system_error&) {
        running_ = false;
    }
}

void BackgroundFlush::wait() {
    if (thread_.joinable()) thread_.join();
}

Spool::~Spool() {
    flush_.wait();
    if (fd_ >= 0) close(fd_);
    named_.remove();
}

void Spool::append(std::string_view text) {
    if (fd_ < 0 || memory_.size() + text.size() < write_batch)
        return append_with([&](std::string& memory) { memory += text; });
    // Once spooling, a batch's worth goes to the file as it is: not copied into memory first.
    spool_out(memory_);
    memory_.clear();
    spool_out(text);
}

void Spool::open_file() {
    install_handlers();
    const std::string pattern = temporary_pattern(folder_);
    if (!folder_.empty() && pending_count < static_cast<std::sig_atomic_t>(max_pending) &&
        pattern.size() <= PATH_MAX)
        fd_ = make_temporary(pattern, named_);
    if (fd_ >= 0) return;
    std::FILE* unnamed = std::tmpfile();  // it vanishes with the process, however it ends
    fd_ = unnamed != nullptr ? dup(fileno(unnamed)) : -1;
    if (unnamed != nullptr) std::fclose(unnamed);
    if (fd_ < 0)
        throw error(std::string("cannot spool the output to a temporary file: ") + reason());
}

void Spool::spool_out(std::string_view text) {
    if (!write_text(fd_, text))
        throw error(std::string("cannot spool the output to a temporary file: ") + reason());
    written_ += text.size();
#if defined(__linux__)
    // A named temporary is the output itself: its pages go to the disk as they are written, so
    // that the fsync before its rename has little left to wait for. fdatasync, not a hint
    // (sync_file_range): most of that fsync's time was the disk's flush of what the hint had sent.
    constexpr std::uint64_t hand_over = 32u << 20;
    if (named_.live && written_ - handed_ >= hand_over) {
        flush_.start(fd_);  // its errors are fsync's to report
        handed_ = written_;
    }
#endif
}

long Spool::read_at(std::string& chunk, std::uint64_t at) const {
    for (;;) {
        const ssize_t n = pread(fd_, chunk.data(), chunk.size(), static_cast<off_t>(at));
        if (n >= 0 || errno != EINTR) return static_cast<long>(n);
    }
}

bool write_whole(int fd, const PendingFile& f) {
    return f.spool != nullptr ? f.spool->write_to(fd) : write_text(fd, f.text);
}

bool Spool::write_to(int fd) const {
    if (fd_ < 0 && written_ > 0) {  // finished: its file is another's now
        errno = EBADF;
        return false;
    }
    if (fd_ >= 0 && !copy_file(fd_, fd, 0)) return false;
    return write_text(fd, memory_);  // all of it, or what follows the file's
}

bool Spool::finish(unsigned mode, Temporary& done) {
    flush_.wait();
    const bool written =
        write_text(fd_, memory_) && fchmod(fd_, static_cast<mode_t>(mode)) == 0 && fsync(fd_) == 0;
    const int why = errno;  // the first failure's, not close's
    const bool closed = close(std::exchange(fd_, -1)) == 0;
    if (!written || !closed) {
        const int reported = written ? errno : why;
        named_.remove();
        errno = reported;
        return false;
    }
    done = std::exchange(named_, Temporary{});
    return true;
}

void Spool::settle() {
    if (fd_ < 0) {
        // Past a few pages, room for all it may hold at once: no copy as it grows.
        if (memory_.size() > (64u << 10) && memory_.capacity() < in_memory)
            memory_.reserve(in_memory + write_batch);
        if (memory_.size() <= in_memory) return;
        open_file();
    }
    if (memory_.size() < write_batch) return;
    spool_out(memory_);
    memory_.clear();
    if (memory_.capacity() > 4 * write_batch) {  // after one large append_with
        memory_.shrink_to_fit();
        memory_.reserve(2 * write_batch);  // a batch and a row: never grown again
    }
}

std::string regular_output_folder(const PendingFile& f) {
    try {
        const Target target = target_of(f);
        return target.kind == Target::Kind::regular ? folder_of(target.path) : "";
    } catch (const std::exception&) {
        return "";
    }
}

const PendingFile* write_files(const std::vector<PendingFile>& files) {
    install_handlers();
    std::vector<Target> targets;
    for (const auto& f : files) targets.push_back(target_of(f));
    refuse_clashes(files, targets);
    const PendingFile* to_standard_output = nullptr;
    std::vector<std::pair<Temporary, std::size_t>> temporaries;  // and the file's index
    std::vector<DirectFile> directs;
    try {
        // Every file made before any is put in place: all of them, or none.
        for (std::size_t i = 0; i < files.size(); ++i) {
            if (targets[i].kind == Target::Kind::regular)
                temporaries.emplace_back(write_temporary(files[i], targets[i]), i);
            else if (targets[i].kind == Target::Kind::direct)
                directs.emplace_back(files[i], targets[i]);
            else
                to_standard_output = &files[i];
        }
        for (auto& direct : directs) direct.write();
        for (auto& [temporary, i] : temporaries) {
            if (std::rename(temporary.path.c_str(), targets[i].path.c_str()) != 0)
                throw error(cannot_write(files[i], reason()));
            temporary.forget();
        }
    } catch (...) {
        for (auto& written : temporaries) written.first.remove();
        pending_count = 0;
        throw;
    }
    pending_count = 0;
    return to_standard_output;
}

}  // namespace memcalc::cli
