#include "output_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include "arguments.hpp"
#include "memcalc/error.hpp"

namespace memcalc::cli {
namespace {

// Temporaries not yet renamed, for the signal handler: fixed buffers, since it may only call
// async-signal-safe functions (unlink, signal, raise).
constexpr std::size_t max_pending = 8;
std::array<std::array<char, PATH_MAX + 1>, max_pending> pending_paths{};
volatile std::sig_atomic_t pending_count = 0;

extern "C" void remove_temporaries(int signal_number) {
    for (std::sig_atomic_t i = 0; i < pending_count; ++i)
        if (pending_paths[static_cast<std::size_t>(i)][0] != '\0') unlink(pending_paths[static_cast<std::size_t>(i)].data());
    std::signal(signal_number, SIG_DFL);
    std::raise(signal_number);
}

void install_handlers() {
    static bool installed = false;
    if (installed) return;
    installed = true;
    for (int s : {SIGINT, SIGTERM, SIGHUP}) std::signal(s, remove_temporaries);
}

/// The file a path names once its symbolic links are followed; the path itself when it does not exist.
std::string resolved(const std::string& path) {
    std::array<char, PATH_MAX + 1> buffer{};
    struct stat link {};
    if (lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode) && realpath(path.c_str(), buffer.data()) != nullptr)
        return buffer.data();
    return path;
}

std::string folder_of(const std::string& path) {
    const auto slash = path.rfind('/');
    return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

std::string reason() { return std::strerror(errno); }

struct Temporary {
    std::string path;
    std::size_t slot = 0;
    bool live = false;

    void forget() {
        if (!live) return;
        pending_paths[slot][0] = '\0';
        live = false;
    }
    void remove() {
        if (!live) return;
        unlink(path.c_str());
        forget();
    }
};

/// Writes one file's temporary, flushed to disk; the caller renames it.
Temporary write_temporary(const PendingFile& f, const std::string& target) {
    if (pending_count >= static_cast<std::sig_atomic_t>(max_pending)) throw error("too many output files");
    std::string name = target.substr(target.rfind('/') == std::string::npos ? 0 : target.rfind('/') + 1);
    std::string pattern = folder_of(target) + "/." + name + ".memcalc-XXXXXX";
    if (pattern.size() > PATH_MAX) throw error(f.option + ": the path '" + f.path + "' is too long");
    Temporary t;
    t.slot = static_cast<std::size_t>(pending_count);
    std::memcpy(pending_paths[t.slot].data(), pattern.c_str(), pattern.size() + 1);
    const int fd = mkstemp(pending_paths[t.slot].data());
    if (fd < 0) {
        pending_paths[t.slot][0] = '\0';
        throw error(f.option + ": cannot write '" + f.path + "': " + reason());
    }
    t.path = pending_paths[t.slot].data();
    t.live = true;
    pending_count = pending_count + 1;
    // Keep an existing file's permissions; a new one gets what a plain create would give.
    struct stat existing {};
    mode_t mode = 0;
    if (stat(target.c_str(), &existing) == 0) {
        mode = existing.st_mode & 07777;
    } else {
        const mode_t mask = umask(0);
        umask(mask);
        mode = 0666 & ~mask;
    }
    bool ok = fchmod(fd, mode) == 0;
    const auto write_all = [&](std::string_view text) {
        for (std::size_t done = 0; ok && done < text.size();) {
            const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
            if (n < 0 && errno == EINTR) continue;
            ok = n > 0;
            if (ok) done += static_cast<std::size_t>(n);
        }
    };
    if (f.spool != nullptr) ok = f.spool->each_chunk(write_all) && ok;
    else write_all(f.text);
    ok = ok && fsync(fd) == 0;
    const std::string why = ok ? "" : reason();
    ok = close(fd) == 0 && ok;
    if (!ok) {
        t.remove();
        throw error(f.option + ": cannot write '" + f.path + "': " + (why.empty() ? reason() : why));
    }
    return t;
}

}  // namespace

Spool::~Spool() {
    if (file_ != nullptr) std::fclose(file_);
}

void Spool::append(std::string_view text) {
    constexpr std::size_t in_memory = 16u << 20, write_batch = 1u << 20;
    if (file_ == nullptr && memory_.size() + text.size() > in_memory) {
        file_ = std::tmpfile();  // unnamed: it vanishes with the process, however it ends
        if (file_ == nullptr) throw error(std::string("cannot spool the output to a temporary file: ") + reason());
        std::setvbuf(file_, nullptr, _IONBF, 0);  // written a megabyte at a time already
    }
    memory_ += text;
    if (file_ != nullptr && memory_.size() >= write_batch) {
        if (std::fwrite(memory_.data(), 1, memory_.size(), file_) != memory_.size())
            throw error(std::string("cannot spool the output to a temporary file: ") + reason());
        memory_.clear();
        if (memory_.capacity() > 4 * write_batch) memory_.shrink_to_fit();  // the 16 MiB it held before
    }
}

void write_files(const std::vector<PendingFile>& files) {
    install_handlers();
    std::vector<Temporary> temporaries;
    std::vector<std::string> targets;
    try {
        for (const auto& f : files) {
            targets.push_back(resolved(f.path));
            temporaries.push_back(write_temporary(f, targets.back()));
        }
        for (std::size_t i = 0; i < files.size(); ++i) {
            if (std::rename(temporaries[i].path.c_str(), targets[i].c_str()) != 0)
                throw error(files[i].option + ": cannot write '" + files[i].path + "': " + reason());
            temporaries[i].forget();
        }
    } catch (...) {
        for (auto& t : temporaries) t.remove();
        pending_count = 0;
        throw;
    }
    pending_count = 0;
}

void refuse_overwriting_inputs(const PendingFile& output, const std::vector<std::string>& inputs) {
    struct stat out {};
    if (stat(output.path.c_str(), &out) != 0) return;  // a new file cannot be an input
    for (const auto& input : inputs) {
        struct stat in {};
        if (!input.empty() && stat(input.c_str(), &in) == 0 && in.st_dev == out.st_dev && in.st_ino == out.st_ino)
            throw usage_error(output.option + " '" + output.path + "' is the input '" + input +
                              "': refusing to overwrite it");
    }
}

}  // namespace memcalc::cli
