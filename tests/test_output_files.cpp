// Where --output and --plot may write (issue 33): special files written as they are, standard
// output's names, links followed as the kernel's protected_symlinks rule allows, no input replaced.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "run_program.hpp"

namespace {

/// A folder of the test's own below the working folder, removed at the end; `run` runs shell text
/// inside it.
struct OutputScratch {
    std::string path = "memcalc_outputs_" + std::to_string(getpid());
    OutputScratch() { testing::shell("rm -rf " + path + " && mkdir " + path); }
    ~OutputScratch() { testing::shell("rm -rf " + path); }
    testing::Run run(const std::string& command) const {
        return testing::shell("cd " + path + " && (" + command + ")");
    }
};

const std::string& decoder_report() {
    static const std::string report = testing::memcalc("--preset decoder").out;
    return report;
}

/// A model folder with config.json and a one-tensor model.safetensors (a checkpoint check, not a
/// match), and a second copy with the index alone.
const std::string model_folders =
    std::string("mkdir m && cp ") + MEMCALC_SOURCE_DIR + "/tests/models/phi3-3b-slerp/config.json" +
    " m/ && cp -r " + MEMCALC_SOURCE_DIR + "/tests/models/phi3-3b-slerp indexed && " +
    "/usr/bin/python3 -c " +
    "\"import json, struct; h = json.dumps({'x': {'dtype': 'F32', 'shape': [1], 'data_offsets': " +
    "[0, 4]}}).encode(); open('m/model.safetensors', 'wb').write(struct.pack('<Q', len(h)) + h + " +
    "bytes(4))\"";

}  // namespace

TEST_CASE("standard output's names print the report as a run without --output does",
          "[cli][output]") {
    REQUIRE_FALSE(decoder_report().empty());
    for (const char* name : {"-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"}) {
        CAPTURE(name);
        const auto run =
            testing::shell(std::string("memcalc --preset decoder --output ") + name + " | cat");
        CHECK(run.out == decoder_report());
        CHECK(run.err.empty());
    }
    // A link to it, too: followed a hop at a time, and left a link.
    const OutputScratch scratch;
    const auto linked = scratch.run(
        "ln -s /dev/stdout out.txt && memcalc --preset decoder --output "
        "out.txt | cat && test -L out.txt");
    CHECK(linked.status == 0);
    CHECK(linked.out == decoder_report());
    // A plot there while the report goes to a file; both there is one file named twice.
    const auto plot = scratch.run(
        "ln -s /dev/stdout p.svg && memcalc --preset decoder --plot p.svg "
        "--output r.txt | cat && cat r.txt");
    CHECK(plot.out.rfind("<?xml", 0) == 0);
    CHECK_THAT(plot.out, Catch::Contains("</svg>\n" + decoder_report().substr(0, 40)));
    const auto both = scratch.run("memcalc --preset decoder --plot p.svg");
    CHECK(both.status == 2);
    CHECK(both.out.empty());
    CHECK(both.err ==
          "memcalc: the report on standard output and --plot 'p.svg' name the same file: "
          "refusing to write it twice\n");
}

TEST_CASE("a character device or FIFO is written as it is, never replaced", "[cli][output]") {
    const OutputScratch scratch;
    // As root, first a null device of the test's own, so that a build that replaces one fails here
    // and never reaches /dev/null.
    if (geteuid() == 0) {
        const auto own = scratch.run(
            "mknod null c 1 3 && memcalc --preset decoder --output null; "
            "echo $?; test -c null && echo device");
        REQUIRE(own.out == "0\ndevice\n");
    }
    const auto null = testing::shell(
        "memcalc --preset decoder --output /dev/null; echo $?; "
        "test -c /dev/null && echo device");
    CHECK(null.out == "0\ndevice\n");
    CHECK(null.err.empty());
    const auto full = testing::memcalc("--preset decoder --output /dev/full");
    CHECK(full.status == 1);
    CHECK(full.err == "memcalc: --output: cannot write '/dev/full': No space left on device\n");

    // A FIFO: its reader gets the report, and it stays a FIFO.
    const auto fifo = scratch.run(
        "mkfifo f && { timeout 20 cat f > got & } && "
        "memcalc --preset decoder --output f; echo $?; wait; test -p f && "
        "echo fifo && cat got");
    CHECK(fifo.out == "0\nfifo\n" + decoder_report());
    // Waiting there for a reader, with the plot's temporary made: SIGTERM removes it, no plot left.
    const auto stopped = scratch.run(
        "memcalc --preset decoder --output f --plot p.svg & for i in $(seq 100); do "
        "ls -a | grep -q memcalc- && break; sleep 0.1; done; ls -a | grep -c memcalc-; "
        "kill -TERM $!; wait $!; echo $?; ls -a | grep -c 'memcalc-\\|p.svg'");
    CHECK(stopped.out == "1\n143\n0\n");
}

TEST_CASE("a folder, socket or block device is refused, naming it", "[cli][output]") {
    const OutputScratch scratch;
    const auto folder = scratch.run("mkdir d && memcalc --preset decoder --output d");
    CHECK(folder.status == 1);
    CHECK(folder.out.empty());
    CHECK(folder.err ==
          "memcalc: --output 'd' is a folder: memcalc writes regular files, character "
          "devices and FIFOs\n");
    const auto socket = scratch.run(
        "/usr/bin/python3 -c \"import socket; socket.socket(socket.AF_UNIX)"
        ".bind('s')\" && memcalc --preset decoder --output s; echo $?; "
        "test -S s && echo socket");
    CHECK(socket.out == "1\nsocket\n");
    CHECK_THAT(socket.err, Catch::Contains("--output 's' is a socket"));
    if (geteuid() != 0) return;  // mknod needs root
    const auto block = scratch.run(
        "mknod b b 7 200 && ln -s b link && memcalc --preset decoder --output "
        "link; echo $?; test -b b && echo block");
    CHECK(block.out == "1\nblock\n");
    CHECK_THAT(block.err, Catch::Contains("--output 'link' is a block device ('b')"));
}

TEST_CASE(
    "links are followed as protected_symlinks allows: another user's in a sticky folder is refused",
    "[cli][output]") {
    if (geteuid() != 0) {
        WARN(
            "not root: no other user's link to make (lchown), so the planted-link case is skipped");
        return;
    }
    const OutputScratch scratch;
    // s is /tmp-like; uid 12345 plants s/report.txt -> ../victim, and s/d -> .. (a folder).
    REQUIRE(
        scratch
            .run("mkdir s && chmod 1777 s && echo keep > victim && ln -s ../victim s/report.txt && "
                 "ln -s .. s/d && chown -h 12345 s/report.txt s/d && ln -s s/report.txt hop.txt")
            .status == 0);
    for (const char* path : {"s/report.txt", "hop.txt", "s/d/new.txt"}) {
        CAPTURE(path);
        const auto run = scratch.run(std::string("memcalc --preset decoder --output ") + path);
        CHECK(run.status == 1);
        CHECK(run.out.empty());
        CHECK_THAT(run.err,
                   Catch::Contains("--output '" + std::string(path) + "': the symbolic link 's/"));
        CHECK_THAT(run.err,
                   Catch::Contains("in the sticky world-writable folder 's' belongs to uid 12345"));
    }
    CHECK(scratch.run("cat victim && test -L s/report.txt && ls s/d/new.txt").out == "keep\n");
    // The follower's own link, and the folder owner's, are followed; the link stays.
    const auto own = scratch.run(
        "ln -s ../mine s/mine.txt && memcalc --preset decoder --output s/mine.txt "
        "&& test -L s/mine.txt && cat mine");
    CHECK(own.status == 0);
    CHECK(own.out == decoder_report());
    const auto owner = scratch.run(
        "chown 12345 s && ln -s ../theirs s/theirs.txt && chown -h 12345 "
        "s/theirs.txt && memcalc --preset decoder --output s/theirs.txt && "
        "cat theirs");
    CHECK(owner.out == decoder_report());
}

TEST_CASE("every file a run reads is an input no output may name, and no file is named twice",
          "[cli][output]") {
    const OutputScratch scratch;
    REQUIRE(scratch.run(model_folders).status == 0);
    REQUIRE(scratch.run("memcalc --config m --seq 64").status == 0);
    REQUIRE(scratch.run("memcalc --config indexed --seq 64").status == 0);
    for (const char* output : {"m/config.json", "m/model.safetensors", "m/../m/config.json",
                               "indexed/model.safetensors.index.json"}) {
        CAPTURE(output);
        const std::string folder = std::string(output).substr(0, std::string(output).find('/'));
        const auto run = scratch.run("cp -r " + folder + " before && memcalc --config " + folder +
                                     " --seq 64 --output " + output + "; echo $?; diff -r before " +
                                     folder + " && echo same; rm -r before");
        CHECK(run.out == "2\nsame\n");
        CHECK_THAT(run.err, Catch::Contains(std::string("--output '") + output +
                                            "' is the input '" + folder + "/"));
    }
    // Two outputs, one file: by the same name, another spelling of it, or a link to it.
    for (const char* names : {"--output x.svg --plot x.svg", "--output ./x.svg --plot x.svg",
                              "--output y.svg --plot x.svg"}) {
        CAPTURE(names);
        const auto run =
            scratch.run(std::string("ln -sf x.svg y.svg && memcalc --preset decoder ") + names +
                        "; echo $?; ls x.svg");
        CHECK(run.out == "2\n");
        CHECK_THAT(run.err, Catch::Contains(
                                "--plot 'x.svg' name the same file: refusing to write it twice"));
    }
}

TEST_CASE("an output's name may take all of NAME_MAX: the temporary's name is short",
          "[cli][output]") {
    const OutputScratch scratch;
    const std::string name = std::string(246, 'r') + ".txt";  // 250 bytes
    const auto run = scratch.run("memcalc --preset decoder --output " + name + " && cat " + name +
                                 "; ls -a | grep -c memcalc-");
    CHECK(run.err.empty());
    CHECK(run.out == decoder_report() + "0\n");
}

TEST_CASE("an output past 1 MiB is spooled beside it and renamed into place, or removed",
          "[cli][output][slow-sanitized]") {
    const OutputScratch scratch;
    // 128 sequence lengths x 600 micro-batches x 3 modes: 46 MB of CSV, past the first of the
    // flushes a spool starts on a thread of its own (every 32 MiB).
    std::string seqs, batches;
    for (int s = 8; s <= 1024; s += 8) seqs += (s > 8 ? "," : "") + std::to_string(s);
    for (int b = 1; b <= 600; ++b) batches += (b > 1 ? "," : "") + std::to_string(b);
    const std::string sweep = "memcalc --preset gpt2 --recompute all --format csv --micro-batch " +
                              batches + " --seq " + seqs;
    // Mid-sweep, past GPT-2's positions: the old file stays and the temporary is gone.
    const auto failed =
        scratch.run("echo old > out.csv && chmod 640 out.csv && " + sweep +
                    ",2048 --output out.csv; echo $?; cat out.csv; ls -a | grep -c memcalc-");
    CHECK(failed.out == "1\nold\n0\n");
    CHECK_THAT(failed.err, Catch::Contains("seq 2048"));
    const auto printed = scratch.run(sweep + " | cksum");
    const auto written = scratch.run(sweep +
                                     " --output out.csv && cksum < out.csv && "
                                     "stat -c %a out.csv && ls -a | grep -c memcalc-");
    REQUIRE(printed.out.size() > 10);
    CHECK(written.out == printed.out + "640\n0\n");  // every byte; the old file's permissions
}
